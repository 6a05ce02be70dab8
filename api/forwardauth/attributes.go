package forwardauth

import (
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/client/clientip"
)

// The headers in which gateways pass the original request's attributes,
// canonical, each pair in the order they are looked for.
const (
	headerForwardedMethod = "X-Forwarded-Method"
	headerOriginalMethod  = "X-Original-Method"
	headerForwardedURI    = "X-Forwarded-Uri"
	headerOriginalURI     = "X-Original-Uri"
	headerForwardedHost   = "X-Forwarded-Host"
	headerHost            = "Host"
)

// attrError is an attribute that a descriptor needs and the call does not
// give as it should: a 422 naming the header.
type attrError struct {
	header, message string
}

func (e *attrError) Error() string { return e.header + ": " + e.message }

// attributes reads the original request's attributes from a call, each
// once and only when a descriptor asks for it, so that a header no
// descriptor uses is never read nor refused.
type attributes struct {
	r       *http.Request
	clients *clientip.Resolver
	// The values read so far, and which.
	address, method, host, path string
	read                        [fromPath + 1]bool
}

// value returns the value of a source of kind k (not a header or a
// literal).
func (a *attributes) value(k kind) (string, error) {
	if a.read[k] {
		switch k {
		case fromAddress:
			return a.address, nil
		case fromMethod:
			return a.method, nil
		case fromHost:
			return a.host, nil
		}
		return a.path, nil
	}
	var err error
	switch k {
	case fromAddress:
		a.address, err = a.clientAddress()
	case fromMethod:
		a.method, err = a.originalMethod()
	case fromHost:
		a.host, err = a.originalHost()
	default:
		a.path, err = a.originalPath()
	}
	if err != nil {
		return "", err
	}
	a.read[k] = true
	return a.value(k)
}

// clientAddress is the client's address through the trusted proxies.
func (a *attributes) clientAddress() (string, error) {
	addr, err := a.clients.Request(a.r)
	if err != nil {
		if ce, ok := err.(*clientip.Error); ok {
			return "", &attrError{header: ce.Header, message: ce.Message}
		}
		return "", err
	}
	return addr.String(), nil
}

// one returns the only value of header h: "" and false when it is absent,
// an error when it was sent more than once.
func one(r *http.Request, h string) (string, bool, error) {
	switch vs := r.Header[h]; len(vs) {
	case 0:
		return "", false, nil
	case 1:
		return vs[0], true, nil
	}
	return "", false, &attrError{header: h, message: "sent more than once"}
}

// either returns the value of the first of two headers that was sent.
func either(r *http.Request, first, second string) (string, string, error) {
	for _, h := range [2]string{first, second} {
		v, ok, err := one(r, h)
		if err != nil || ok {
			return h, v, err
		}
	}
	return "", "", &attrError{header: first, message: "is required (or " + second + "): the gateway must pass the original request's attribute in it"}
}

// originalMethod is the method of the original request.
func (a *attributes) originalMethod() (string, error) {
	h, v, err := either(a.r, headerForwardedMethod, headerOriginalMethod)
	if err != nil {
		return "", err
	}
	if !validHeaderName(v) {
		return "", &attrError{header: h, message: "is not a method: a token of letters, digits and !#$%&'*+-.^_`|~"}
	}
	return v, nil
}

// originalHost is the host of the original request, from
// X-Forwarded-Host, else the call's own Host (which nginx, Caddy and
// HAProxy keep as the client sent it when told to), in lower case: host
// names are not case-sensitive, so a client cannot find another bucket by
// changing case. A port is kept.
func (a *attributes) originalHost() (string, error) {
	h := headerForwardedHost
	v, ok, err := one(a.r, h)
	if err != nil {
		return "", err
	}
	if !ok {
		h, v = headerHost, a.r.Host
	}
	v = strings.TrimSpace(v)
	switch {
	case v == "" && h == headerHost:
		return "", &attrError{header: headerForwardedHost, message: "is required when the call has no Host: the host source needs the original request's host"}
	case v == "":
		return "", &attrError{header: h, message: "must not be empty"}
	case strings.Contains(v, ","):
		return "", &attrError{header: h, message: "holds a list; the gateway must set it to the original request's host alone"}
	}
	return lower(v), nil
}

// lower returns s with ASCII letters in lower case, s itself when it has
// none in upper case.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// originalPath is the path of the original request's URI, without its
// query, normalised as nginx normalises the URI it matches locations
// against: percent-encoding decoded, "." and ".." segments resolved,
// repeated slashes merged (a trailing one is kept). Every spelling of one
// path so meets one bucket: /login, /%6Cogin, //login and /a/../login
// alike.
func (a *attributes) originalPath() (string, error) {
	h, uri, err := either(a.r, headerForwardedURI, headerOriginalURI)
	if err != nil {
		return "", err
	}
	p, msg := normalizePath(uri)
	if msg != "" {
		return "", &attrError{header: h, message: msg}
	}
	return p, nil
}

// normalizePath returns the normalised path of uri and what is wrong with
// it, "" when nothing is. A path that is normal already is returned as it
// is, without a copy.
func normalizePath(uri string) (string, string) {
	if i := strings.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	// The absolute form, as some proxies write it.
	for _, scheme := range [...]string{"http://", "https://"} {
		if len(uri) >= len(scheme) && strings.EqualFold(uri[:len(scheme)], scheme) {
			rest := uri[len(scheme):]
			i := strings.IndexByte(rest, '/')
			if i < 0 {
				return "/", ""
			}
			uri = rest[i:]
		}
	}
	if !strings.HasPrefix(uri, "/") {
		return "", "must be the original request's URI, starting with /"
	}
	if isNormal(uri) {
		return uri, ""
	}
	dec := make([]byte, 0, len(uri))
	for i := 0; i < len(uri); i++ {
		c := uri[i]
		if c == '%' {
			if i+2 >= len(uri) || unhex(uri[i+1]) < 0 || unhex(uri[i+2]) < 0 {
				return "", "holds a % that is not followed by two hexadecimal digits"
			}
			c = byte(unhex(uri[i+1])<<4 | unhex(uri[i+2]))
			i += 2
		}
		if c < 0x20 || c == 0x7f {
			return "", "holds a control character, percent-encoded or not"
		}
		dec = append(dec, c)
	}
	if !utf8.Valid(dec) {
		return "", "is not UTF-8 once percent-decoded"
	}
	// Resolve the segments in place: out never overtakes the reading.
	out := dec[:0]
	for i := 0; i < len(dec); {
		// dec[i] is '/': the segment runs to the next one.
		j := i + 1
		for j < len(dec) && dec[j] != '/' {
			j++
		}
		seg := dec[i+1 : j]
		last := j == len(dec)
		switch string(seg) {
		case "", ".":
			if last && (len(out) == 0 || out[len(out)-1] != '/') {
				out = append(out, '/')
			}
		case "..":
			if k := lastSlash(out); k >= 0 {
				out = out[:k]
			}
			if last {
				out = append(out, '/')
			}
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
		i = j
	}
	if len(out) == 0 {
		out = append(out, '/')
	}
	return string(out), ""
}

// isNormal reports whether a path that starts with '/' is its own
// normal form: valid UTF-8 without control characters, '%', empty
// segments (but a trailing slash), "." or "..".
func isNormal(p string) bool {
	ascii := true
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c < 0x20 || c == 0x7f || c == '%':
			return false
		case c >= 0x80:
			ascii = false
		case c == '/' && i+1 < len(p):
			rest := p[i+1:]
			if rest[0] == '/' || rest == "." || rest == ".." || strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
				return false
			}
		}
	}
	return ascii || utf8.ValidString(p)
}

// lastSlash is the index of the last '/' of b, -1 for none.
func lastSlash(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '/' {
			return i
		}
	}
	return -1
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// headerValue returns the value of a header source, "" for a header that
// is absent or empty: either way its descriptor is not made, as Envoy
// skips a descriptor whose header is absent, so that an empty header
// cannot name a bucket of its own.
func headerValue(r *http.Request, h string) (string, error) {
	v, _, err := one(r, h)
	return strings.TrimSpace(v), err
}
