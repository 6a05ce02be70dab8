// Package clientip finds the address of the client a request came from,
// believing the headers that proxies set only when they were set by a
// proxy the operator trusts. The forward-auth front of ratelimitd and the
// middleware of its Go client both use it, so that a limit keyed on the
// client's address means the same bucket whichever way the request came.
//
// The rule, for a request whose connecting peer is P:
//
//   - P is not trusted: the client is P, whatever the request's headers say.
//   - P is trusted and the request has X-Forwarded-For: each trusted hop
//     appended the address it received the request from, so the client is
//     the rightmost address that is not itself trusted; when every address
//     is trusted, the leftmost, the farthest a trusted hop vouches for.
//   - P is trusted, no X-Forwarded-For, one X-Real-IP: that address.
//   - Otherwise P.
//
// Addresses are returned as ratelimitd's ip_address format writes them:
// an IPv4 address mapped into IPv6 is unmapped, and a zone is dropped,
// since it names an interface of the host that wrote it and means nothing
// here. An entry may carry a port (1.2.3.4:80, [2001:db8::1]:80), as some
// proxies write it. An address the rule would read that does not parse is
// an *Error naming its header: answering with the proxy's own address
// instead would put every such client in one bucket.
package clientip

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The headers read, in their canonical form.
const (
	HeaderForwardedFor = "X-Forwarded-For"
	HeaderRealIP       = "X-Real-IP"
)

// Loopback is the default set of trusted proxies: a gateway or sidecar on
// the same host.
var Loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// Error is a header that the rule had to read and could not.
type Error struct {
	// Header is the header's name, such as "X-Forwarded-For".
	Header string
	// Message says what is wrong with it.
	Message string
}

func (e *Error) Error() string { return e.Header + ": " + e.Message }

// Resolver finds client addresses through a fixed set of trusted proxies.
// Its zero value trusts no proxy. It is safe for concurrent use.
type Resolver struct {
	trusted []netip.Prefix
}

// New returns a Resolver that trusts the proxies in prefixes. An IPv4
// prefix also covers the same addresses mapped into IPv6, since addresses
// are unmapped before they are compared.
func New(prefixes []netip.Prefix) *Resolver {
	r := &Resolver{trusted: make([]netip.Prefix, len(prefixes))}
	for i, p := range prefixes {
		r.trusted[i] = p.Masked()
	}
	return r
}

// ParsePrefixes reads a comma-separated list of CIDR prefixes or single
// addresses ("10.0.0.0/8, 192.168.1.7, fd00::/8"), as
// RATELIMIT_TRUSTED_PROXIES holds it; blank entries are skipped, so the
// empty string trusts nothing.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil || p.Addr().Zone() != "" {
				return nil, fmt.Errorf("entry %d, %q: not a CIDR prefix such as 10.0.0.0/8 or fd00::/8", i+1, f)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("entry %d, %q: not an IP address or CIDR prefix", i+1, f)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Trusted reports whether a is the address of a trusted proxy.
func (r *Resolver) Trusted(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Request returns the client address of an incoming request, from its
// RemoteAddr and headers.
func (r *Resolver) Request(req *http.Request) (netip.Addr, error) {
	return r.From(req.RemoteAddr, req.Header)
}

// From returns the client address of a request whose connecting peer is
// remoteAddr ("host:port", as http.Request.RemoteAddr holds it, or a bare
// address) and whose headers are h. A peer address that does not parse
// is an *Error naming "RemoteAddr": a server in this process always sets
// it, so it means the caller passed something else.
func (r *Resolver) From(remoteAddr string, h http.Header) (netip.Addr, error) {
	peer, ok := parse(remoteAddr)
	if !ok {
		return netip.Addr{}, &Error{Header: "RemoteAddr", Message: "not an address of the connecting peer: " + strconv.Quote(remoteAddr)}
	}
	if !r.Trusted(peer) {
		return peer, nil
	}
	if a, found, err := r.forwardedFor(h.Values(HeaderForwardedFor)); found || err != nil {
		return a, err
	}
	switch real := h.Values(HeaderRealIP); len(real) {
	case 0:
		return peer, nil
	case 1:
		a, ok := parse(strings.TrimSpace(real[0]))
		if !ok {
			return netip.Addr{}, &Error{Header: HeaderRealIP, Message: "not an IP address"}
		}
		return a, nil
	default:
		return netip.Addr{}, &Error{Header: HeaderRealIP, Message: "sent more than once"}
	}
}

// forwardedFor walks the X-Forwarded-For lines, each a comma-separated
// list, from the right: the last address appended is the one the nearest
// trusted hop saw. Only the addresses up to the first untrusted one are
// read, so a long list a client wrote costs nothing beyond it. found is
// false when there is no line, or only blank ones.
func (r *Resolver) forwardedFor(lines []string) (a netip.Addr, found bool, err error) {
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.TrimSpace(l) != "" }) {
		return netip.Addr{}, false, nil
	}
	var last netip.Addr
	n := 0
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for rest != "" {
			var entry string
			if k := strings.LastIndexByte(rest, ','); k >= 0 {
				rest, entry = rest[:k], rest[k+1:]
			} else {
				rest, entry = "", rest
			}
			entry = strings.TrimSpace(entry)
			n++
			if entry == "" {
				return netip.Addr{}, true, &Error{Header: HeaderForwardedFor, Message: "entry " + strconv.Itoa(n) + " from the right is empty"}
			}
			a, ok := parse(entry)
			if !ok {
				return netip.Addr{}, true, &Error{Header: HeaderForwardedFor, Message: "entry " + strconv.Itoa(n) + " from the right is not an IP address"}
			}
			if !r.Trusted(a) {
				return a, true, nil
			}
			last = a
		}
	}
	return last, true, nil
}

// parse reads an address with or without a port, brackets around an IPv6
// address with a port, and returns it unmapped and without a zone.
func parse(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	// A bracketed IPv6 address without a port.
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}
