package rls_test

import (
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestUnlimitedAndBlockedStatuses: as envoyproxy/ratelimit answers them, an
// unlimited descriptor has 4294967295 remaining and no current limit, and
// a blocked one has a current limit of 0 requests in its period's unit.
func TestUnlimitedAndBlockedStatuses(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerPath", limiter.String, 3, 3))
	e.rule("edge", "PerPath", "path", "")
	e.override(limiter.Override{Limit: "PerPath", BucketID: "/free", Unlimited: true})
	e.override(limiter.Override{Limit: "PerPath", BucketID: "/blocked", Params: limiter.Params{Burst: 0, Count: 1, Period: time.Hour}})

	res := e.must(request("edge", desc("path", "/free")))
	wantCodes(t, res, ok, ok)
	if st := res.GetStatuses()[0]; st.GetLimitRemaining() != math.MaxUint32 || st.GetCurrentLimit() != nil {
		t.Errorf("unlimited: %v", st)
	}
	res = e.must(request("edge", desc("path", "/blocked")))
	wantCodes(t, res, over, over)
	st := res.GetStatuses()[0]
	if l := st.GetCurrentLimit(); l.GetName() != "PerPath" || l.GetRequestsPerUnit() != 0 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("blocked: current_limit %v", l)
	}
	if st.GetLimitRemaining() != 0 {
		t.Errorf("blocked: remaining %d", st.GetLimitRemaining())
	}
}
