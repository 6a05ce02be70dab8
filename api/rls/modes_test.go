package rls_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// perHour is a limit of the string format slow enough that nothing refills
// while a test runs.
func perHour(name string, burst int64) limiter.Limit {
	return limiter.Limit{Name: name, IDFormat: limiter.String, Params: limiter.Params{Burst: burst, Count: burst, Period: time.Hour}}
}

// modeRule creates a rule with replaces and quota mode.
func (e *env) modeRule(r limiter.Rule) {
	e.t.Helper()
	if _, err := e.db.CreateRule(context.Background(), "test", r); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

// remaining returns the limit_remaining of each status.
func remaining(res *rlsv3.RateLimitResponse) []uint32 {
	var out []uint32
	for _, st := range res.GetStatuses() {
		out = append(out, st.GetLimitRemaining())
	}
	return out
}

// TestReplaces: as envoyproxy/ratelimit's replaces, a descriptor whose
// rule replaces limit X drops the request's descriptors of X: they are OK
// without a limit, spend nothing and deny nothing, however empty X is.
func TestReplaces(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng, envOptions{})
			e.limit(perHour("Specific", 1))
			e.limit(perHour("Raised", 10))
			e.rule("example7", "Specific", "key_1", "value_1", "user", "")
			e.modeRule(limiter.Rule{Domain: "example7", Limit: "Raised", Replaces: []string{"Specific", "NoSuchLimit"},
				Descriptor: entriesOf("key_2", "value_2", "user", "")})
			specific, raised := desc("key_1", "value_1", "user", "bob"), desc("key_2", "value_2", "user", "bob")

			wantCodes(t, e.must(request("example7", specific)), ok, ok)
			wantCodes(t, e.must(request("example7", specific)), over, over)
			// Bob's Specific bucket is empty, and replaced.
			res := e.must(request("example7", specific, raised))
			wantCodes(t, res, ok, ok, ok)
			if st := res.GetStatuses()[0]; st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
				t.Errorf("the replaced descriptor: %v", st)
			}
			if st := res.GetStatuses()[1]; st.GetCurrentLimit().GetName() != "Raised" || st.GetLimitRemaining() != 9 {
				t.Errorf("the replacing descriptor: %v", st)
			}
			// Alice's Specific bucket is full, and the replaced descriptor
			// takes nothing from it.
			alice := desc("key_1", "value_1", "user", "alice")
			e.must(request("example7", alice, desc("key_2", "value_2", "user", "alice")))
			if got := remaining(e.must(request("example7", alice))); got[0] != 0 {
				t.Errorf("alice's Specific after a replaced request and one of her own: remaining %v, want 0", got)
			}
			wantCodes(t, e.must(request("example7", alice)), over, over)
		})
	}
}

// TestQuotaMode: as envoyproxy/ratelimit's quota_mode, a descriptor over
// its quota says OVER_LIMIT in its status, and the request is OVER_LIMIT
// only when every quota descriptor is over (or another descriptor is);
// a request let through spends the buckets within their limits and
// nothing of those over.
func TestQuotaMode(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng, envOptions{})
			e.limit(perHour("QuotaA", 1))
			e.limit(perHour("QuotaB", 2))
			e.limit(perHour("PerUser", 5))
			e.modeRule(limiter.Rule{Domain: "quota", Limit: "QuotaA", QuotaMode: true, Descriptor: entriesOf("backend", "a")})
			e.modeRule(limiter.Rule{Domain: "quota", Limit: "QuotaB", QuotaMode: true, Descriptor: entriesOf("backend", "b")})
			e.rule("quota", "PerUser", "user", "")
			req := request("quota", desc("backend", "a"), desc("backend", "b"), desc("user", "u"))

			res := e.must(req)
			wantCodes(t, res, ok, ok, ok, ok)
			// A is over, B within: through, and A's status says so.
			res = e.must(req)
			wantCodes(t, res, ok, over, ok, ok)
			if got := remaining(res); got[0] != 0 || got[1] != 0 || got[2] != 3 {
				t.Errorf("remaining %v, want [0 0 3]", got)
			}
			for _, h := range res.GetResponseHeadersToAdd() {
				if h.GetKey() == "Retry-After" {
					t.Errorf("a request let through has %v", h)
				}
			}
			// Every quota is over: denied, and nothing spent.
			res = e.must(req)
			wantCodes(t, res, over, over, over, ok)
			if got := remaining(e.must(request("quota", desc("user", "u")))); got[0] != 2 {
				t.Errorf("PerUser after a denied request: remaining %v, want [2]", got)
			}
			// A quota alone is a limit: over is OVER_LIMIT.
			wantCodes(t, e.must(request("quota", desc("backend", "a"))), over, over)
		})
	}
}
