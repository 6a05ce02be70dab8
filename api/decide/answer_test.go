package decide

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestRateLimitHeader checks the RateLimit header's t: on a denial, the
// seconds until a retry can succeed, as Retry-After says
// (draft-ietf-httpapi-ratelimit-headers-11 section 6, example B.1.4); when
// allowed, or when no retry can ever succeed, the seconds until the bucket
// is full.
func TestRateLimitHeader(t *testing.T) {
	params := limiter.Params{Burst: 10, Count: 10, Period: time.Minute}
	cases := []struct {
		name                  string
		op                    limiter.Op
		o                     limiter.Outcome
		ratelimit, retryAfter string
	}{
		{"denied", limiter.Spend, limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Minute},
			`"L";r=0;t=3`, "3"},
		{"allowed", limiter.Spend, limiter.Outcome{Allowed: true, Remaining: 4, ResetAfter: 36 * time.Second},
			`"L";r=4;t=36`, ""},
		{"never", limiter.Spend, limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, RetryAfter: limiter.Never, Remaining: 4, ResetAfter: 6 * time.Second},
			`"L";r=4;t=6`, ""},
		{"refund", limiter.Refund, limiter.Outcome{Remaining: 10, ResetAfter: 0},
			`"L";r=10;t=0`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := limiter.Decision{Limit: "L", Outcome: c.o, Params: params, Source: limiter.SourceDefault}
			res := limiter.Result{Allowed: d.Allowed, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter, Decisions: []limiter.Decision{d}}
			h := rateLimitHeaders(t, c.op, res)
			if got := h.Get("RateLimit"); got != c.ratelimit {
				t.Errorf("RateLimit %q, want %q", got, c.ratelimit)
			}
			if got := h.Get("Retry-After"); got != c.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, c.retryAfter)
			}
			if got := h.Get("RateLimit-Policy"); got != `"L";q=10;w=60` {
				t.Errorf("RateLimit-Policy %q", got)
			}
		})
	}
}

// TestPolicyOfQuotasAndLeases: a calendar quota's window is its current
// window's length, whatever its count (a rate's burst·T of a count that
// does not divide the window in microseconds would be short of it), and a
// concurrency limit's is its period, in concurrent requests.
func TestPolicyOfQuotasAndLeases(t *testing.T) {
	cases := []struct {
		name   string
		d      limiter.Decision
		policy string
	}{
		{"a day of 25 hours", limiter.Decision{Limit: "Q", Calendar: limiter.CalendarDay, Unit: "tokens",
			Params: limiter.Params{Burst: 70_000_000, Count: 70_000_000, Period: 25 * time.Hour}}, `"Q";q=70000000;w=90000`},
		{"a day in bytes", limiter.Decision{Limit: "Q", Calendar: limiter.CalendarDay, Unit: "bytes",
			Params: limiter.Params{Burst: 7, Count: 7, Period: 24 * time.Hour}}, `"Q";q=7;qu="content-bytes";w=86400`},
		{"leases", limiter.Decision{Limit: "C", Kind: limiter.KindConcurrency, Unit: limiter.DefaultUnit,
			Params: limiter.Params{Burst: 10, Count: 10, Period: 30 * time.Second}}, `"C";q=10;qu="concurrent-requests";w=30`},
		{"leases of jobs", limiter.Decision{Limit: "C", Kind: limiter.KindConcurrency, Unit: "jobs",
			Params: limiter.Params{Burst: 7, Count: 7, Period: 1500 * time.Millisecond}}, `"C";q=7;w=2`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.d.Allowed, c.d.Source = true, limiter.SourceDefault
			h := rateLimitHeaders(t, limiter.Spend, limiter.Result{Allowed: true, Decisions: []limiter.Decision{c.d}})
			if got := h.Get("RateLimit-Policy"); got != c.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, c.policy)
			}
		})
	}
}

// rateLimitHeaders returns the headers of an answer with res, through the
// edge, after a request id, which must come through them unchanged.
func rateLimitHeaders(t *testing.T, op limiter.Op, res limiter.Result) http.Header {
	t.Helper()
	e := edge.New(edge.Config{Observer: fixedID{}}, edge.Route{Path: "/", Serve: func(x *edge.Exchange, _ *http.Request) error {
		x.AddRateLimit(op, res)
		return nil
	}})
	w := httptest.NewRecorder()
	e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
	if w.Code != http.StatusOK || w.Header().Get("X-Request-Id") != "id" {
		t.Fatalf("%d, request id %q, want id", w.Code, w.Header().Get("X-Request-Id"))
	}
	return w.Header()
}

// fixedID gives every request the id "id".
type fixedID struct{}

func (fixedID) AppendRequestID(b []byte) []byte                   { return append(b, "id"...) }
func (fixedID) ObserveRequest(string, string, int, time.Duration) {}
