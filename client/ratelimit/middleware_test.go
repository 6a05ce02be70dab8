package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"

	"github.com/ratelimitd/ratelimitd/client/clientip"
)

// serve runs one request through h and returns the recorded answer.
func serve(h http.Handler, method, target, remote string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// ok is the handler behind the middleware.
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("served")) })

// problemOf decodes a problem+json answer, failing the test on another.
func problemOf(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p["status"] != float64(w.Code) || p["title"] != http.StatusText(w.Code) {
		t.Errorf("problem %v for status %d", p, w.Code)
	}
	return p
}

// TestMiddleware spends a burst of 2 through the middleware, keyed by the
// client's address behind a trusted proxy: two requests pass with the
// RateLimit headers, the third is a 429 with Retry-After and a problem,
// and another client's bucket is its own.
func TestMiddleware(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerIP": 2})
	c := newClient(t, f, Config{Timeout: time.Minute})
	h := Middleware(c, Rule{Limit: "PerIP", Key: ClientIP(clientip.Loopback...)})(ok)
	via := http.Header{"X-Forwarded-For": {"198.51.100.9, 203.0.113.7"}}

	for i, want := range []string{`"PerIP";r=1;t=0`, `"PerIP";r=0;t=0`} {
		w := serve(h, "GET", "/", "127.0.0.1:5000", via)
		if w.Code != 200 || w.Body.String() != "served" || w.Header().Get("RateLimit") != want ||
			w.Header().Get("RateLimit-Policy") != `"PerIP";q=2;w=3600` || w.Header().Get("Retry-After") != "" {
			t.Errorf("request %d: %d %q %v", i, w.Code, w.Body, w.Header())
		}
	}
	w := serve(h, "GET", "/", "127.0.0.1:5000", via)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "60" || w.Header().Get("RateLimit") != `"PerIP";r=0;t=60` ||
		w.Header().Get("RateLimit-Policy") != `"PerIP";q=2;w=3600` {
		t.Errorf("the denied request: %d %v", w.Code, w.Header())
	}
	if p := problemOf(t, w); !strings.Contains(p["detail"].(string), "PerIP") {
		t.Errorf("the 429's problem: %v", p)
	}
	if taken := f.Taken("PerIP", "203.0.113.7"); taken != 2 {
		t.Errorf("the bucket of 203.0.113.7 has %d tokens taken, want 2", taken)
	}
	// The same headers from a peer that is not a trusted proxy are not
	// believed: the peer is the client.
	if w := serve(h, "GET", "/", "192.0.2.1:5000", via); w.Code != 200 {
		t.Errorf("an untrusted peer's own bucket: %d", w.Code)
	}
	if w := serve(h, "GET", "/", "127.0.0.1:5000", http.Header{"X-Forwarded-For": {"not-an-address"}}); w.Code != 400 {
		t.Errorf("a forwarded address that does not parse: %d", w.Code)
	} else if p := problemOf(t, w); !strings.Contains(p["detail"].(string), "X-Forwarded-For") {
		t.Errorf("its problem: %v", p)
	}
}

// TestMiddlewareKeysAndCost keys by a header and by the route pattern, and
// spends a cost from a function.
func TestMiddlewareKeysAndCost(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerKey": 10, "PerRoute": 10})
	c := newClient(t, f, Config{Timeout: time.Minute})
	byKey := Middleware(c, Rule{Limit: "PerKey", Key: Header("x-api-key"),
		Cost: func(r *http.Request) int64 { return int64(len(r.URL.Query()["item"])) }})(ok)
	if w := serve(byKey, "GET", "/?item=1&item=2&item=3", "192.0.2.1:1", http.Header{"X-Api-Key": {"k1"}}); w.Code != 200 ||
		w.Header().Get("RateLimit") != `"PerKey";r=7;t=0` {
		t.Errorf("a cost of 3: %d %v", w.Code, w.Header())
	}
	for _, h := range []http.Header{{}, {"X-Api-Key": {""}}, {"X-Api-Key": {"a", "b"}}} {
		if w := serve(byKey, "GET", "/", "192.0.2.1:1", h); w.Code != 400 {
			t.Errorf("headers %v: %d, want 400", h, w.Code)
		}
	}

	mux := http.NewServeMux()
	limited := Middleware(c, Rule{Limit: "PerRoute", Key: RoutePattern})
	mux.Handle("GET /items/{id}", limited(ok))
	mux.Handle("GET /other", limited(ok))
	for _, path := range []string{"/items/1", "/items/2", "/other"} {
		if w := serve(mux, "GET", path, "192.0.2.1:1", nil); w.Code != 200 {
			t.Errorf("%s: %d", path, w.Code)
		}
	}
	if items, other := f.Taken("PerRoute", "GET /items/{id}"), f.Taken("PerRoute", "GET /other"); items != 2 || other != 1 {
		t.Errorf("the routes' buckets: %d and %d tokens, want 2 and 1", items, other)
	}
	// Around the mux there is no pattern yet.
	if w := serve(limited(mux), "GET", "/other", "192.0.2.1:1", nil); w.Code != 400 {
		t.Errorf("RoutePattern around the mux: %d, want 400", w.Code)
	}
}

// TestMiddlewareFailures: no answer is the fail mode's (open passes,
// closed is a 503 with Retry-After); a key the limit's id format refuses
// is a 400; an unknown limit, the service's mistake, a 500.
func TestMiddlewareFailures(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 10})
	down := fakeratelimitd.New(t, nil)
	down.Close()
	for _, open := range []bool{false, true} {
		c := newClient(t, down, Config{FailOpen: open, BreakerCooldown: 2 * time.Second})
		w := serve(Middleware(c, Rule{Limit: "L", Key: ClientIP()})(ok), "GET", "/", "192.0.2.1:1", nil)
		switch {
		case open && (w.Code != 200 || w.Body.String() != "served"):
			t.Errorf("failing open: %d", w.Code)
		case !open && (w.Code != 503 || w.Header().Get("Retry-After") != "2"):
			t.Errorf("failing closed: %d %v", w.Code, w.Header())
		case !open:
			problemOf(t, w)
		}
	}
	c := newClient(t, f, Config{FailOpen: true})
	empty := func(*http.Request) (string, error) { return "", nil }
	if w := serve(Middleware(c, Rule{Limit: "L", Key: empty})(ok), "GET", "/", "192.0.2.1:1", nil); w.Code != 400 {
		t.Errorf("a bucket id the format refuses: %d, want 400", w.Code)
	}
	if w := serve(Middleware(c, Rule{Limit: "Nope", Key: ClientIP()})(ok), "GET", "/", "192.0.2.1:1", nil); w.Code != 500 {
		t.Errorf("an unknown limit: %d, want 500", w.Code)
	}
	// A request of unknown length (chunked) has ContentLength -1.
	byLength := Middleware(c, Rule{Limit: "L", Key: ClientIP(), Cost: func(r *http.Request) int64 { return r.ContentLength }})(ok)
	r := httptest.NewRequest("POST", "/", strings.NewReader("body"))
	r.RemoteAddr, r.ContentLength = "192.0.2.1:1", -1
	w := httptest.NewRecorder()
	byLength.ServeHTTP(w, r)
	if w.Code != 500 || w.Body.String() == "served" {
		t.Errorf("a negative cost: %d %q, want 500", w.Code, w.Body)
	}
}

// TestHeadersMostRestrictive: the headers are those of the denied bucket
// with the longest retry-after, else of the allowed one with the fewest
// tokens left; shadow and unlimited buckets never give them; a
// concurrency limit of requests counts concurrent requests.
func TestHeadersMostRestrictive(t *testing.T) {
	d := func(limit string, allowed bool, remaining int64, retry time.Duration) Decision {
		return Decision{Limit: limit, Allowed: allowed, Remaining: remaining, RetryAfter: retry, ResetAfter: 90 * time.Second,
			Burst: 10, Count: 5, Period: time.Minute, Unit: "requests", Source: "default"}
	}
	shadow := d("Shadow", false, 0, time.Hour)
	shadow.Shadow = true
	unlimited := d("Unlimited", true, 0, 0)
	unlimited.Source = "unlimited"
	for _, tc := range []struct {
		r              Result
		policy, header string
	}{
		{Result{Allowed: true, Decisions: []Decision{d("A", true, 5, 0), d("B", true, 3, 0), shadow, unlimited}},
			`"B";q=10;w=120`, `"B";r=3;t=90`},
		{Result{Decisions: []Decision{d("A", false, 0, 2*time.Second), d("B", true, 0, 0), d("C", false, 0, 9*time.Second)}, RetryAfter: 9 * time.Second},
			`"C";q=10;w=120`, `"C";r=0;t=9`},
		{Result{Decisions: []Decision{d("A", false, 0, 2*time.Second), d("B", false, 0, Never)}},
			`"B";q=10;w=120`, `"B";r=0;t=90`},
		{Result{Allowed: true, Decisions: []Decision{{Limit: "Jobs", Allowed: true, Concurrent: true, Held: 1, Remaining: 2, Burst: 3, Count: 3,
			Period: 30 * time.Second, ResetAfter: 30 * time.Second, Unit: "requests", Source: "default"}}},
			`"Jobs";q=3;qu="concurrent-requests";w=30`, `"Jobs";r=2;t=30`},
	} {
		h := http.Header{}
		setHeaders(h, tc.r)
		if h.Get("RateLimit-Policy") != tc.policy || h.Get("RateLimit") != tc.header {
			t.Errorf("%+v: %v, want %s and %s", tc.r.Decisions, h, tc.policy, tc.header)
		}
	}
}

// TestClientIPUnmapped keys an IPv4 client mapped into IPv6 by its IPv4
// form, as ratelimitd's ip_address format writes it.
func TestClientIPUnmapped(t *testing.T) {
	key := ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[::ffff:10.1.2.3]:80"
	r.Header.Set("X-Forwarded-For", "::ffff:192.0.2.33")
	if got, err := key(r); err != nil || got != "192.0.2.33" {
		t.Errorf("%q, %v", got, err)
	}
}

// TestMiddlewareRefusedKey: a key that ratelimitd refuses, whatever the
// reason (too long, NUL, not UTF-8, longer than a body), is the
// request's 400, never the fail mode's pass, from a header or a key
// function alike; a whole request ratelimitd refused for its body is a
// 500, not the fail mode either.
func TestMiddlewareRefusedKey(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 10})
	var refuse atomic.Bool
	f.Fault = func(w http.ResponseWriter, r *http.Request) bool {
		if !refuse.Load() {
			return false
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"type":"about:blank","title":"Bad Request","status":400,"detail":"the body is not valid JSON"}`))
		return true
	}
	c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true, BreakerFailures: 1})
	for name, id := range badKeys {
		key := func(*http.Request) (string, error) { return id, nil }
		if w := serve(Middleware(c, Rule{Limit: "L", Key: key})(ok), "GET", "/", "192.0.2.1:1", nil); w.Code != 400 {
			t.Errorf("a key %s: %d %q, want 400", name, w.Code, w.Body)
		}
	}
	byHeader := Middleware(c, Rule{Limit: "L", Key: Header("X-Api-Key")})(ok)
	for _, v := range []string{strings.Repeat("k", 257), "a\xffb"} {
		if w := serve(byHeader, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {v}}); w.Code != 400 {
			t.Errorf("a header of %.20q: %d %q, want 400", v, w.Code, w.Body)
		}
	}
	refuse.Store(true)
	if w := serve(byHeader, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {"k"}}); w.Code != 500 {
		t.Errorf("a request refused whole: %d %q, want 500", w.Code, w.Body)
	}
}
