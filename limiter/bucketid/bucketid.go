// Package bucketid validates the bucket ids of each limiter.IDFormat and
// gives their canonical forms, so that every notation of one bucket names
// one key. It is a leaf: the engine does not import it (and so neither
// IDNA nor the public suffix list), but is handed Canonical by whoever
// builds its snapshots.
package bucketid

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Canonical validates id under format f and returns its canonical form. The
// error's message is a short reason meant to be shown next to the field that
// held id; it never names the field and never echoes the id, which may be
// personal data. An unknown format is an error.
//
// Canonical runs on every decision: for ip_address, reg_id, domain and
// string, an id that is already canonical is returned as is, without
// allocating.
func Canonical(f limiter.IDFormat, id string) (string, error) {
	if !f.Valid() {
		return "", idError("unknown id format " + strconv.Quote(string(f)))
	}
	if id == "" {
		return "", errEmpty
	}
	switch f {
	case limiter.IPAddress:
		return canonicalIP(id)
	case limiter.IPv6Range:
		return canonicalIPv6Range(id)
	case limiter.RegID:
		return canonicalRegID(id)
	case limiter.Domain:
		return canonicalDomain(id)
	case limiter.DomainOrCIDR:
		return canonicalDomainOrCIDR(id)
	case limiter.IdentValue:
		return canonicalIdent(id)
	case limiter.FQDNSet:
		return canonicalFQDNSet(id)
	case limiter.RegIDDomain:
		return canonicalPair(id, "domain", canonicalDomain)
	case limiter.RegIDFQDNSet:
		return canonicalPair(id, "name set", canonicalFQDNSet)
	default: // String; Valid has ruled out the rest.
		return canonicalString(id)
	}
}

// CanonicalOverride is Canonical for the bucket id of an override. The
// per-account formats (reg_id_domain, reg_id_fqdn_set) also accept a bare
// registration id: an account-wide override, which applies to every bucket
// of the account that has no override of its own, as Let's Encrypt's
// overrides of FailedAuthorizationsPerDomainPerAccount are written.
func CanonicalOverride(f limiter.IDFormat, id string) (string, error) {
	if f.AccountWide() && !strings.Contains(id, ":") {
		return canonicalRegID(id)
	}
	return Canonical(f, id)
}

// NormalizeOverride canonicalises o.BucketID under limit l and returns the
// field errors of what depends on l, named as in the REST API: the limit
// and the bucket id. The parameters and the comment depend on no stored
// state and are checked once, by the converter that read them
// (Params.Validate, limiter.TextProblem); the database normalises again
// under its write lock, since the limit's id format may have changed since
// the converter read it.
func NormalizeOverride(o *limiter.Override, l limiter.Limit) []limiter.FieldError {
	var ve limiter.ValidationError
	if o.Limit != l.Name {
		ve.Add("limit", "does not name the limit given")
	}
	if id, err := CanonicalOverride(l.IDFormat, o.BucketID); err != nil {
		ve.Add("bucket_id", err.Error())
	} else {
		o.BucketID = id
	}
	return ve.Fields
}

// Bounds of the formats. DNS limits a name to 253 bytes in text form and a
// label to 63; a set holds as many names as one certificate order may.
const (
	maxNameLen     = 253
	maxLabelLen    = 63
	maxFQDNSetSize = 100
	maxStringLen   = 256
	// maxNameInput bounds the text handed to idna. Some code points map to
	// nothing, so a longer input could still shrink to a valid name, but no
	// client writes one, and the bound keeps the mapping's cost small.
	maxNameInput = 1024
	// maxRegID is the largest uint64 in decimal; ids are compared as text so
	// that the common case never converts.
	maxRegID = "18446744073709551615"
)

// idError is a validation message. Being a string type, the fixed messages
// are constants: returning one allocates nothing and nobody can reassign it.
type idError string

func (e idError) Error() string { return string(e) }

const (
	errEmpty        idError = "must not be empty"
	errNotIP        idError = "not an IP address"
	errZone         idError = "IP address must not have a zone"
	errNotIPv6      idError = "not an IPv6 address or prefix"
	errIPv4InRange  idError = "must be IPv6, not IPv4"
	errRangeBits    idError = "IPv6 prefix must be /48"
	errRegID        idError = "must be a positive decimal integer"
	errRegIDRange   idError = "must be at most " + maxRegID
	errNameLong     idError = "longer than 253 bytes"
	errLabelLong    idError = "label longer than 63 bytes"
	errEmptyLabel   idError = "empty label"
	errHyphen       idError = "label must not start or end with a hyphen"
	errNameChar     idError = "may contain only letters, digits, hyphens and dots"
	errUpper        idError = "must be lower case"
	errWildcard     idError = "wildcards are not allowed"
	errOneLabel     idError = "must have at least two labels"
	errNumericTLD   idError = "top-level label must not be all digits"
	errIsIP         idError = "an IP address is not a domain name"
	errIDNA         idError = "not a valid internationalised domain name"
	errALabel       idError = "an xn-- label must be the canonical encoding of a name"
	errNotCIDR      idError = "not a DNS name, IP address or prefix"
	errIPv4Bits     idError = "IPv4 prefix must be /32"
	errIPv6Bits     idError = "IPv6 prefix must be /64"
	errMappedPrefix idError = "IPv4-mapped prefix: write the IPv4 address as a.b.c.d/32"
	errSuffix       idError = "a public suffix, not a registrable domain"
	errSetSize      idError = "more than 100 elements"
	errStringLong   idError = "longer than 256 bytes"
	errUTF8         idError = "not valid UTF-8"
	errControl      idError = "must not contain control characters"
)

// canonicalIP accepts an IPv4 or IPv6 address. IPv4-mapped IPv6 addresses are
// unmapped because they reach us when a dual-stack listener sees an IPv4
// client, and must share that client's bucket.
func canonicalIP(id string) (string, error) {
	a, err := netip.ParseAddr(id)
	if err != nil {
		return "", errNotIP
	}
	return addrString(a, id)
}

// addrString returns the canonical text of a, which was parsed from id.
func addrString(a netip.Addr, id string) (string, error) {
	if a.Zone() != "" {
		// A zone names a link of the observer, not the client.
		return "", errZone
	}
	var buf [48]byte // 45 bytes is the longest IPv6 text (with a dotted quad).
	return reuse(a.Unmap().AppendTo(buf[:0]), id), nil
}

// canonicalIPv6Range accepts an IPv6 address or /48 prefix and returns the
// /48 that holds it. Other prefix lengths are refused rather than widened or
// narrowed, because an override written for a /56 would silently apply to
// the whole /48.
func canonicalIPv6Range(id string) (string, error) {
	var p netip.Prefix
	if strings.IndexByte(id, '/') >= 0 {
		var err error
		if p, err = netip.ParsePrefix(id); err != nil {
			if strings.IndexByte(id, '%') >= 0 {
				return "", errZone
			}
			return "", errNotIPv6
		}
		if p.Addr().Is4() || p.Addr().Is4In6() {
			return "", errIPv4InRange
		}
		if p.Bits() != 48 {
			return "", errRangeBits
		}
	} else {
		a, err := netip.ParseAddr(id)
		if err != nil {
			return "", errNotIPv6
		}
		if a.Zone() != "" {
			return "", errZone
		}
		if a.Is4() || a.Is4In6() {
			return "", errIPv4InRange
		}
		p = netip.PrefixFrom(a, 48)
	}
	var buf [64]byte
	return reuse(p.Masked().AppendTo(buf[:0]), id), nil
}

// reuse returns id when b spells it, so that a canonical id costs no
// allocation, and a copy of b otherwise.
func reuse(b []byte, id string) string {
	if string(b) == id {
		return id
	}
	return string(b)
}

// canonicalRegID accepts a positive decimal integer that fits in a uint64.
// Only ASCII digits are allowed: a sign or a space is more likely a client
// bug than a notation worth supporting. Leading zeros are dropped by slicing,
// so even a non-canonical id costs no allocation.
func canonicalRegID(id string) (string, error) {
	first := -1
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c < '0' || c > '9' {
			return "", errRegID
		}
		if first < 0 && c != '0' {
			first = i
		}
	}
	if first < 0 { // empty or all zeros
		return "", errRegID
	}
	d := id[first:]
	if len(d) > len(maxRegID) || len(d) == len(maxRegID) && d > maxRegID {
		return "", errRegIDRange
	}
	return d, nil
}

// canonicalDomain accepts a DNS name, internationalised or not, with or
// without a trailing dot, and returns its lower-case A-label form without the
// dot. A name that is already in that form is recognised by one scan and
// returned as is; only other names pay for lower-casing and IDNA mapping.
//
// A name is written one way only: a label in A-label form (xn--) must be
// the one its Unicode form encodes to (see checkALabels). A name that also
// holds non-ASCII labels goes through idna whole, which is stricter with
// its other labels ("--" in third and fourth place); such a name is
// refused, never given a second canonical form.
func canonicalDomain(id string) (string, error) {
	if checkName(id) == nil {
		if err := checkALabels(id); err != nil {
			return "", err
		}
		return id, nil
	}
	name, err := normaliseName(id)
	if err != nil {
		if _, e := netip.ParseAddr(id); e == nil {
			return "", errIsIP
		}
		return "", err
	}
	return name, nil
}

// normaliseName maps id to lower-case A-labels, drops one trailing dot, and
// checks the result.
func normaliseName(id string) (string, error) {
	if len(id) > maxNameInput {
		return "", errNameLong
	}
	s := id
	if !isASCII(s) {
		if strings.HasPrefix(s, "*.") {
			// idna would refuse the '*' with a vaguer message.
			return "", errWildcard
		}
		if !utf8.ValidString(s) {
			// idna would map invalid bytes to U+FFFD and encode that.
			return "", errIDNA
		}
		a, err := idna.Lookup.ToASCII(s)
		if err != nil || !isASCII(a) {
			return "", errIDNA
		}
		s = a
	}
	s = strings.TrimSuffix(lowerASCII(s), ".")
	if s == "" {
		return "", errEmptyLabel // the input was "." or mapped to it
	}
	if err := checkName(s); err != nil {
		return "", err
	}
	if err := checkALabels(s); err != nil {
		return "", err
	}
	return s, nil
}

// checkALabels refuses an A-label (xn--) of canonical name s that does not
// round-trip: decoded to Unicode and encoded again, it must give the same
// label. Otherwise invalid Punycode (xn--zz) and the encoding of a name in
// no normal form (xn--bucher-xyd, "u" and a combining diaeresis) would be
// buckets apart from the name they stand for (xn--bcher-kva). Only names
// with an A-label pay for the decoding.
func checkALabels(s string) error {
	if !strings.Contains(s, "xn--") {
		return nil
	}
	for label := range strings.SplitSeq(s, ".") {
		if !strings.HasPrefix(label, "xn--") {
			continue
		}
		u, err := idna.Lookup.ToUnicode(label)
		if err != nil {
			return errALabel
		}
		if a, err := idna.Lookup.ToASCII(u); err != nil || a != label {
			return errALabel
		}
	}
	return nil
}

// checkName reports why s is not a canonical DNS name, or nil when it is one:
// lower-case letters, digits and hyphens in labels of 1 to 63 bytes that
// neither start nor end with a hyphen, at least two labels, at most 253
// bytes, no trailing dot. The top-level label must not be all digits: many
// resolvers read such a name (127.1, 0x7f.1) as an IPv4 address, and an
// address is not a name.
func checkName(s string) error {
	switch {
	case s == "":
		return errEmpty
	case len(s) > maxNameLen:
		return errNameLong
	}
	labels, start, digits := 0, 0, true
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			switch {
			case i == start:
				return errEmptyLabel
			case i-start > maxLabelLen:
				return errLabelLong
			case s[start] == '-' || s[i-1] == '-':
				return errHyphen
			}
			labels++
			if i < len(s) {
				start, digits = i+1, true
			}
			continue
		}
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', c == '-':
			digits = false
		case '0' <= c && c <= '9':
		case 'A' <= c && c <= 'Z':
			return errUpper
		case c == '*' && i == start && (i+1 == len(s) || s[i+1] == '.'):
			return errWildcard
		default:
			return errNameChar
		}
	}
	if labels < 2 {
		return errOneLabel
	}
	if digits {
		return errNumericTLD
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// lowerASCII lower-cases ASCII letters only; unlike strings.ToLower it
// cannot turn a byte sequence into a different length or into non-ASCII.
func lowerASCII(s string) string {
	i := 0
	for i < len(s) && (s[i] < 'A' || s[i] > 'Z') {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if 'A' <= b[i] && b[i] <= 'Z' {
			b[i] += 'a' - 'A'
		}
	}
	return string(b)
}

// canonicalDomainOrCIDR groups a name under its registered domain and an
// address under the block one party usually controls. A prefix is accepted
// only at exactly that length, so that every canonical id is itself a valid
// input and nobody believes an override for a /24 covers the /24.
func canonicalDomainOrCIDR(id string) (string, error) {
	if strings.IndexByte(id, '/') >= 0 {
		p, err := netip.ParsePrefix(id)
		if err != nil {
			return "", errNotCIDR
		}
		switch a := p.Addr(); {
		case a.Is4():
			if p.Bits() != 32 {
				return "", errIPv4Bits
			}
		case a.Is4In6():
			// The address would be unmapped to an IPv4 /32; a prefix of
			// mapped addresses has no such meaning.
			return "", errMappedPrefix
		case p.Bits() != 64:
			return "", errIPv6Bits
		}
		var buf [64]byte
		return reuse(p.Masked().AppendTo(buf[:0]), id), nil
	}
	if a, ok := parseAddr(id); ok {
		if a.Zone() != "" {
			return "", errZone
		}
		a = a.Unmap()
		bits := 64
		if a.Is4() {
			bits = 32
		}
		return netip.PrefixFrom(a, bits).Masked().String(), nil
	}
	name, err := canonicalDomain(id)
	if err != nil {
		return "", err
	}
	// name is canonical, so the only failure left is that it is itself a
	// public suffix. The result is a suffix of name: no allocation.
	reg, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		return "", errSuffix
	}
	return reg, nil
}

// parseAddr is netip.ParseAddr for callers that also accept names. It
// skips the parse for text that cannot be an address, because a failed parse
// allocates its error and names are the common case.
func parseAddr(s string) (netip.Addr, bool) {
	if strings.IndexByte(s, ':') < 0 {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c != '.' && (c < '0' || c > '9') {
				return netip.Addr{}, false
			}
		}
	}
	a, err := netip.ParseAddr(s)
	return a, err == nil
}

// canonicalIdent accepts what may appear as an identifier of an order: an IP
// address or a DNS name. Addresses are tried first because a dotted quad
// would otherwise be mistaken for a name with numeric labels.
func canonicalIdent(id string) (string, error) {
	if a, ok := parseAddr(id); ok {
		return addrString(a, id)
	}
	name, err := canonicalDomain(id)
	if err != nil {
		if looksNumeric(id) {
			return "", errNotIP
		}
		return "", err
	}
	return name, nil
}

// looksNumeric reports whether s was most likely meant as an IP address, so
// that its error talks about addresses rather than DNS labels.
func looksNumeric(s string) bool {
	colon, letter := false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ':':
			colon = true
		case c == '.', '0' <= c && c <= '9':
		case 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
			letter = true
		default:
			return false
		}
	}
	return colon || !letter
}

// canonicalFQDNSet accepts comma-separated names and addresses and returns
// them canonical, sorted and without repetition, so that the same set in any
// order and spelling is one bucket. Errors name the element by position
// rather than quoting it, because sets are treated as personal data.
func canonicalFQDNSet(id string) (string, error) {
	if setIsCanonical(id) {
		return id, nil
	}
	n := strings.Count(id, ",") + 1
	if n > maxFQDNSetSize {
		return "", errSetSize
	}
	elems := make([]string, 0, n)
	i := 0
	for e := range strings.SplitSeq(id, ",") {
		i++
		e = strings.TrimSpace(e)
		if e == "" {
			return "", idError("element " + strconv.Itoa(i) + " is empty")
		}
		c, err := canonicalIdent(e)
		if err != nil {
			return "", idError("element " + strconv.Itoa(i) + ": " + err.Error())
		}
		elems = append(elems, c)
	}
	slices.Sort(elems)
	elems = slices.Compact(elems)
	if out := strings.Join(elems, ","); out != id {
		return out, nil
	}
	return id, nil
}

// setIsCanonical reports whether id is already a canonical set, checking
// element by element without building one: sets are checked on every
// decision of their limits, and clients that send them canonical should not
// pay for sorting.
func setIsCanonical(id string) bool {
	n, prev := 0, ""
	for e := range strings.SplitSeq(id, ",") {
		n++
		if n > maxFQDNSetSize || n > 1 && e <= prev {
			return false
		}
		if c, err := canonicalIdent(e); err != nil || c != e {
			return false
		}
		prev = e
	}
	return true
}

// canonicalPair accepts "<reg_id>:<value>", split at the first colon so that
// the value may hold IPv6 addresses. When both parts are already canonical
// the id is returned as is.
func canonicalPair(id, what string, value func(string) (string, error)) (string, error) {
	reg, v, ok := strings.Cut(id, ":")
	if !ok {
		return "", idError("must be <registration id>:<" + what + ">")
	}
	r, err := canonicalRegID(reg)
	if err != nil {
		return "", idError("registration id: " + err.Error())
	}
	if v == "" {
		return "", idError(what + ": " + errEmpty.Error())
	}
	c, err := value(v)
	if err != nil {
		return "", idError(what + ": " + err.Error())
	}
	if r == reg && c == v {
		return id, nil
	}
	return r + ":" + c, nil
}

// canonicalString accepts 1 to 256 bytes of UTF-8 without control
// characters, which would corrupt logs and confuse whoever reads an override
// list. It is not normalised: what is not understood is not rewritten.
func canonicalString(id string) (string, error) {
	if len(id) > maxStringLen {
		return "", errStringLong
	}
	for i := 0; i < len(id); {
		if c := id[i]; c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return "", errControl
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(id[i:])
		if r == utf8.RuneError && size == 1 {
			return "", errUTF8
		}
		if unicode.IsControl(r) {
			return "", errControl
		}
		i += size
	}
	return id, nil
}
