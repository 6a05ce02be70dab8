package forwardauth_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
)

// TestDecide: allowed calls are 200 with the RateLimit headers, the call
// past the burst a 429 with Retry-After and a problem (or a 403 when
// asked), on every engine; what matches no rule, and a call that makes no
// descriptor, is allowed without headers; the decisions are counted as the
// forward_auth front's.
func TestDecide(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng, envOptions{})
			e.limit(perMinute("PerIP", limiter.IPAddress, 2))
			e.rule("web", "PerIP", "remote_address", "")
			const q = "/v1/forward-auth/web?d=remote_address"
			for i := range 2 {
				a := e.get(q, "X-Forwarded-For", "203.0.113.7")
				if a.status != http.StatusOK || len(a.body) != 0 {
					t.Fatalf("call %d: %d %s", i, a.status, a.body)
				}
				if got, want := a.header.Get("RateLimit"), `"PerIP";r=`+strconv.Itoa(1-i); !strings.HasPrefix(got, want) {
					t.Errorf("call %d: RateLimit %q, want %s...", i, got, want)
				}
				if a.header.Get("RateLimit-Policy") != `"PerIP";q=2;w=60` || a.header.Get("X-Request-Id") == "" {
					t.Errorf("call %d: headers %v", i, a.header)
				}
			}
			a := e.get(q, "X-Forwarded-For", "203.0.113.7")
			if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "30" || !strings.Contains(a.problem(t).Detail, `"PerIP"`) {
				t.Errorf("the third call: %d %v %s", a.status, a.header, a.body)
			}
			// The same bucket under another spelling.
			if a := e.get(q+"&deny_status=403", "X-Forwarded-For", "::ffff:203.0.113.7"); a.status != http.StatusForbidden || a.header.Get("Retry-After") == "" {
				t.Errorf("deny_status=403: %d %v", a.status, a.header)
			}
			// Another client has its own bucket.
			if a := e.get(q, "X-Forwarded-For", "203.0.113.8"); a.status != http.StatusOK {
				t.Errorf("another client: %d %s", a.status, a.body)
			}
			// No rule of the domain, no rule at all, no descriptor made.
			for _, path := range []string{"/v1/forward-auth/web?d=path", "/v1/forward-auth/elsewhere?d=remote_address",
				"/v1/forward-auth/web?d=header:X-Api-Key:key"} {
				a := e.get(path, "X-Forwarded-For", "203.0.113.7", "X-Forwarded-Uri", "/x")
				if a.status != http.StatusOK || a.header.Get("RateLimit") != "" {
					t.Errorf("%s: %d %v", path, a.status, a.header)
				}
			}
			if got := e.metric(`ratelimitd_decisions_total{frontend="forward_auth",limit="PerIP",op="spend",result="denied"}`); got != 2 {
				t.Errorf("%v denied decisions counted, want 2", got)
			}
			if got := e.metric(`ratelimitd_unmatched_descriptors_total{frontend="forward_auth"}`); got != 2 {
				t.Errorf("%v unmatched descriptors counted, want 2", got)
			}
		})
	}
}

// TestEveryMethodAlike: the gateway's own method means nothing; HEAD gets
// the status and headers without a body.
func TestEveryMethodAlike(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerMethod", limiter.String, 7))
	e.rule("web", "PerMethod", "method", "")
	for i, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		a := e.call(m, "/v1/forward-auth/web?d=method", "X-Original-Method", "DELETE")
		if want := `"PerMethod";r=` + strconv.Itoa(6-i); a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("RateLimit"), want) {
			t.Errorf("%s: %d, RateLimit %q, want %s...", m, a.status, a.header.Get("RateLimit"), want)
		}
	}
	if a := e.call(http.MethodHead, "/v1/forward-auth/web?d=method", "X-Original-Method", "DELETE"); a.status != http.StatusTooManyRequests || len(a.body) != 0 {
		t.Errorf("HEAD denied: %d %q", a.status, a.body)
	}
}

// TestAttributes: each source reads its attribute as docs/gateways.md
// says, so that the bucket of every spelling of one request is one.
func TestAttributes(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("Text", limiter.String, 100))
	e.rule("web", "Text", "method", "", "host", "", "path", "", "api_key", "", "tier", "gold")
	e.rule("web", "Text", "path", "")
	// bucket answers the bucket id the match of a call gives.
	bucket := func(d string, kv ...string) string {
		t.Helper()
		a := e.get("/v1/forward-auth/web?d="+d, kv...)
		if a.status != http.StatusOK {
			t.Fatalf("d=%s %v: %d %s", d, kv, a.status, a.body)
		}
		return a.header.Get("RateLimit")
	}
	all := "method,host,path,header:X-Api-Key:api_key,tier=gold"
	first := bucket(all, "X-Forwarded-Method", "POST", "X-Forwarded-Host", "Shop.Example:8443", "X-Forwarded-Uri", "/a/b?x=1", "X-Api-Key", "k1")
	// The same request through nginx's headers and another spelling.
	second := bucket(all, "X-Original-Method", "POST", "Host", "shop.example:8443", "X-Original-URI", "//a/./c/../b", "X-Api-Key", " k1 ")
	if !strings.Contains(first, "r=99") || !strings.Contains(second, "r=98") {
		t.Errorf("one request spelt twice: %q then %q", first, second)
	}
	for i, c := range []struct{ uri, same string }{
		{"/%6Cogin", "/login"}, {"/a/../login", "/login"}, {"/../login", "/login"}, {"//login", "/login"},
		{"http://Shop.Example/login?q", "/login"}, {"/login#top", "/login"}, {"/login/", "/login/"}, {"/a%2Fb", "/a/b"}, {"/a/.", "/a/"},
	} {
		got := e.matchPath(c.uri)
		if got != c.same {
			t.Errorf("%d: the path of %q is %q, want %q", i, c.uri, got, c.same)
		}
	}
}

// matchPath returns the bucket id that the path of uri forms, by the dry
// run.
func (e *env) matchPath(uri string) string {
	e.t.Helper()
	var m matchAnswer
	e.match("web", `{"query":"d=path","headers":[{"name":"X-Forwarded-Uri","value":`+strconv.Quote(uri)+`}]}`, &m)
	if len(m.Descriptors) != 1 || m.Descriptors[0].Match == nil {
		e.t.Fatalf("%s: %+v", uri, m)
	}
	return m.Descriptors[0].Match.BucketID
}

// TestClientAddress: the address comes from X-Forwarded-For only when
// the peer is a trusted proxy; from an untrusted peer the headers are
// ignored, so a client of the gateway cannot choose its bucket.
func TestClientAddress(t *testing.T) {
	untrusted := newEnv(t, engines[0], envOptions{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	untrusted.limit(perMinute("PerIP", limiter.IPAddress, 1))
	untrusted.rule("web", "PerIP", "remote_address", "")
	if a := untrusted.get("/v1/forward-auth/web?d=remote_address", "X-Forwarded-For", "203.0.113.1", "X-Real-IP", "203.0.113.2"); a.status != http.StatusOK {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	// Spoofed headers, even garbage ones, change nothing: the peer is the client.
	for _, h := range [][]string{{"X-Forwarded-For", "203.0.113.9"}, {"X-Real-IP", "203.0.113.10"}, {"X-Forwarded-For", "nonsense"}} {
		if a := untrusted.get("/v1/forward-auth/web?d=remote_address", h...); a.status != http.StatusTooManyRequests {
			t.Errorf("%v from an untrusted peer: %d %s", h, a.status, a.body)
		}
	}

	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerIP", limiter.IPAddress, 1))
	e.rule("web", "PerIP", "remote_address", "")
	var m matchAnswer
	e.match("web", `{"query":"d=remote_address","headers":[{"name":"X-Forwarded-For","value":"6.6.6.6, 198.51.100.7, 127.0.0.1"}]}`, &m)
	if m.ClientAddress == nil || *m.ClientAddress != "198.51.100.7" {
		t.Errorf("the client behind a trusted hop: %+v", m)
	}
	e.match("web", `{"query":"d=remote_address","peer":"203.0.113.50","headers":[{"name":"X-Forwarded-For","value":"198.51.100.7"}]}`, &m)
	if m.ClientAddress == nil || *m.ClientAddress != "203.0.113.50" {
		t.Errorf("an untrusted peer's headers: %+v", m)
	}
	thousand := strings.Repeat("127.0.0.1, ", 999) + "198.51.100.9"
	if a := e.get("/v1/forward-auth/web?d=remote_address", "X-Forwarded-For", thousand); a.status != http.StatusOK {
		t.Errorf("a thousand entries: %d %s", a.status, a.body)
	}
}

// TestHostileInput: every malformed call is a 4xx naming the parameter or
// header, never a 5xx, and spends nothing: the bucket that a good call
// spends afterwards is still full.
func TestHostileInput(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("Any", limiter.String, 100))
	e.rule("web", "Any", "api_key", "")
	e.rule("web", "Any", "path", "")
	e.rule("web", "Any", "method", "")
	e.rule("web", "Any", "host", "")
	e.rule("web", "Any", "k", "")
	long := strings.Repeat("a", 257)
	hundred := strings.Repeat("d=k=v&", 100)
	for _, c := range []struct {
		name   string
		path   string
		kv     []string
		status int
		field  string
	}{
		{"no d", "/v1/forward-auth/web", nil, 422, "d"},
		{"empty d", "/v1/forward-auth/web?d=", nil, 422, "d[0]"},
		{"unknown source", "/v1/forward-auth/web?d=k=v&d=cookie", nil, 422, "d[1]"},
		{"empty entry", "/v1/forward-auth/web?d=path,,method", nil, 422, "d[0]"},
		{"17 entries", "/v1/forward-auth/web?d=" + strings.TrimSuffix(strings.Repeat("a=1,", 17), ","), nil, 422, "d[0]"},
		{"101 descriptors", "/v1/forward-auth/web?" + hundred + "d=k=v", nil, 422, "d"},
		{"unknown parameter", "/v1/forward-auth/web?d=path&deny-status=403", nil, 422, "deny-status"},
		{"deny_status 500", "/v1/forward-auth/web?d=path&deny_status=500", nil, 422, "deny_status"},
		{"header source without a key", "/v1/forward-auth/web?d=header:X-Api-Key", nil, 422, "d[0]"},
		{"bad header name", "/v1/forward-auth/web?d=header:X%20Key:k", nil, 422, "d[0]"},
		{"literal with NUL", "/v1/forward-auth/web?d=k=a%00b", nil, 422, "d[0]"},
		{"bad escape", "/v1/forward-auth/web?d=%zz", nil, 400, ""},
		{"bad domain", "/v1/forward-auth/" + long + "?d=k=v", nil, 422, "domain"},
		{"header of 8 KiB", "/v1/forward-auth/web?d=header:X-Api-Key:api_key", []string{"X-Api-Key", strings.Repeat("k", 8<<10)}, 422, "X-Api-Key"},
		{"header twice", "/v1/forward-auth/web?d=header:X-Api-Key:api_key", []string{"X-Api-Key", "a", "X-Api-Key", "b"}, 422, "X-Api-Key"},
		{"no URI", "/v1/forward-auth/web?d=path", nil, 422, "X-Forwarded-Uri"},
		{"URI with NUL", "/v1/forward-auth/web?d=path", []string{"X-Forwarded-Uri", "/a%00b"}, 422, "X-Forwarded-Uri"},
		{"URI with a bad escape", "/v1/forward-auth/web?d=path", []string{"X-Original-URI", "/a%2"}, 422, "X-Original-Uri"},
		{"URI not UTF-8", "/v1/forward-auth/web?d=path", []string{"X-Forwarded-Uri", "/%ff"}, 422, "X-Forwarded-Uri"},
		{"URI of 16 KiB", "/v1/forward-auth/web?d=path", []string{"X-Forwarded-Uri", "/" + strings.Repeat("a", 16<<10)}, 422, "X-Forwarded-Uri or X-Original-Uri"},
		{"URI not a path", "/v1/forward-auth/web?d=path", []string{"X-Forwarded-Uri", "login"}, 422, "X-Forwarded-Uri"},
		{"no method", "/v1/forward-auth/web?d=method", nil, 422, "X-Forwarded-Method"},
		{"bad method", "/v1/forward-auth/web?d=method", []string{"X-Forwarded-Method", "GE T"}, 422, "X-Forwarded-Method"},
		{"host list", "/v1/forward-auth/web?d=host", []string{"X-Forwarded-Host", "a.example, b.example"}, 422, "X-Forwarded-Host"},
		{"bad client address", "/v1/forward-auth/web?d=remote_address", []string{"X-Forwarded-For", "1.2.3.4, nonsense"}, 422, "X-Forwarded-For"},
		{"empty client address", "/v1/forward-auth/web?d=remote_address", []string{"X-Forwarded-For", "1.2.3.4,"}, 422, "X-Forwarded-For"},
		{"client address with a bad port", "/v1/forward-auth/web?d=remote_address", []string{"X-Forwarded-For", "1.2.3.4:99999"}, 422, "X-Forwarded-For"},
		{"X-Real-IP twice", "/v1/forward-auth/web?d=remote_address", []string{"X-Real-IP", "1.2.3.4", "X-Real-IP", "1.2.3.5"}, 422, "X-Real-IP"},
		{"token in the query", "/v1/forward-auth/web?d=k=v&access_token=x", nil, 400, ""},
		{"secret as a value", "/v1/forward-auth/web?d=k=rlt_abc", nil, 400, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := e.get(c.path, c.kv...)
			if a.status != c.status {
				t.Fatalf("%d, want %d: %s", a.status, c.status, a.body)
			}
			p := a.problem(t)
			if c.field != "" && !slices.Contains(a.fields(t), c.field) {
				t.Errorf("the problem names %v, want %s: %s", a.fields(t), c.field, p.Detail)
			}
		})
	}
	// Header values Go's client will not send. net/http itself refuses a
	// control character in a header (400, plain text) before any handler;
	// what it lets through is refused naming the header.
	for _, c := range []struct {
		value  string
		status int
	}{{"a\x00b", 400}, {"a\x01b", 400}, {"\xff\xfe", 422}, {"caf\xc3\xa9\x7f", 400}} {
		status, body := e.raw("/v1/forward-auth/web?d=header:X-Api-Key:api_key", "X-Api-Key", c.value)
		if status != c.status || status == 422 && !strings.Contains(body, `"field":"X-Api-Key"`) {
			t.Errorf("X-Api-Key %q: %d %s", c.value, status, body)
		}
	}
	// Nothing above spent: a good call finds every bucket it names full.
	a := e.get("/v1/forward-auth/web?d=k=v&d=path&d=method", "X-Forwarded-Uri", "/a", "X-Forwarded-Method", "GET")
	if a.status != http.StatusOK || !strings.Contains(a.header.Get("RateLimit"), "r=99") {
		t.Errorf("after the hostile calls: %d %v", a.status, a.header)
	}
	// 100 descriptors, all of one bucket, are one decision of cost 100.
	if a := e.get("/v1/forward-auth/web?" + strings.Repeat("d=k=w&", 99) + "d=k=w"); a.status != http.StatusOK || !strings.Contains(a.header.Get("RateLimit"), "r=0") {
		t.Errorf("100 descriptors: %d %v", a.status, a.header)
	}
}

// TestAuthentication: the gateway's header wins, so that the client's own
// Authorization reaches the descriptors untouched; without it
// Authorization is the token; without either, 401.
func TestAuthentication(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerAuth", limiter.String, 5))
	e.rule("web", "PerAuth", "auth", "")
	const q = "/v1/forward-auth/web?d=header:Authorization:auth"
	a := e.get(q, "Authorization", "Bearer client-one")
	if a.status != http.StatusOK || !strings.Contains(a.header.Get("RateLimit"), "r=4") {
		t.Errorf("keyed on the client's Authorization: %d %v %s", a.status, a.header, a.body)
	}
	req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/forward-auth/web?d=k=v", nil)
	req.Header.Set("Authorization", "Bearer "+e.admin)
	if a := e.do(req); a.status != http.StatusOK {
		t.Errorf("the token in Authorization: %d %s", a.status, a.body)
	}
	req.Header.Set("X-Ratelimit-Authorization", "Bearer wrong")
	if a := e.do(req); a.status != http.StatusUnauthorized {
		t.Errorf("a wrong gateway token beside a good Authorization: %d %s", a.status, a.body)
	}
	req.Header.Del("X-Ratelimit-Authorization")
	req.Header.Del("Authorization")
	if a := e.do(req); a.status != http.StatusUnauthorized {
		t.Errorf("no token: %d", a.status)
	}
}

// TestFailMode: with the store down, open answers 200 saying it is
// degraded, closed 503 with Retry-After.
func TestFailMode(t *testing.T) {
	for _, open := range []bool{true, false} {
		e := newEnv(t, engines[0], envOptions{failOpen: open, store: storetest.Down{Err: errors.New("down")}})
		e.limit(perMinute("PerIP", limiter.IPAddress, 1))
		e.rule("web", "PerIP", "remote_address", "")
		a := e.get("/v1/forward-auth/web?d=remote_address")
		switch {
		case open && (a.status != http.StatusOK || a.header.Get("X-Ratelimit-Degraded") != "true"):
			t.Errorf("fail open: %d %v", a.status, a.header)
		case !open && (a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == ""):
			t.Errorf("fail closed: %d %v", a.status, a.header)
		}
	}
}

// TestShadowAndQuotaMode: a shadow limit never denies; a quota-mode rule
// lets a call through as ShouldRateLimit does, by the same code.
func TestShadowAndQuotaMode(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	shadow := perMinute("Shadow", limiter.String, 1)
	shadow.Shadow = true
	e.limit(shadow)
	e.rule("web", "Shadow", "k", "")
	for i := range 3 {
		if a := e.get("/v1/forward-auth/web?d=k=v"); a.status != http.StatusOK {
			t.Errorf("shadow, call %d: %d", i, a.status)
		}
	}
}

// matchAnswer is the dry run's answer.
type matchAnswer struct {
	ClientAddress *string `json:"client_address"`
	Descriptors   []struct {
		D       string  `json:"d"`
		Made    bool    `json:"made"`
		Skipped *string `json:"skipped"`
		Match   *struct {
			RuleID   string `json:"rule_id"`
			Limit    string `json:"limit"`
			BucketID string `json:"bucket_id"`
			Replaced bool   `json:"replaced"`
		} `json:"match"`
	} `json:"descriptors"`
}

// match runs a dry run and decodes its 200 into out.
func (e *env) match(domain, body string, out *matchAnswer) {
	e.t.Helper()
	a := e.post("/v1/forward-auth/"+domain+"/match", body)
	if a.status != http.StatusOK {
		e.t.Fatalf("dry run %s: %d %s", body, a.status, a.body)
	}
	*out = matchAnswer{}
	if err := json.Unmarshal(a.body, out); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) post(path, body string) answer {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.admin)
	req.Header.Set("Content-Type", "application/json")
	return e.do(req)
}

// TestMatchSpendsNothing: the dry run says what a call would match, and
// spends nothing; a call the route refuses is refused alike.
func TestMatchSpendsNothing(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerKey", limiter.String, 1))
	e.limit(perMinute("PerPath", limiter.String, 1))
	r := e.rule("web", "PerKey", "api_key", "")
	e.rule("web", "PerPath", "path", "/admin*")
	var m matchAnswer
	for range 3 {
		e.match("web", `{"query":"d=header:X-Api-Key:api_key&d=path&d=header:X-Other:o","headers":[{"name":"X-Api-Key","value":"k1"},{"name":"X-Forwarded-Uri","value":"/public"}]}`, &m)
	}
	if len(m.Descriptors) != 3 || m.Descriptors[0].Match == nil || m.Descriptors[0].Match.RuleID != r.ID || m.Descriptors[0].Match.BucketID != "k1" ||
		!m.Descriptors[1].Made || m.Descriptors[1].Match != nil || m.Descriptors[2].Made || m.Descriptors[2].Skipped == nil {
		t.Errorf("dry run: %+v", m)
	}
	if a := e.get("/v1/forward-auth/web?d=header:X-Api-Key:api_key", "X-Api-Key", "k1"); a.status != http.StatusOK {
		t.Errorf("after three dry runs the bucket is spent: %d", a.status)
	}
	if a := e.post("/v1/forward-auth/web/match", `{"query":"d=path"}`); a.status != http.StatusUnprocessableEntity || !slices.Contains(a.fields(t), "X-Forwarded-Uri") {
		t.Errorf("a call the route refuses: %d %s", a.status, a.body)
	}
	if a := e.post("/v1/forward-auth/web/match", `{"query":"d=path","extra":1}`); a.status != http.StatusBadRequest {
		t.Errorf("an unknown field: %d %s", a.status, a.body)
	}
	if a := e.post("/v1/forward-auth/web/match", `{"query":"d=k=v&token=rlt_x"}`); a.status != http.StatusBadRequest {
		t.Errorf("a token in the query: %d %s", a.status, a.body)
	}
}
