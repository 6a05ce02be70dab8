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

func (b *bucketOf) settle(now, reserved, actual int64) limiter.Outcome {
	var out limiter.Outcome
	b.tat, out = limiter.SettleStep(b.tat, now, b.rate, reserved, actual)
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
		{"cost 0 on a bucket in debt, after its limit was lowered", now + 5_000_000, r, 0, now + 5_000_000,
			limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 40, RetryAfter: 4 * time.Second, ResetAfter: 5 * time.Second}},
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

// TestSettleStory: a language-model gateway with a budget of 100,000
// tokens a minute (burst 100,000, so T = 600µs) reserves 1,000 tokens per
// request up front and settles with what the request really used.
func TestSettleStory(t *testing.T) {
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC).UnixMicro()}
	b := &bucketOf{rate: limiter.Params{Burst: 100_000, Count: 100_000, Period: time.Minute}.Rate()}
	const ms = time.Millisecond

	want(t, "reserving 1,000 leaves 99,000",
		b.spend(c.now, 1_000), limiter.Outcome{Allowed: true, Remaining: 99_000, ResetAfter: 600 * ms})
	want(t, "using 30,000 charges the other 29,000",
		b.settle(c.now, 1_000, 30_000), limiter.Outcome{Allowed: true, Remaining: 70_000, ResetAfter: 18 * time.Second})
	for _, left := range []int64{40_000, 10_000} {
		b.spend(c.now, 1_000)
		want(t, "another request of 30,000",
			b.settle(c.now, 1_000, 30_000), limiter.Outcome{Allowed: true, Remaining: left, ResetAfter: time.Duration(100_000-left) * 600 * time.Microsecond})
	}
	want(t, "the fourth reservation still fits",
		b.spend(c.now, 1_000), limiter.Outcome{Allowed: true, Remaining: 9_000, ResetAfter: 54_600 * ms})
	want(t, "120,000 used of 100,000: its 30,000 put the bucket 20,000 into debt",
		b.settle(c.now, 1_000, 30_000), limiter.Outcome{Allowed: true, Debt: 20_000, ResetAfter: 72 * time.Second})
	want(t, "a spend is denied until the debt and its own token are paid",
		b.spend(c.now, 1), limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 20_000, RetryAfter: 12_000_600 * time.Microsecond, ResetAfter: 72 * time.Second})
	want(t, "a check of cost 0 is denied too, and tells when the debt is paid",
		b.spend(c.now, 0), limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 20_000, RetryAfter: 12 * time.Second, ResetAfter: 72 * time.Second})
	c.advance(6 * time.Second)
	want(t, "half-way the debt is halved",
		b.spend(c.now, 0), limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 10_000, RetryAfter: 6 * time.Second, ResetAfter: 66 * time.Second})
	c.advance(6 * time.Second)
	want(t, "paid off, the bucket is empty: a check passes",
		b.spend(c.now, 0), limiter.Outcome{Allowed: true, ResetAfter: time.Minute})
	want(t, "but a spend waits for its token",
		b.spend(c.now, 1), limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 600 * time.Microsecond, ResetAfter: time.Minute})
	c.advance(600 * time.Microsecond)
	want(t, "which comes 600µs later",
		b.spend(c.now, 1), limiter.Outcome{Allowed: true, ResetAfter: time.Minute})
	want(t, "a request that used 1,000,000 without a reservation is capped at one burst of debt",
		b.settle(c.now, 0, 1_000_000), limiter.Outcome{Allowed: true, Capped: true, Debt: 100_000, ResetAfter: 2 * time.Minute})
	want(t, "at the cap, more usage charges nothing",
		b.settle(c.now, 0, 1), limiter.Outcome{Allowed: true, Capped: true, Debt: 100_000, ResetAfter: 2 * time.Minute})
	want(t, "a request that used nothing of its 50,000 gives them back",
		b.settle(c.now, 50_000, 0), limiter.Outcome{Allowed: true, Debt: 50_000, ResetAfter: 90 * time.Second})
	want(t, "using what was reserved changes nothing",
		b.settle(c.now, 7, 7), limiter.Outcome{Allowed: true, Debt: 50_000, ResetAfter: 90 * time.Second})
}

func TestSettleEdges(t *testing.T) {
	now := int64(1_000_000_000_000)
	r := limiter.Params{Burst: 10, Count: 10, Period: time.Second}.Rate()
	tests := []struct {
		name             string
		tat              int64
		rate             limiter.Rate
		reserved, actual int64
		next             int64
		out              limiter.Outcome
	}{
		{"a blocked bucket is left alone", now + 5, limiter.Rate{Interval: 100_000}, 0, 5, now + 5,
			limiter.Outcome{Reason: limiter.ReasonBlocked, RetryAfter: limiter.Never}},
		{"a full bucket given back is still allowed", 0, r, 5, 0, 0, limiter.Outcome{Allowed: true, Remaining: 10}},
		{"a stale TAT counts from now", now - 5_000_000, r, 0, 3, now + 300_000,
			limiter.Outcome{Allowed: true, Remaining: 7, ResetAfter: 300 * time.Millisecond}},
		{"exactly one burst of debt is not capped", now, r, 0, 20, now + 2_000_000,
			limiter.Outcome{Allowed: true, Debt: 10, ResetAfter: 2 * time.Second}},
		{"one token more is", now, r, 0, 21, now + 2_000_000,
			limiter.Outcome{Allowed: true, Capped: true, Debt: 10, ResetAfter: 2 * time.Second}},
		{"the largest excess cannot overflow", now + 500_000, r, 0, 1<<63 - 1, now + 2_000_000,
			limiter.Outcome{Allowed: true, Capped: true, Debt: 10, ResetAfter: 2 * time.Second}},
		{"the largest refund cannot overflow", now + 1_500_000, r, 1<<63 - 1, 0, now,
			limiter.Outcome{Allowed: true, Remaining: 10}},
		{"a TAT beyond the cap, after a lowered limit, never moves back", now + 5_000_000, r, 0, 1, now + 5_000_000,
			limiter.Outcome{Allowed: true, Capped: true, Debt: 40, ResetAfter: 5 * time.Second}},
		{"a partial token of debt counts as one", now + 1_050_000, r, 0, 0, now + 1_050_000,
			limiter.Outcome{Allowed: true, Debt: 1, ResetAfter: 1050 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, out := limiter.SettleStep(tc.tat, now, tc.rate, tc.reserved, tc.actual)
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
