package rls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestOmitHeaders: a listener told to leave the RateLimit headers out adds
// none, allowed or denied, as envoyproxy/ratelimit adds none unless asked;
// the default adds them (TestShouldRateLimit reads their values).
func TestOmitHeaders(t *testing.T) {
	for _, tc := range []struct {
		omit bool
		want bool
	}{{omit: false, want: true}, {omit: true, want: false}} {
		e := newEnv(t, engines[0], envOptions{omitHeaders: tc.omit})
		e.limit(perMinute("L", limiter.String, 1, 1))
		e.rule("d", "L", "k", "")
		for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
			res := e.must(request("d", desc("k", "v")))
			wantCodes(t, res, want, want)
			if got := len(res.GetResponseHeadersToAdd()) > 0; got != tc.want {
				t.Errorf("omit %v, call %d: headers %v", tc.omit, i, headerMap(res.GetResponseHeadersToAdd()))
			}
		}
	}
}
