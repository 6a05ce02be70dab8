// Package storetest is the contract every limiter.Store passes: the same
// suite runs on the in-process store, on Redis and on Redis Cluster, so that
// the Go and Lua versions of the algorithm, of leases (lease.go) and of
// calendar quotas cannot drift. It is imported from
// _test.go files only.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Harness is a store under test, empty and private to one test.
type Harness struct {
	Store limiter.Store
	// Expiry returns when the store will drop key by itself, and false
	// when it does not hold key.
	Expiry func(t *testing.T, key string) (time.Time, bool)
	// RecordExpiry returns when the store will drop the record of lease
	// id by itself, and false when it does not hold it.
	RecordExpiry func(t *testing.T, id string) (time.Time, bool)
	// ExpiryMargin is how long after a bucket is full, or its last lease
	// or a lease's record has expired, its key lives on; the store drops
	// it between then and a second later.
	ExpiryMargin time.Duration
	// ExactBatches is true when concurrent spends or leases of several
	// buckets admit exactly what the limits allow. Redis Cluster sets it
	// false for keys in different slots: a spend or lease that is rolled
	// back on one slot may deny others meanwhile, so it admits at most,
	// not exactly, the limit.
	ExactBatches bool
}

// Run runs the contract suite. newHarness is called once per subtest. The
// suite's clocks start at the real time and stay within seconds of it, as
// stores that expire keys by the wall clock need.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		f    func(t *testing.T, h Harness)
	}{
		{"GCRAStory", testGCRAStory},
		{"CostZeroInspects", testCostZeroInspects},
		{"CostExceedsBurst", testCostExceedsBurst},
		{"BurstZeroBlocks", testBurstZeroBlocks},
		{"Refund", testRefund},
		{"Settle", testSettle},
		{"SettleBatch", testSettleBatch},
		{"Reset", testReset},
		{"BatchAllOrNothing", testBatchAllOrNothing},
		{"Shadow", testShadow},
		{"Expiry", testExpiry},
		{"KeysDoNotCollide", testKeysDoNotCollide},
		{"OddRates", testOddRates},
		{"ConcurrentSpends", testConcurrentSpends},
		{"ConcurrentBatches", testConcurrentBatches},
		{"ConcurrentDeniedBatches", testConcurrentDeniedBatches},
		{"ConcurrentSettles", testConcurrentSettles},
		{"ManyInOrder", testManyInOrder},
		{"ManyConcurrent", testManyConcurrent},
		{"LeaseStory", testLeaseStory},
		{"LeaseBatch", testLeaseBatch},
		{"LeaseShadow", testLeaseShadow},
		{"LeaseNever", testLeaseNever},
		{"LeaseReset", testLeaseReset},
		{"LeaseHeldReads", testLeaseHeldReads},
		{"LeaseExpiry", testLeaseExpiry},
		{"LeaseExpire", testLeaseExpire},
		{"LeaseConcurrentAcquires", testLeaseConcurrentAcquires},
		{"LeaseConcurrentBatches", testLeaseConcurrentBatches},
		{"QuotaWindow", testQuotaWindow},
		{"QuotaConcurrentSpends", testQuotaConcurrentSpends},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, newHarness(t)) })
	}
}

// checker drives a store with a fake clock and checks, after every call,
// that the store wrote exactly what limiter.SpendStep and RefundStep say.
type checker struct {
	t   *testing.T
	h   Harness
	now time.Time
}

func newChecker(t *testing.T, h Harness) *checker {
	return &checker{t: t, h: h, now: time.Now().Truncate(time.Millisecond)}
}

func (c *checker) advance(d time.Duration) { c.now = c.now.Add(d) }

// tats reads the TATs of buckets, 0 for a full bucket.
func (c *checker) tats(buckets ...limiter.Bucket) []int64 {
	c.t.Helper()
	batch := append([]limiter.Bucket(nil), buckets...)
	if _, err := c.h.Store.Apply(context.Background(), limiter.Check, c.now, batch); err != nil {
		c.t.Fatalf("check: %v", err)
	}
	out := make([]int64, len(batch))
	for i, b := range batch {
		out[i] = c.full(b.TAT)
	}
	return out
}

// full maps every TAT at or before now to 0: all mean a full bucket.
func (c *checker) full(tat int64) int64 {
	if tat <= c.now.UnixMicro() {
		return 0
	}
	return tat
}

func (c *checker) spend(buckets ...limiter.Bucket) []limiter.Outcome {
	c.t.Helper()
	return c.do(limiter.Spend, buckets)
}

func (c *checker) refund(buckets ...limiter.Bucket) []limiter.Outcome {
	c.t.Helper()
	return c.do(limiter.Refund, buckets)
}

func (c *checker) settle(buckets ...limiter.Bucket) []limiter.Outcome {
	c.t.Helper()
	return c.do(limiter.Settle, buckets)
}

// do runs op and checks that the store reports the TATs a check read
// before, and decides and writes exactly what limiter.StepBatch does with
// them.
func (c *checker) do(op limiter.Op, buckets []limiter.Bucket) []limiter.Outcome {
	c.t.Helper()
	before := c.tats(buckets...)
	batch := append([]limiter.Bucket(nil), buckets...)
	commit, err := c.h.Store.Apply(context.Background(), op, c.now, batch)
	if err != nil {
		c.t.Fatalf("%s: %v", op, err)
	}
	nowUS := c.now.UnixMicro()
	want := append([]limiter.Bucket(nil), buckets...)
	for i, b := range batch {
		if got := c.full(b.TAT); got != before[i] {
			c.t.Fatalf("%s reported TAT %d for %s, a check said %d", op, got, b.Key, before[i])
		}
		want[i].TAT = b.TAT
	}
	if wantCommit := limiter.StepBatch(op, nowUS, want); commit != wantCommit {
		c.t.Fatalf("%s reported written %v, StepBatch says %v", op, commit, wantCommit)
	}
	after := c.tats(buckets...)
	outs := make([]limiter.Outcome, len(batch))
	for i, b := range batch {
		if b.Next != want[i].Next || b.Outcome != want[i].Outcome {
			c.t.Fatalf("%s of %s reported TAT %d and %+v, StepBatch says %d and %+v", op, b.Key, b.Next, b.Outcome, want[i].Next, want[i].Outcome)
		}
		if w := c.full(b.Next); after[i] != w {
			c.t.Fatalf("%s of %s (cost %d, reserved %d, rate %+v) at %d: store holds TAT %d, the Go step says %d", op, b.Key, b.Cost, b.Reserved, b.Rate, nowUS, after[i], w)
		}
		outs[i] = b.Outcome
	}
	return outs
}

func bucket(key string, p limiter.Params, cost int64) limiter.Bucket {
	return limiter.Bucket{Key: []byte(key), Rate: p.Rate(), Cost: cost}
}

// settled is a bucket of a settle that reserved one amount and used another.
func settled(key string, p limiter.Params, reserved, actual int64) limiter.Bucket {
	return limiter.Bucket{Key: []byte(key), Rate: p.Rate(), Cost: actual, Reserved: reserved}
}

func expect(t *testing.T, what string, got limiter.Outcome, want limiter.Outcome) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %+v, want %+v", what, got, want)
	}
}

const ms = time.Millisecond

// testGCRAStory is Boulder's worked example: 20 requests per second with a
// burst of 20, so one token comes back every 50 ms.
func testGCRAStory(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 20, Count: 20, Period: time.Second}
	b := bucket("1:story", p, 1)

	// The first request leaves 19 and the bucket is full again 50 ms later.
	expect(t, "first request", c.spend(b)[0], limiter.Outcome{Allowed: true, Remaining: 19, ResetAfter: 50 * ms})
	// The burst allows 19 more at the same instant; the last leaves none.
	for i := 18; i >= 0; i-- {
		expect(t, fmt.Sprintf("request %d", 20-i), c.spend(b)[0],
			limiter.Outcome{Allowed: true, Remaining: int64(i), ResetAfter: time.Duration(20-i) * 50 * ms})
	}
	// The 21st inside the same 50 ms is denied, and told when to retry.
	expect(t, "21st request", c.spend(b)[0],
		limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 50 * ms, ResetAfter: time.Second})
	c.advance(30 * ms)
	expect(t, "30 ms later", c.spend(b)[0],
		limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 20 * ms, ResetAfter: 970 * ms})
	// Then one request per 50 ms is allowed, and a second one is not.
	c.advance(20 * ms)
	for round := 0; round < 10; round++ {
		expect(t, fmt.Sprintf("round %d", round), c.spend(b)[0], limiter.Outcome{Allowed: true, ResetAfter: time.Second})
		expect(t, fmt.Sprintf("round %d again", round), c.spend(b)[0],
			limiter.Outcome{Reason: limiter.ReasonLimited, RetryAfter: 50 * ms, ResetAfter: time.Second})
		c.advance(50 * ms)
	}
	// A second after the last spend, the bucket is full.
	c.advance(time.Second)
	expect(t, "after a second", c.spend(bucket(string(b.Key), p, 0))[0], limiter.Outcome{Allowed: true, Remaining: 20})
}

func testCostZeroInspects(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 10, Count: 10, Period: time.Second}
	expect(t, "inspect an unknown bucket", c.spend(bucket("1:zero", p, 0))[0], limiter.Outcome{Allowed: true, Remaining: 10})
	if got := c.tats(bucket("1:zero", p, 0))[0]; got != 0 {
		t.Fatalf("cost 0 wrote TAT %d", got)
	}
	c.spend(bucket("1:zero", p, 4))
	expect(t, "inspect after spending 4", c.spend(bucket("1:zero", p, 0))[0], limiter.Outcome{Allowed: true, Remaining: 6, ResetAfter: 400 * ms})
	c.spend(bucket("1:zero", p, 6))
	expect(t, "inspect an empty bucket", c.spend(bucket("1:zero", p, 0))[0], limiter.Outcome{Allowed: true, ResetAfter: time.Second})
}

func testCostExceedsBurst(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 5, Count: 5, Period: time.Second}
	expect(t, "cost 6 of burst 5", c.spend(bucket("1:big", p, 6))[0],
		limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, Remaining: 5, RetryAfter: limiter.Never})
	expect(t, "cost 5 of burst 5", c.spend(bucket("1:big", p, 5))[0], limiter.Outcome{Allowed: true, ResetAfter: time.Second})
	expect(t, "a huge cost", c.spend(bucket("1:big", p, 1<<62))[0],
		limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, RetryAfter: limiter.Never, ResetAfter: time.Second})
}

func testBurstZeroBlocks(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 0, Count: 1, Period: time.Second}
	expect(t, "cost 1 on a blocked bucket", c.spend(bucket("1:blocked", p, 1))[0],
		limiter.Outcome{Reason: limiter.ReasonBlocked, RetryAfter: limiter.Never})
	expect(t, "cost 0 on a blocked bucket", c.spend(bucket("1:blocked", p, 0))[0], limiter.Outcome{Allowed: true})
}

func testRefund(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 10, Count: 10, Period: time.Second}
	c.spend(bucket("1:refund", p, 5))
	expect(t, "refund 3 of 5", c.refund(bucket("1:refund", p, 3))[0], limiter.Outcome{Allowed: true, Remaining: 8, ResetAfter: 200 * ms})
	expect(t, "refund past full", c.refund(bucket("1:refund", p, 100))[0], limiter.Outcome{Allowed: true, Remaining: 10})
	expect(t, "refund a full bucket", c.refund(bucket("1:refund", p, 1))[0], limiter.Outcome{Remaining: 10})
	expect(t, "refund an unknown bucket", c.refund(bucket("1:never", p, 1))[0], limiter.Outcome{Remaining: 10})
	c.spend(bucket("1:refund", p, 10))
	c.advance(250 * ms)
	expect(t, "refund after a partial refill", c.refund(bucket("1:refund", p, 1<<62))[0], limiter.Outcome{Allowed: true, Remaining: 10})
}

// testSettle: a settle gives back what was reserved and not used, charges
// the excess into debt, which denies spends and checks until it is paid,
// and stops at one burst of debt.
func testSettle(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 10, Count: 10, Period: time.Second}
	c.spend(bucket("1:settle", p, 5))
	expect(t, "reserved 5, used 2", c.settle(settled("1:settle", p, 5, 2))[0],
		limiter.Outcome{Allowed: true, Remaining: 8, ResetAfter: 200 * ms})
	expect(t, "used 15 more than reserved", c.settle(settled("1:settle", p, 0, 15))[0],
		limiter.Outcome{Allowed: true, Debt: 7, ResetAfter: 1700 * ms})
	at, ok := h.Expiry(t, "1:settle")
	if full := c.now.Add(1700 * ms).Add(h.ExpiryMargin); !ok || at.Before(full.Add(-ms)) || at.After(full.Add(time.Second)) {
		t.Fatalf("a bucket in debt expires at %v (held: %v), want %v", at, ok, full)
	}
	expect(t, "a spend in debt", c.spend(bucket("1:settle", p, 1))[0],
		limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 7, RetryAfter: 800 * ms, ResetAfter: 1700 * ms})
	expect(t, "a check in debt", c.spend(bucket("1:settle", p, 0))[0],
		limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 7, RetryAfter: 700 * ms, ResetAfter: 1700 * ms})
	expect(t, "a huge excess is capped at one burst of debt", c.settle(settled("1:settle", p, 0, 1<<62))[0],
		limiter.Outcome{Allowed: true, Capped: true, Debt: 10, ResetAfter: 2 * time.Second})
	expect(t, "at the cap nothing more is charged", c.settle(settled("1:settle", p, 3, 4))[0],
		limiter.Outcome{Allowed: true, Capped: true, Debt: 10, ResetAfter: 2 * time.Second})
	c.advance(500 * ms)
	expect(t, "the debt is paid over time", c.spend(bucket("1:settle", p, 0))[0],
		limiter.Outcome{Reason: limiter.ReasonLimited, Debt: 5, RetryAfter: 500 * ms, ResetAfter: 1500 * ms})
	expect(t, "a huge reservation gives everything back", c.settle(settled("1:settle", p, 1<<62, 0))[0],
		limiter.Outcome{Allowed: true, Remaining: 10})
	expect(t, "a settle of a full bucket that used less", c.settle(settled("1:settle", p, 2, 1))[0],
		limiter.Outcome{Allowed: true, Remaining: 10})
	expect(t, "a settle that used what it reserved", c.settle(settled("1:unknown", p, 4, 4))[0],
		limiter.Outcome{Allowed: true, Remaining: 10})
	blocked := limiter.Params{Burst: 0, Count: 1, Period: time.Second}
	expect(t, "a blocked bucket", c.settle(settled("1:blocked", blocked, 0, 5))[0],
		limiter.Outcome{Reason: limiter.ReasonBlocked, RetryAfter: limiter.Never})
}

// testSettleBatch: a settle applies every bucket of its batch, shadow ones
// too, whatever the others do.
func testSettleBatch(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 4, Count: 4, Period: time.Hour}
	c.spend(bucket("1:pair", p, 4), bucket("2:pair", p, 1))
	shadow := settled("2:pair", p, 1, 6)
	shadow.Shadow = true
	outs := c.settle(settled("1:pair", p, 4, 1), shadow)
	expect(t, "the bucket given back 3", outs[0], limiter.Outcome{Allowed: true, Remaining: 3, ResetAfter: 15 * time.Minute})
	expect(t, "the shadow bucket charged 5", outs[1], limiter.Outcome{Allowed: true, Debt: 2, ResetAfter: 90 * time.Minute})
}

// testConcurrentSettles: settles of the same bucket at once each charge
// their whole excess, as they would one after the other.
func testConcurrentSettles(t *testing.T, h Harness) {
	p := limiter.Params{Burst: 1000, Count: 1, Period: time.Hour}
	start := time.Now()
	run(t, 32, 20, func() error {
		_, err := h.Store.Apply(context.Background(), limiter.Settle, start, []limiter.Bucket{settled("1:settles", p, 1, 2)})
		return err
	})
	b := []limiter.Bucket{bucket("1:settles", p, 0)}
	if _, err := h.Store.Apply(context.Background(), limiter.Check, start, b); err != nil {
		t.Fatal(err)
	}
	if got, want := b[0].TAT-start.UnixMicro(), 32*20*p.Rate().Interval; got != want {
		t.Fatalf("640 settles of 1 token each moved the TAT %dµs ahead, want %d", got, want)
	}
}

func testReset(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 3, Count: 3, Period: time.Hour}
	c.spend(bucket("1:reset", p, 3), bucket("2:reset", p, 3))
	if err := h.Store.Reset(context.Background(), []string{"1:reset", "2:reset", "3:absent"}); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if got := c.tats(bucket("1:reset", p, 0), bucket("2:reset", p, 0)); got[0] != 0 || got[1] != 0 {
		t.Fatalf("after Reset the TATs are %v, want none", got)
	}
	expect(t, "spend after reset", c.spend(bucket("1:reset", p, 1))[0], limiter.Outcome{Allowed: true, Remaining: 2, ResetAfter: 20 * time.Minute})
}

func testBatchAllOrNothing(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 2, Count: 2, Period: time.Hour}
	var batch []limiter.Bucket
	for i := range 10 {
		batch = append(batch, bucket(fmt.Sprintf("%d:batch", i+1), p, 1))
	}
	c.spend(batch[9:]...) // the last bucket has one token left
	c.spend(batch[9:]...) // and now none
	// The buckets that allow their cost report what they hold, since the
	// batch spends nothing.
	outs := c.spend(batch...)
	for i, o := range outs[:9] {
		expect(t, fmt.Sprintf("bucket %d of the denied batch", i), o, limiter.Outcome{Allowed: true, Remaining: 2})
	}
	if outs[9].Allowed {
		t.Fatalf("the empty bucket was allowed: %+v", outs[9])
	}
	// c.spend checked that nothing was written; the others are still full.
	if got := c.tats(batch[:9]...); got[0] != 0 || got[8] != 0 {
		t.Fatalf("a denied batch spent: %v", got)
	}
	outs = c.spend(batch[:9]...)
	if !outs[0].Allowed || !outs[8].Allowed {
		t.Fatalf("a batch of buckets with room was denied: %+v", outs)
	}
}

func testShadow(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	real, shadow := bucket("1:real", p, 1), bucket("2:shadow", p, 1)
	shadow.Shadow = true
	c.spend(shadow)
	// An empty shadow bucket does not stop the batch, and is not spent.
	outs := c.spend(real, shadow)
	if !outs[0].Allowed || outs[1].Allowed {
		t.Fatalf("real then empty shadow: %+v", outs)
	}
	// An empty real bucket stops the batch: the shadow bucket is not spent.
	c.refund(bucket(string(shadow.Key), p, 1))
	outs = c.spend(real, shadow)
	if outs[0].Allowed || !outs[1].Allowed {
		t.Fatalf("empty real then shadow: %+v", outs)
	}
}

func testExpiry(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 10, Count: 10, Period: 10 * time.Second}
	c.spend(bucket("1:expiry", p, 3))
	at, ok := h.Expiry(t, "1:expiry")
	if !ok {
		t.Fatal("a spent bucket is not held")
	}
	full := c.now.Add(3 * time.Second)
	if at.Before(full.Add(h.ExpiryMargin-ms)) || at.After(full.Add(h.ExpiryMargin+time.Second)) {
		t.Fatalf("the key expires at %v, want between %v and %v", at, full.Add(h.ExpiryMargin-ms), full.Add(h.ExpiryMargin+time.Second))
	}
	c.refund(bucket("1:expiry", p, 2))
	at, _ = h.Expiry(t, "1:expiry")
	full = c.now.Add(time.Second)
	if at.Before(full.Add(h.ExpiryMargin-ms)) || at.After(full.Add(h.ExpiryMargin+time.Second)) {
		t.Fatalf("after a refund the key expires at %v, want between %v and %v", at, full.Add(h.ExpiryMargin-ms), full.Add(h.ExpiryMargin+time.Second))
	}
	c.refund(bucket("1:expiry", p, 1))
	if _, ok := h.Expiry(t, "1:expiry"); ok {
		t.Fatal("a bucket refunded to full is still held")
	}
	c.spend(bucket("1:denied", p, 10))
	c.spend(bucket("1:denied", p, 1))
	if at, _ := h.Expiry(t, "1:denied"); at.After(c.now.Add(10*time.Second + h.ExpiryMargin + time.Second)) {
		t.Fatalf("a denial moved the expiry to %v", at)
	}
}

func testKeysDoNotCollide(t *testing.T, h Harness) {
	c := newChecker(t, h)
	p := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	c.spend(bucket("1:same", p, 1))
	for _, key := range []string{"2:same", "11:same", "1:same2", "1:Same"} {
		if o := c.spend(bucket(key, p, 1))[0]; !o.Allowed {
			t.Fatalf("%s shares a bucket with 1:same: %+v", key, o)
		}
	}
}

// testOddRates checks that the Lua and Go arithmetic agree where it is
// easiest to get wrong: intervals that do not divide a second, and TATs
// close to the 100-year bound.
func testOddRates(t *testing.T, h Harness) {
	c := newChecker(t, h)
	rates := []limiter.Params{
		{Burst: 7, Count: 3, Period: time.Second},
		{Burst: 1, Count: 7, Period: 1000 * time.Hour},
		{Burst: 1000, Count: 1_000_000, Period: time.Second},
		{Burst: 1, Count: 1, Period: 99 * 365 * 24 * time.Hour},
		{Burst: 3_000_000, Count: 1, Period: 24 * time.Hour * 365 * 100 / 3_000_001},
	}
	for i, p := range rates {
		if fe := p.Validate(false); len(fe) > 0 {
			t.Fatalf("rate %d is invalid: %v", i, fe)
		}
		key := fmt.Sprintf("%d:odd", i+1)
		for step := range 5 {
			c.spend(bucket(key, p, int64(step%3)))
			c.advance(time.Duration(step) * 37 * ms)
		}
		c.refund(bucket(key, p, 2))
	}
}

// testConcurrentSpends: 64 goroutines making 50 spends each against a burst
// of 100 that refills once an hour admit exactly 100.
func testConcurrentSpends(t *testing.T, h Harness) {
	p := limiter.Params{Burst: 100, Count: 1, Period: time.Hour}
	var allowed atomic.Int64
	run(t, 64, 50, func() error {
		b := []limiter.Bucket{bucket("1:race", p, 1)}
		written, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), b)
		if written != b[0].Outcome.Allowed {
			return fmt.Errorf("a spend reported written %v and %+v", written, b[0].Outcome)
		}
		if written {
			allowed.Add(1)
		}
		return err
	})
	if got := allowed.Load(); got != 100 {
		t.Fatalf("64x50 concurrent spends against a burst of 100 admitted %d", got)
	}
}

// testConcurrentBatches: batches of two buckets, never more than the limit,
// and each bucket holds exactly the tokens of the batches admitted.
func testConcurrentBatches(t *testing.T, h Harness) {
	p := limiter.Params{Burst: 50, Count: 1, Period: time.Hour}
	var allowed atomic.Int64
	run(t, 32, 20, func() error {
		b := []limiter.Bucket{bucket("1:pair", p, 1), bucket("2:pair", p, 1)}
		written, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), b)
		if written {
			allowed.Add(1)
		}
		return err
	})
	got := allowed.Load()
	if got > 50 || h.ExactBatches && got != 50 {
		t.Fatalf("concurrent batches against a burst of 50 admitted %d (exact: %v)", got, h.ExactBatches)
	}
	b := []limiter.Bucket{bucket("1:pair", p, 0), bucket("2:pair", p, 0)}
	if _, err := h.Store.Apply(context.Background(), limiter.Check, time.Now(), b); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	for _, x := range b {
		// Tokens held = how far the TAT runs ahead, rounded up: less than
		// a second has refilled of an hour's interval.
		held := (x.TAT - now + x.Rate.Interval - 1) / x.Rate.Interval
		if held != got {
			t.Fatalf("%s holds %d tokens after %d admitted batches", x.Key, held, got)
		}
	}
}

// testConcurrentDeniedBatches: spends of one bucket race batches that hold
// it beside an empty bucket, which are all denied; the spends alone admit
// exactly the burst (at most, where batches are not exact), and the bucket
// holds exactly the tokens of those admitted. A store that runs many
// calls' batches together, as Redis does, must keep each denied batch from
// writing its allowed bucket.
func testConcurrentDeniedBatches(t *testing.T, h Harness) {
	p := limiter.Params{Burst: 40, Count: 1, Period: time.Hour}
	empty := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	if _, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), []limiter.Bucket{bucket("1:empty", empty, 1)}); err != nil {
		t.Fatal(err)
	}
	var allowed, turn atomic.Int64
	run(t, 32, 20, func() error {
		if turn.Add(1)%2 == 0 {
			b := []limiter.Bucket{bucket("2:shared", p, 1), bucket("1:empty", empty, 1)}
			written, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), b)
			if written {
				return fmt.Errorf("a batch with an empty bucket was written: %+v", b)
			}
			return err
		}
		b := []limiter.Bucket{bucket("2:shared", p, 1)}
		written, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), b)
		if written {
			allowed.Add(1)
		}
		return err
	})
	got := allowed.Load()
	if got > p.Burst || h.ExactBatches && got != p.Burst {
		t.Fatalf("spends racing denied batches against a burst of %d admitted %d (exact: %v)", p.Burst, got, h.ExactBatches)
	}
	b := []limiter.Bucket{bucket("2:shared", p, 0)}
	if _, err := h.Store.Apply(context.Background(), limiter.Check, time.Now(), b); err != nil {
		t.Fatal(err)
	}
	if held := (b[0].TAT - time.Now().UnixMicro() + p.Rate().Interval - 1) / p.Rate().Interval; held != got {
		t.Fatalf("2:shared holds %d tokens after %d admitted spends", held, got)
	}
}

func run(t *testing.T, workers, each int, f func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
