package limiter_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// clock is a fake clock in Unix microseconds.
type clock struct{ now int64 }

func (c *clock) advance(d time.Duration) { c.now += d.Microseconds() }

// bucketOf keeps one bucket's TAT the way a store would.
type bucketOf struct {
	tat  int64
	rate limiter.Rate
}

func (b *bucketOf) spend(now, cost int64) limiter.Outcome {
	var out limiter.Outcome
	b.tat, out = limiter.SpendStep(b.tat, now, b.rate, cost)
	return out
}

func want(t *testing.T, what string, got, want limiter.Outcome) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// TestBoulderStory tells Boulder's worked example: 20 requests per second,
// burst 20, so T = 50 ms.
func TestBoulderStory(t *testing.T) {
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC).UnixMicro()}
	b := &bucketOf{rate: limiter.Params{Burst: 20, Count: 20, Period: time.Second}.Rate()}
	const ms = time.Millisecond

	want(t, "the first request leaves 19, full again after 50 ms",
		b.spend(c.now, 1), limiter.Outcome{Allowed: true, Remaining: 19, ResetAfter: 50 * ms})
	for i := 2; i <= 20; i++ {
		out := b.spend(c.now, 1)
		if !out.Allowed || out.Remaining != int64(20-i) {
			t.Fatalf("request %d of the burst: %+v", i, out)
		}
	}
	want(t, "the 21st inside 50 ms is denied",
		b.spend(c.now, 1), limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 50 * ms, ResetAfter: time.Second})
	c.advance(49 * ms)
	want(t, "49 ms later it is still denied",
		b.spend(c.now, 1), limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: ms, ResetAfter: 951 * ms})
	c.advance(ms)
	for range 5 {
		want(t, "then one request per 50 ms", b.spend(c.now, 1), limiter.Outcome{Allowed: true, ResetAfter: time.Second})
		want(t, "and not two", b.spend(c.now, 1), limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 50 * ms, ResetAfter: time.Second})
		c.advance(50 * ms)
	}
	c.advance(time.Second)
	want(t, "an idle second refills the bucket", b.spend(c.now, 0), limiter.Outcome{Allowed: true, Remaining: 20})
}

func TestSpendEdges(t *testing.T) {
	now := int64(1_000_000_000_000)
	r := limiter.Params{Burst: 10, Count: 10, Period: time.Second}.Rate()
	tests := []struct {
		name string
		tat  int64
		rate limiter.Rate
		cost int64
		next int64
		out  limiter.Outcome
	}{
		{"cost 0 on a full bucket writes nothing", 0, r, 0, 0, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"cost 0 on a spent bucket", now + 300_000, r, 0, now + 300_000, limiter.Outcome{Allowed: true, Remaining: 7, ResetAfter: 300 * time.Millisecond}},
		{"the whole burst at once", 0, r, 10, now + 1_000_000, limiter.Outcome{Allowed: true, ResetAfter: time.Second}},
		{"one more than the burst", 0, r, 11, 0, limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, Remaining: 10, RetryAfter: limiter.Never}},
		{"the largest cost", now + 500_000, r, 1<<63 - 1, now + 500_000, limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, Remaining: 5, RetryAfter: limiter.Never, ResetAfter: 500 * time.Millisecond}},
		{"blocked", 0, limiter.Rate{Interval: 100_000}, 1, 0, limiter.Outcome{Reason: limiter.ReasonBlocked, RetryAfter: limiter.Never}},
		{"blocked, cost 0", 0, limiter.Rate{Interval: 100_000}, 0, 0, limiter.Outcome{Allowed: true}},
		{"a stale TAT counts as full", now - 5_000_000, r, 1, now + 100_000, limiter.Outcome{Allowed: true, Remaining: 9, ResetAfter: 100 * time.Millisecond}},
		{"a TAT beyond a lowered burst leaves no remaining, and a debt", now + 5_000_000, r, 1, now + 5_000_000,
			limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 40, RetryAfter: 4100 * time.Millisecond, ResetAfter: 5 * time.Second}},
		{"a partial token does not count", now + 250_000, r, 8, now + 250_000,
			limiter.Outcome{Reason: limiter.ReasonLimited, Remaining: 7, RetryAfter: 50 * time.Millisecond, ResetAfter: 250 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, out := limiter.SpendStep(tc.tat, now, tc.rate, tc.cost)
			if next != tc.next {
				t.Errorf("next TAT %d, want %d", next, tc.next)
			}
			want(t, "outcome", out, tc.out)
		})
	}
}

func TestRefundEdges(t *testing.T) {
	now := int64(1_000_000_000_000)
	r := limiter.Params{Burst: 10, Count: 10, Period: time.Second}.Rate()
	tests := []struct {
		name string
		tat  int64
		cost int64
		next int64
		out  limiter.Outcome
	}{
		{"nothing to give back to a full bucket", 0, 3, 0, limiter.Outcome{Remaining: 10}},
		{"a partial refund", now + 500_000, 2, now + 300_000, limiter.Outcome{Allowed: true, Remaining: 7, ResetAfter: 300 * time.Millisecond}},
		{"never past full", now + 500_000, 6, now, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"exactly to full", now + 500_000, 5, now, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"a partial token rounds to full", now + 450_000, 5, now, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"the largest cost cannot overflow", now + 500_000, 1<<63 - 1, now, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"cost 0 gives nothing back", now + 500_000, 0, now + 500_000, limiter.Outcome{Remaining: 5, ResetAfter: 500 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, out := limiter.RefundStep(tc.tat, now, r, tc.cost)
			if next != tc.next {
				t.Errorf("next TAT %d, want %d", next, tc.next)
			}
			want(t, "outcome", out, tc.out)
		})
	}
}

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		name      string
		p         limiter.Params
		blockable bool
		fields    []string
	}{
		{"valid", limiter.Params{Burst: 300, Count: 300, Period: 3 * time.Hour}, false, nil},
		{"everything missing", limiter.Params{}, false, []string{"burst", "count", "period"}},
		{"negative", limiter.Params{Burst: -1, Count: -1, Period: -time.Second}, true, []string{"burst", "count", "period"}},
		{"burst 0 on a limit", limiter.Params{Count: 1, Period: time.Second}, false, []string{"burst"}},
		{"burst 0 on an override", limiter.Params{Count: 1, Period: time.Second}, true, nil},
		{"interval of exactly 1µs", limiter.Params{Burst: 1, Count: 1_000_000, Period: time.Second}, false, nil},
		{"interval below 1µs", limiter.Params{Burst: 1, Count: 1_000_001, Period: time.Second}, false, []string{"period", "count"}},
		{"burst·T of 100 years", limiter.Params{Burst: 100 * 365, Count: 1, Period: 24 * time.Hour}, false, []string{"burst"}},
		{"burst·T just below 100 years", limiter.Params{Burst: 100*365 - 1, Count: 1, Period: 24 * time.Hour}, false, nil},
		{"a burst that overflows", limiter.Params{Burst: 1 << 62, Count: 1, Period: time.Hour}, false, []string{"burst"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, fe := range tc.p.Validate(tc.blockable) {
				got = append(got, fe.Field)
				if fe.Message == "" {
					t.Errorf("%s has no message", fe.Field)
				}
			}
			if len(got) != len(tc.fields) {
				t.Fatalf("fields %v, want %v", got, tc.fields)
			}
			for i := range got {
				if got[i] != tc.fields[i] {
					t.Fatalf("fields %v, want %v", got, tc.fields)
				}
			}
		})
	}
}
