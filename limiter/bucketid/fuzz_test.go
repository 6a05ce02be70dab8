package bucketid

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/net/publicsuffix"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// FuzzCanonical checks, for every format, that Canonical never panics, that
// what it accepts it maps to a fixed point, and that the canonical form has
// the shape the format promises. format indexes limiter.IDFormats; one past the end
// stands for an unknown format, which must always be refused.
func FuzzCanonical(f *testing.F) {
	formats := limiter.IDFormats()
	index := func(format limiter.IDFormat) uint8 { return uint8(slices.Index(formats, format)) }
	for _, c := range collapseCases() {
		f.Add(index(c.format), c.want)
		for _, in := range c.inputs {
			f.Add(index(c.format), in)
		}
	}
	for _, c := range rejectCases() {
		f.Add(index(c.format), c.in)
	}
	f.Add(uint8(len(formats)), "1.2.3.4")

	f.Fuzz(func(t *testing.T, i uint8, id string) {
		if int(i) >= len(formats) {
			if got, err := Canonical(limiter.IDFormat("bogus"), id); err == nil {
				t.Fatalf("unknown format accepted %q as %q", id, got)
			}
			return
		}
		format := formats[i]
		got, err := Canonical(format, id)
		if err == nil && !utf8.ValidString(id) {
			t.Fatalf("%s.Canonical accepted invalid UTF-8 %q as %q", format, id, got)
		}
		if format != limiter.String && isASCII(id) {
			// Only string ids are case-sensitive.
			upper, errU := Canonical(format, strings.ToUpper(id))
			if (err == nil) != (errU == nil) || upper != got {
				t.Fatalf("%s: %q gives %q, %v but upper case gives %q, %v", format, id, got, err, upper, errU)
			}
		}
		if format == limiter.Domain && isASCII(id) && !strings.HasSuffix(id, ".") {
			dotted, errD := Canonical(format, id+".")
			if (err == nil) != (errD == nil) || dotted != got {
				t.Fatalf("%s: %q gives %q, %v but with a trailing dot %q, %v", format, id, got, err, dotted, errD)
			}
		}
		if err != nil {
			if got != "" {
				t.Fatalf("Canonical(%s, %q) = %q with error %v", format, id, got, err)
			}
			if err.Error() == "" {
				t.Fatalf("Canonical(%s, %q): empty error message", format, id)
			}
			return
		}
		again, err := Canonical(format, got)
		if err != nil {
			t.Fatalf("Canonical(%s, %q) = %q, which is refused: %v", format, id, got, err)
		}
		if again != got {
			t.Fatalf("Canonical(%s, %q) = %q, but that canonicalises to %q", format, id, got, again)
		}
		if msg := shapeError(format, id, got); msg != "" {
			t.Fatalf("Canonical(%s, %q) = %q: %s", format, id, got, msg)
		}
	})
}

// shapeError reports how out, the canonical form of in under f, breaks the
// format's promise, or "" when it keeps it. It re-derives each property from
// the standard parsers rather than from the code under test.
func shapeError(f limiter.IDFormat, in, out string) string {
	switch f {
	case limiter.IPAddress:
		return addrShape(out)
	case limiter.IPv6Range:
		p, err := netip.ParsePrefix(out)
		switch {
		case err != nil:
			return err.Error()
		case !p.Addr().Is6() || p.Addr().Is4In6():
			return "not an IPv6 prefix"
		case p.Bits() != 48 || p.Masked() != p || p.String() != out:
			return "not a masked /48 in netip notation"
		}
	case limiter.RegID:
		return regIDShape(out)
	case limiter.Domain:
		return nameShape(out)
	case limiter.DomainOrCIDR:
		if strings.Contains(out, "/") {
			p, err := netip.ParsePrefix(out)
			switch {
			case err != nil:
				return err.Error()
			case p.Addr().Is4() && p.Bits() != 32, p.Addr().Is6() && p.Bits() != 64:
				return "wrong prefix length"
			case p.Addr().Is4In6() || p.Masked() != p || p.String() != out:
				return "not a masked prefix in netip notation"
			}
			return ""
		}
		if msg := nameShape(out); msg != "" {
			return msg
		}
		if reg, err := publicsuffix.EffectiveTLDPlusOne(out); err != nil || reg != out {
			return "not a registrable domain"
		}
	case limiter.IdentValue:
		return identShape(out)
	case limiter.FQDNSet:
		return setShape(out)
	case limiter.RegIDDomain:
		reg, name, ok := strings.Cut(out, ":")
		if !ok {
			return "no colon"
		}
		if msg := regIDShape(reg); msg != "" {
			return msg
		}
		return nameShape(name)
	case limiter.RegIDFQDNSet:
		reg, set, ok := strings.Cut(out, ":")
		if !ok {
			return "no colon"
		}
		if msg := regIDShape(reg); msg != "" {
			return msg
		}
		return setShape(set)
	case limiter.String:
		switch {
		case out != in:
			return "rewritten"
		case len(out) > 256 || !utf8.ValidString(out):
			return "too long or not UTF-8"
		}
	}
	return ""
}

func addrShape(s string) string {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return err.Error()
	case a.Is4In6():
		return "IPv4-mapped"
	case a.Zone() != "":
		return "has a zone"
	case a.String() != s:
		return "not in netip notation"
	}
	return ""
}

func regIDShape(s string) string {
	n, err := strconv.ParseUint(s, 10, 64)
	switch {
	case err != nil:
		return err.Error()
	case n == 0:
		return "zero"
	case strconv.FormatUint(n, 10) != s:
		return "not in shortest decimal notation"
	}
	return ""
}

func nameShape(s string) string {
	if len(s) > 253 {
		return "longer than 253 bytes"
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return "an IP address"
	}
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return "fewer than two labels"
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "bad label length or hyphen"
		}
		if strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return "not lower-case LDH"
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "numeric top-level label"
	}
	return ""
}

func identShape(s string) string {
	if _, err := netip.ParseAddr(s); err == nil {
		return addrShape(s)
	}
	return nameShape(s)
}

func setShape(s string) string {
	elems := strings.Split(s, ",")
	if len(elems) > 100 {
		return "more than 100 elements"
	}
	for i, e := range elems {
		if msg := identShape(e); msg != "" {
			return "element " + strconv.Itoa(i+1) + ": " + msg
		}
		if i > 0 && elems[i-1] >= e {
			return "not sorted or not deduplicated"
		}
	}
	return ""
}

// The fuzzer is only as good as its oracle: make sure shapeError refuses
// outputs that break each promise.
func TestShapeErrorDetects(t *testing.T) {
	for _, c := range []struct {
		format  limiter.IDFormat
		in, out string
	}{
		{limiter.IPAddress, "", "::ffff:1.2.3.4"},
		{limiter.IPAddress, "", "2001:DB8::1"},
		{limiter.IPAddress, "", "fe80::1%eth0"},
		{limiter.IPv6Range, "", "2001:db8::1/48"},
		{limiter.IPv6Range, "", "2001:db8::/64"},
		{limiter.IPv6Range, "", "1.2.0.0/16"},
		{limiter.RegID, "", "042"},
		{limiter.RegID, "", "0"},
		{limiter.Domain, "", "Example.com"},
		{limiter.Domain, "", "example.com."},
		{limiter.Domain, "", "localhost"},
		{limiter.Domain, "", "1.2.3.4"},
		{limiter.Domain, "", "a.123"},
		{limiter.DomainOrCIDR, "", "www.example.com"},
		{limiter.DomainOrCIDR, "", "1.2.3.0/24"},
		{limiter.DomainOrCIDR, "", "2001:db8::1/64"},
		{limiter.FQDNSet, "", "b.com,a.com"},
		{limiter.FQDNSet, "", "a.com,a.com"},
		{limiter.FQDNSet, "", "a.com,"},
		{limiter.RegIDDomain, "", "042:a.com"},
		{limiter.RegIDFQDNSet, "", "42:b.com,a.com"},
		{limiter.String, "a", "A"},
	} {
		if shapeError(c.format, c.in, c.out) == "" {
			t.Errorf("shapeError(%s, %q) found nothing wrong", c.format, c.out)
		}
	}
}
