package forwardauth

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// kind is where the value of a descriptor entry comes from.
type kind uint8

const (
	// fromAddress is the client address, through the trusted proxies.
	fromAddress kind = iota
	fromMethod
	fromHost
	fromPath
	// fromHeader is a header of the original request, which the gateway
	// passes on.
	fromHeader
	// fromLiteral is a value written in the query, Envoy's generic_key.
	fromLiteral
)

// The names of the sources that give entries under their own names.
var named = map[string]kind{"remote_address": fromAddress, "method": fromMethod, "host": fromHost, "path": fromPath}

// source is one entry of a descriptor as a d parameter describes it.
type source struct {
	kind kind
	// key is the entry's key.
	key string
	// header is the canonical name of a fromHeader source's header; value
	// is a fromLiteral source's value.
	header, value string
	// text is the entry as the query wrote it, for naming it.
	text string
}

// plan is what a query asks: the descriptors' sources and the status of a
// denial. Gateways call one URL for every request, so a plan is parsed
// once per query string and kept (see Handler.plan).
type plan struct {
	descriptors [][]source
	denyStatus  int
}

// Bounds of a query. A gateway's query holds a handful of descriptors; a
// request of more than limiter.MaxBatch could not be decided anyway.
const maxQuery = 8 << 10

// credentialParams are the names under which a token might be put in a
// query string: refused as a token, never read as one.
var credentialParams = []string{"token", "access_token", "auth", "authorization", "bearer", "api_key", "apikey", "x-ratelimit-authorization"}

// tokenInQuery reports whether a raw query seems to carry a token: a
// parameter named as credentials are, or a value that is one of this
// service's secrets or a bearer credential. Such a call is refused
// whatever else it holds: the token is in the gateway's logs already, and
// a refusal makes the mistake seen before it spreads. Neither the value
// nor the query is ever logged or answered.
func tokenInQuery(raw string) bool {
	for raw != "" {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		name, value, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if v, err := url.QueryUnescape(value); err == nil {
			value = v
		}
		for _, c := range credentialParams {
			if strings.EqualFold(name, c) {
				return true
			}
		}
		if strings.HasPrefix(value, "rlt_") || strings.Contains(value, ",rlt_") || strings.Contains(value, "=rlt_") ||
			len(value) > 7 && strings.EqualFold(value[:7], "bearer ") {
			return true
		}
	}
	return false
}

// errTokenInQuery refuses a query that carries a token.
var errTokenInQuery = problem.Errorf(http.StatusBadRequest,
	"a token is never read from the query string, where logs keep it: send it in the X-Ratelimit-Authorization header (or Authorization), and revoke the token that was sent")

// parsePlan reads a query string: d parameters, each a descriptor, and
// deny_status. Every bad parameter is listed in one 422, named as in the
// query: "d[1]" is the second d.
func parsePlan(raw string) (*plan, error) {
	if len(raw) > maxQuery {
		return nil, problem.Errorf(http.StatusBadRequest, "the query string is longer than %d bytes", maxQuery)
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return nil, problem.Errorf(http.StatusBadRequest, "the query string is not percent-encoded correctly")
	}
	p := &plan{denyStatus: http.StatusTooManyRequests}
	var fields []limiter.FieldError
	bad := func(field, msg string) { fields = append(fields, limiter.FieldError{Field: field, Message: msg}) }
	for name := range values {
		if name != "d" && name != "deny_status" {
			bad(name, "unknown parameter; known are d and deny_status")
		}
	}
	switch ds := values["deny_status"]; {
	case len(ds) > 1:
		bad("deny_status", "must be given at most once")
	case len(ds) == 1 && ds[0] == "403":
		p.denyStatus = http.StatusForbidden
	case len(ds) == 1 && ds[0] != "429":
		bad("deny_status", "must be 429 (the default) or 403, for nginx")
	}
	ds := values["d"]
	switch {
	case len(ds) == 0:
		bad("d", "is required: each d is one descriptor, such as d=remote_address or d=header:X-Api-Key:api_key,path")
	case len(ds) > limiter.MaxBatch:
		bad("d", "must be given at most "+strconv.Itoa(limiter.MaxBatch)+" times, one descriptor each")
		ds = nil
	}
	for i, d := range ds {
		field := "d[" + strconv.Itoa(i) + "]"
		srcs, msg := parseDescriptor(d)
		if msg != "" {
			bad(field, msg)
			continue
		}
		p.descriptors = append(p.descriptors, srcs)
	}
	if len(fields) > 0 {
		sortFields(fields)
		return nil, &problem.Error{Status: http.StatusUnprocessableEntity, Detail: "the query has invalid values", Fields: fields}
	}
	return p, nil
}

// sortFields orders field errors by name, so that an answer does not
// depend on a map's order, and d[10] comes after d[9].
func sortFields(fs []limiter.FieldError) {
	key := func(f limiter.FieldError) (string, int) {
		if n, ok := strings.CutPrefix(f.Field, "d["); ok {
			i, _ := strconv.Atoi(strings.TrimSuffix(n, "]"))
			return "d[", i
		}
		return f.Field, -1
	}
	slices.SortStableFunc(fs, func(a, b limiter.FieldError) int {
		an, ai := key(a)
		bn, bi := key(b)
		return cmp.Or(strings.Compare(an, bn), cmp.Compare(ai, bi))
	})
}

// parseDescriptor reads one d: entries separated by commas, each a named
// source, header:<Name>:<key> or <key>=<value>. It returns what is wrong,
// "" when nothing is.
func parseDescriptor(d string) ([]source, string) {
	if d == "" {
		return nil, "must not be empty: a descriptor holds 1 to " + strconv.Itoa(rules.MaxDescriptorEntries) + " entries"
	}
	parts := strings.Split(d, ",")
	if msg := rules.DescriptorSizeProblem(len(parts)); msg != "" {
		return nil, msg
	}
	srcs := make([]source, 0, len(parts))
	for k, text := range parts {
		at := "entry " + strconv.Itoa(k+1) + " (" + strconv.Quote(text) + "): "
		s, msg := parseSource(text)
		if msg != "" {
			return nil, at + msg
		}
		srcs = append(srcs, s)
	}
	return srcs, ""
}

// parseSource reads one entry of a d.
func parseSource(text string) (source, string) {
	if text == "" {
		return source{}, "is empty"
	}
	if k, ok := named[text]; ok {
		return source{kind: k, key: text, text: text}, ""
	}
	if rest, ok := strings.CutPrefix(text, "header:"); ok {
		name, key, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
			return source{}, "a header source is header:<Header-Name>:<key>"
		case !validHeaderName(name):
			return source{}, "the header name must be a token of letters, digits and !#$%&'*+-.^_`|~"
		}
		if msg := rules.DescriptorTextProblem(key); msg != "" {
			return source{}, "the key " + msg
		}
		return source{kind: fromHeader, key: key, header: http.CanonicalHeaderKey(name), text: text}, ""
	}
	key, value, ok := strings.Cut(text, "=")
	if !ok {
		return source{}, "unknown source; a source is remote_address, method, host, path, header:<Header-Name>:<key> or <key>=<value>"
	}
	if msg := rules.DescriptorTextProblem(key); msg != "" {
		return source{}, "the key " + msg
	}
	if msg := rules.DescriptorTextProblem(value); msg != "" {
		return source{}, "the value " + msg
	}
	return source{kind: fromLiteral, key: key, value: value, text: text}, ""
}

// validHeaderName reports whether name is a field name of RFC 9110: a
// token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
