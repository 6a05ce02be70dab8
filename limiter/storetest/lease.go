package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// leaseChecker drives a store's leases with a fake clock and checks every
// call against a model of what the buckets hold: an acquire must read
// what the model holds, decide as limiter.LeaseStep does on that, and
// leave the buckets as the model says; a release or renewal must find
// exactly the live leases.
type leaseChecker struct {
	t   *testing.T
	h   Harness
	now time.Time
	// buckets holds each bucket's leases by id, expired ones too until an
	// acquire on the bucket drops them, as the stores do.
	buckets map[string]map[string]modelLease
	// records holds the record of every lease acquired, until released.
	records map[string]limiter.LeaseRecord
}

type modelLease struct{ cost, expires int64 }

func newLeaseChecker(t *testing.T, h Harness) *leaseChecker {
	return &leaseChecker{t: t, h: h, now: time.Now().Truncate(time.Millisecond),
		buckets: map[string]map[string]modelLease{}, records: map[string]limiter.LeaseRecord{}}
}

func (c *leaseChecker) advance(d time.Duration) { c.now = c.now.Add(d) }

// read returns what the model's bucket holds at now, as LeaseBucket has it,
// and how many of its leases have expired.
func (c *leaseChecker) read(key string) (held, earliest, latest, expired int64) {
	nowUS := c.now.UnixMicro()
	for _, l := range c.buckets[key] {
		if l.expires <= nowUS {
			expired++
			continue
		}
		held += l.cost
		if earliest == 0 || l.expires < earliest {
			earliest = l.expires
		}
		latest = max(latest, l.expires)
	}
	return held, earliest, latest, expired
}

// verify checks that Held reads every bucket the checker has used as the
// model holds it.
func (c *leaseChecker) verify(what string) {
	c.t.Helper()
	var batch []limiter.LeaseBucket
	for key := range c.buckets {
		batch = append(batch, limiter.LeaseBucket{Key: []byte(key)})
	}
	if err := c.h.Store.Held(context.Background(), c.now, batch); err != nil {
		c.t.Fatalf("held after %s: %v", what, err)
	}
	for _, b := range batch {
		held, earliest, latest, _ := c.read(string(b.Key))
		if b.Held != held || b.Earliest != earliest || b.Latest != latest {
			c.t.Fatalf("after %s %s holds %d (earliest %d, latest %d), want %d (%d, %d)", what, b.Key, b.Held, b.Earliest, b.Latest, held, earliest, latest)
		}
	}
}

// lease returns a bucket of a lease of cost.
func lease(key string, burst, cost int64) limiter.LeaseBucket {
	return limiter.LeaseBucket{Key: []byte(key), Burst: burst, Cost: cost}
}

// acquire acquires a lease of ttl on the buckets and returns its id, ""
// when it was denied, and the buckets' outcomes.
func (c *leaseChecker) acquire(ttl time.Duration, buckets ...limiter.LeaseBucket) (string, []limiter.Outcome) {
	c.t.Helper()
	nowUS := c.now.UnixMicro()
	rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: c.now.Add(ttl).UnixMicro(), MaxTTL: 2 * ttl}
	want := slices.Clone(buckets)
	for i := range want {
		key := string(want[i].Key)
		want[i].Held, want[i].Earliest, want[i].Latest, want[i].Expired = c.read(key)
		for id, l := range c.buckets[key] {
			if l.expires <= nowUS {
				delete(c.buckets[key], id)
			}
		}
	}
	wantOK := limiter.LeaseStep(nowUS, rec.Expires, want)
	batch := slices.Clone(buckets)
	ok, err := c.h.Store.Acquire(context.Background(), c.now, &rec, batch)
	if err != nil {
		c.t.Fatalf("acquire: %v", err)
	}
	if ok != wantOK {
		c.t.Fatalf("acquire reported %v, LeaseStep says %v", ok, wantOK)
	}
	outs := make([]limiter.Outcome, len(batch))
	var keys []string
	var costs []int64
	for i, b := range batch {
		w := want[i]
		if b.Held != w.Held || b.Earliest != w.Earliest || b.Latest != w.Latest || b.Expired != w.Expired || b.Outcome != w.Outcome {
			c.t.Fatalf("acquire of %s read held %d, earliest %d, latest %d, expired %d and decided %+v; want %d, %d, %d, %d and %+v",
				b.Key, b.Held, b.Earliest, b.Latest, b.Expired, b.Outcome, w.Held, w.Earliest, w.Latest, w.Expired, w.Outcome)
		}
		outs[i] = b.Outcome
		if ok && w.Takes() {
			key := string(w.Key)
			if c.buckets[key] == nil {
				c.buckets[key] = map[string]modelLease{}
			}
			c.buckets[key][rec.ID] = modelLease{cost: w.Cost, expires: rec.Expires}
			keys, costs = append(keys, key), append(costs, w.Cost)
		}
	}
	for _, b := range buckets {
		// A bucket that holds nothing is still read by verify.
		if c.buckets[string(b.Key)] == nil {
			c.buckets[string(b.Key)] = map[string]modelLease{}
		}
	}
	c.verify("an acquire")
	if !ok {
		return "", outs
	}
	if !slices.Equal(rec.Keys, keys) || !slices.Equal(rec.Costs, costs) {
		c.t.Fatalf("the record holds %v of %v, want %v of %v", rec.Costs, rec.Keys, costs, keys)
	}
	c.records[rec.ID] = rec
	return rec.ID, outs
}

// expire calls Expire on the buckets at keys and checks that it drops, and
// counts, exactly the leases of each that the model has expired.
func (c *leaseChecker) expire(keys ...string) []int64 {
	c.t.Helper()
	nowUS := c.now.UnixMicro()
	want := make([]int64, len(keys))
	for i, key := range keys {
		for id, l := range c.buckets[key] {
			if l.expires <= nowUS {
				delete(c.buckets[key], id)
				want[i]++
			}
		}
	}
	got, err := c.h.Store.Expire(context.Background(), c.now, keys)
	if err != nil {
		c.t.Fatalf("expire: %v", err)
	}
	if !slices.Equal(got, want) {
		c.t.Fatalf("expire of %v dropped %v, want %v", keys, got, want)
	}
	c.verify("an expire")
	return got
}

// live returns the record of lease id if it is live at now.
func (c *leaseChecker) live(id string) (limiter.LeaseRecord, bool) {
	rec, ok := c.records[id]
	return rec, ok && rec.Expires > c.now.UnixMicro()
}

// sameRecord fails the test unless the store returned the record the
// model holds.
func (c *leaseChecker) sameRecord(what string, got, want limiter.LeaseRecord) {
	c.t.Helper()
	if got.ID != want.ID || got.Expires != want.Expires || got.MaxTTL != want.MaxTTL || !slices.Equal(got.Keys, want.Keys) || !slices.Equal(got.Costs, want.Costs) {
		c.t.Fatalf("%s returned the record %+v, want %+v", what, got, want)
	}
}

// release releases lease id and reports whether the store found it live.
func (c *leaseChecker) release(id string) bool {
	c.t.Helper()
	want, live := c.live(id)
	got, err := c.h.Store.Release(context.Background(), c.now, id)
	switch {
	case !live && !errors.Is(err, limiter.ErrLeaseNotFound):
		c.t.Fatalf("release of a lease that is not live: %+v, %v", got, err)
	case live && err != nil:
		c.t.Fatalf("release: %v", err)
	}
	delete(c.records, id)
	if !live {
		c.verify("a release not found")
		return false
	}
	c.sameRecord("release", got, want)
	for _, key := range want.Keys {
		delete(c.buckets[key], id)
	}
	c.verify("a release")
	return true
}

// renew renews lease id for ttl from now and reports whether the store
// found it live.
func (c *leaseChecker) renew(id string, ttl time.Duration) bool {
	c.t.Helper()
	want, live := c.live(id)
	until := c.now.Add(ttl).UnixMicro()
	got, err := c.h.Store.Renew(context.Background(), c.now, id, func(rec limiter.LeaseRecord) (int64, error) {
		c.sameRecord("renew", rec, want)
		return until, nil
	})
	switch {
	case !live && !errors.Is(err, limiter.ErrLeaseNotFound):
		c.t.Fatalf("renewal of a lease that is not live: %+v, %v", got, err)
	case live && err != nil:
		c.t.Fatalf("renew: %v", err)
	}
	if !live {
		c.verify("a renewal not found")
		return false
	}
	c.sameRecord("renew", got, want)
	nowUS := c.now.UnixMicro()
	for _, key := range want.Keys {
		if l, ok := c.buckets[key][id]; ok && l.expires > nowUS {
			c.buckets[key][id] = modelLease{cost: l.cost, expires: until}
		}
	}
	want.Expires = until
	c.records[id] = want
	c.verify("a renewal")
	return true
}

// reset resets the buckets.
func (c *leaseChecker) reset(keys ...string) {
	c.t.Helper()
	if err := c.h.Store.Reset(context.Background(), keys); err != nil {
		c.t.Fatalf("reset: %v", err)
	}
	for _, k := range keys {
		clear(c.buckets[k])
	}
	c.verify("a reset")
}

// testLeaseStory: a bucket of 3 units, filled, denied with the time until
// its earliest lease ends, freed by a release and by expiry, its leases
// renewed.
func testLeaseStory(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	const key = "1:calls"
	a, outs := c.acquire(30*time.Second, lease(key, 3, 2))
	expect(t, "the first lease", outs[0], limiter.Outcome{Allowed: true, Held: 2, Remaining: 1, ResetAfter: 30 * time.Second})
	b, outs := c.acquire(20*time.Second, lease(key, 3, 1))
	expect(t, "the lease that fills the bucket", outs[0], limiter.Outcome{Allowed: true, Held: 3, ResetAfter: 30 * time.Second})
	denied, outs := c.acquire(10*time.Second, lease(key, 3, 1))
	if denied != "" {
		t.Fatal("a full bucket granted a lease")
	}
	expect(t, "a lease of a full bucket", outs[0], limiter.Outcome{Reason: limiter.ReasonLimited, Held: 3, RetryAfter: 20 * time.Second, ResetAfter: 30 * time.Second})

	c.advance(5 * time.Second)
	if !c.release(b) {
		t.Fatal("the release of a live lease found nothing")
	}
	if c.release(b) {
		t.Fatal("a second release found the lease")
	}
	if c.renew(b, time.Second) {
		t.Fatal("a released lease was renewed")
	}
	cc, outs := c.acquire(10*time.Second, lease(key, 3, 1))
	expect(t, "a lease after a release", outs[0], limiter.Outcome{Allowed: true, Held: 3, ResetAfter: 25 * time.Second})
	if !c.renew(a, 30*time.Second) {
		t.Fatal("a live lease could not be renewed")
	}

	// At 16 s, cc has expired, without a release; the acquire drops it.
	c.advance(11 * time.Second)
	d, outs := c.acquire(time.Second, lease(key, 3, 1))
	expect(t, "a lease after another expired", outs[0], limiter.Outcome{Allowed: true, Held: 3, ResetAfter: 19 * time.Second})
	if c.renew(cc, time.Second) || c.release(cc) {
		t.Fatal("an expired lease was found")
	}
	// At 40 s every lease has expired. Held sees none, yet drops none: the
	// next acquire does, and counts them.
	c.advance(24 * time.Second)
	if c.release(a) || c.release(d) {
		t.Fatal("an expired lease was found")
	}
	c.verify("every lease expired")
	c.acquire(time.Minute, lease(key, 3, 3))
}

// testLeaseBatch: a lease of several buckets holds all or none of them.
func testLeaseBatch(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	var batch []limiter.LeaseBucket
	for i := range 10 {
		batch = append(batch, lease(fmt.Sprintf("%d:batch", i+1), 2, 1))
	}
	c.acquire(time.Minute, lease("10:batch", 2, 2))
	id, outs := c.acquire(time.Minute, batch...)
	if id != "" {
		t.Fatal("a batch with a full bucket was granted")
	}
	for i, o := range outs[:9] {
		expect(t, fmt.Sprintf("bucket %d of the denied batch", i+1), o, limiter.Outcome{Allowed: true, Remaining: 2})
	}
	expect(t, "the full bucket", outs[9], limiter.Outcome{Reason: limiter.ReasonLimited, Held: 2, RetryAfter: time.Minute, ResetAfter: time.Minute})
	id, _ = c.acquire(time.Minute, batch[:9]...)
	if id == "" {
		t.Fatal("a batch with room was denied")
	}
	if !c.renew(id, 2*time.Minute) || !c.release(id) {
		t.Fatal("the lease of a batch was not found")
	}
}

// testLeaseShadow: a shadow bucket takes a lease's units only when they
// fit, and never stops the lease.
func testLeaseShadow(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	real, shadow := lease("1:real", 1, 1), lease("2:shadow", 1, 1)
	shadow.Shadow = true
	c.acquire(time.Minute, shadow)
	id, outs := c.acquire(time.Minute, real, shadow)
	if id == "" || !outs[0].Allowed || outs[1].Allowed {
		t.Fatalf("real then full shadow: %+v", outs)
	}
	// The shadow bucket, given room by an override, fits the lease that
	// the full real bucket denies, and takes nothing.
	roomy := lease("2:shadow", 2, 1)
	roomy.Shadow = true
	denied, outs := c.acquire(time.Minute, real, roomy)
	if denied != "" || outs[0].Allowed || !outs[1].Allowed {
		t.Fatalf("full real then shadow with room: %+v", outs)
	}
	c.release(id)
}

// testLeaseNever: a cost above the burst, or any cost on a blocked bucket,
// never fits.
func testLeaseNever(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	_, outs := c.acquire(time.Minute, lease("1:never", 3, 4))
	expect(t, "cost 4 of burst 3", outs[0], limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, RetryAfter: limiter.Never, Remaining: 3})
	_, outs = c.acquire(time.Minute, lease("1:never", 0, 1))
	expect(t, "a blocked bucket", outs[0], limiter.Outcome{Reason: limiter.ReasonBlocked, RetryAfter: limiter.Never})
	c.acquire(time.Minute, lease("1:never", 3, 3))
	_, outs = c.acquire(time.Minute, lease("1:never", 3, 1<<62))
	expect(t, "a huge cost on a full bucket", outs[0], limiter.Outcome{Reason: limiter.ReasonCostExceedsBurst, RetryAfter: limiter.Never, Held: 3, ResetAfter: time.Minute})
}

// testLeaseReset: Reset drops a bucket's leases; their release or renewal
// then changes nothing there.
func testLeaseReset(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	a, _ := c.acquire(time.Minute, lease("1:reset", 2, 2), lease("2:reset", 2, 1))
	c.reset("1:reset", "3:absent")
	if _, outs := c.acquire(time.Minute, lease("1:reset", 2, 2)); !outs[0].Allowed {
		t.Fatalf("a reset bucket is not empty: %+v", outs)
	}
	// verify checks that 1:reset still holds the new lease's 2 units.
	c.renew(a, 2*time.Minute)
	c.release(a)
}

// testLeaseHeldReads: Held reads, and writes nothing: not a bucket it
// does not hold, nor the expired leases it does not count.
func testLeaseHeldReads(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	batch := []limiter.LeaseBucket{lease("1:held", 5, 0), lease("2:held", 5, 0)}
	if err := h.Store.Held(context.Background(), c.now, batch); err != nil {
		t.Fatal(err)
	}
	if batch[0].Held != 0 || batch[0].Earliest != 0 || batch[0].Latest != 0 {
		t.Fatalf("an unknown bucket reads %+v", batch[0])
	}
	if _, ok := h.Expiry(t, "1:held"); ok {
		t.Fatal("Held stored a bucket")
	}
	c.acquire(time.Second, lease("1:held", 5, 2))
	c.acquire(time.Minute, lease("1:held", 5, 1))
	c.advance(2 * time.Second)
	c.verify("the first lease expired")
	// The acquire's check that it dropped 1 expired lease shows that
	// Held dropped none.
	c.acquire(time.Minute, lease("1:held", 5, 1))
}

// testLeaseExpiry: a bucket's key lives until its latest lease ends (plus
// the margin), a record until its lease ends; both go at the last release.
func testLeaseExpiry(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	const key = "1:expiry"
	within := func(what string, at time.Time, held bool, want time.Time) {
		t.Helper()
		want = want.Add(h.ExpiryMargin)
		if !held || at.Before(want.Add(-ms)) || at.After(want.Add(time.Second)) {
			t.Fatalf("%s expires at %v (held: %v), want %v", what, at, held, want)
		}
	}
	long, _ := c.acquire(20*time.Second, lease(key, 5, 1))
	short, _ := c.acquire(10*time.Second, lease(key, 5, 1))
	at, held := h.Expiry(t, key)
	within("the bucket", at, held, c.now.Add(20*time.Second))
	at, held = h.RecordExpiry(t, short)
	within("the short lease's record", at, held, c.now.Add(10*time.Second))
	c.renew(short, 30*time.Second)
	at, held = h.Expiry(t, key)
	within("the bucket after a renewal", at, held, c.now.Add(30*time.Second))
	at, held = h.RecordExpiry(t, short)
	within("the renewed record", at, held, c.now.Add(30*time.Second))
	c.release(short)
	if _, held := h.RecordExpiry(t, short); held {
		t.Fatal("the record of a released lease is still held")
	}
	at, held = h.Expiry(t, key)
	within("the bucket after the latest lease's release", at, held, c.now.Add(20*time.Second))
	c.release(long)
	if _, held := h.Expiry(t, key); held {
		t.Fatal("a bucket without leases is still held")
	}
}

// testLeaseExpire: Expire drops the expired leases of its buckets and
// counts each once, whether it or an acquire drops it first; it leaves
// live, released and renewed leases alone, and a bucket it empties goes.
func testLeaseExpire(t *testing.T, h Harness) {
	c := newLeaseChecker(t, h)
	const a, b, other = "1:expire-a", "1:expire-b", "1:expire-none"
	c.acquire(10*time.Second, lease(a, 5, 1), lease(b, 5, 2))
	c.acquire(10*time.Second, lease(a, 5, 1))
	renewed, _ := c.acquire(10*time.Second, lease(a, 5, 1))
	released, _ := c.acquire(10*time.Second, lease(b, 5, 1))
	c.acquire(30*time.Second, lease(b, 5, 1))
	c.renew(renewed, 20*time.Second)
	c.release(released)
	c.expire(a, b, other) // nothing has expired yet

	c.advance(15 * time.Second)
	// An acquire on b drops its expired lease first; Expire finds none
	// there, and drops a's two.
	c.acquire(time.Minute, lease(b, 5, 1))
	if got := c.expire(a, b, other); got[0] != 2 || got[1] != 0 {
		t.Fatalf("expire dropped %v", got)
	}
	c.expire(a, b) // each lease is dropped once
	c.advance(time.Hour)
	if got := c.expire(a, b); got[0] != 1 || got[1] != 2 {
		t.Fatalf("expire dropped %v after every lease expired", got)
	}
	for _, key := range []string{a, b} {
		if _, held := h.Expiry(t, key); held {
			t.Errorf("the empty bucket %s is still held", key)
		}
	}
}

// testLeaseConcurrentAcquires: leases of one unit each, acquired at once
// on a bucket of 25, hold exactly 25.
func testLeaseConcurrentAcquires(t *testing.T, h Harness) {
	var acquired atomic.Int64
	run(t, 32, 10, func() error {
		rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: time.Now().Add(time.Minute).UnixMicro(), MaxTTL: time.Minute}
		batch := []limiter.LeaseBucket{lease("1:race", 25, 1)}
		ok, err := h.Store.Acquire(context.Background(), time.Now(), &rec, batch)
		if err != nil {
			return err
		}
		if ok != batch[0].Outcome.Allowed {
			return fmt.Errorf("an acquire reported %v and %+v", ok, batch[0].Outcome)
		}
		if ok {
			acquired.Add(1)
		}
		return err
	})
	if got := acquired.Load(); got != 25 {
		t.Fatalf("320 concurrent acquires on a bucket of 25 were granted %d", got)
	}
	heldExactly(t, h, 25, "1:race")
}

// testLeaseConcurrentBatches: leases of two buckets acquired at once never
// hold more than the burst (exactly the burst where batches are exact),
// and when they are all released both buckets are empty again: no lease
// denied across slots kept units.
func testLeaseConcurrentBatches(t *testing.T, h Harness) {
	var mu sync.Mutex
	var ids []string
	run(t, 32, 10, func() error {
		rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: time.Now().Add(time.Minute).UnixMicro(), MaxTTL: time.Minute}
		ok, err := h.Store.Acquire(context.Background(), time.Now(), &rec, []limiter.LeaseBucket{lease("1:pair", 20, 1), lease("2:pair", 20, 1)})
		if ok {
			mu.Lock()
			ids = append(ids, rec.ID)
			mu.Unlock()
		}
		return err
	})
	if got := len(ids); got > 20 || h.ExactBatches && got != 20 {
		t.Fatalf("concurrent leases of two buckets of 20 were granted %d (exact: %v)", got, h.ExactBatches)
	}
	heldExactly(t, h, int64(len(ids)), "1:pair", "2:pair")
	// Each release races a renewal of the same lease: the release always
	// finds it, and the renewal never brings units back.
	var next atomic.Int64
	run(t, len(ids), 1, func() error {
		id := ids[next.Add(1)-1]
		renewed := make(chan error, 1)
		go func() {
			_, err := h.Store.Renew(context.Background(), time.Now(), id, func(limiter.LeaseRecord) (int64, error) {
				return time.Now().Add(2 * time.Minute).UnixMicro(), nil
			})
			if errors.Is(err, limiter.ErrLeaseNotFound) {
				err = nil
			}
			renewed <- err
		}()
		_, err := h.Store.Release(context.Background(), time.Now(), id)
		return errors.Join(err, <-renewed)
	})
	heldExactly(t, h, 0, "1:pair", "2:pair")
}

// heldExactly fails the test unless every bucket holds units.
func heldExactly(t *testing.T, h Harness, units int64, keys ...string) {
	t.Helper()
	batch := make([]limiter.LeaseBucket, len(keys))
	for i, k := range keys {
		batch[i].Key = []byte(k)
	}
	if err := h.Store.Held(context.Background(), time.Now(), batch); err != nil {
		t.Fatal(err)
	}
	for _, b := range batch {
		if b.Held != units {
			t.Fatalf("%s holds %d units, want %d", b.Key, b.Held, units)
		}
	}
}

// quotaBucket is a bucket of a calendar quota of count units whose window
// ends at end: its clock is the window's end (limiter/calendar.go).
func quotaBucket(key string, count, cost int64, end time.Time) limiter.Bucket {
	return limiter.Bucket{Key: []byte(key), Rate: limiter.Rate{Interval: 1, Burst: count}, Cost: cost, Now: end.UnixMicro()}
}

// testQuotaWindow: a quota bucket keeps its usage, and its key, until its
// window ends, however the real time moves within the window, and is full
// in the next.
func testQuotaWindow(t *testing.T, h Harness) {
	c := newChecker(t, h)
	end := c.now.Add(time.Hour)
	expect(t, "3 of 5", c.spend(quotaBucket("1:quota", 5, 3, end))[0], limiter.Outcome{Allowed: true, Remaining: 2, ResetAfter: 3 * time.Microsecond})
	at, held := h.Expiry(t, "1:quota")
	if want := end.Add(h.ExpiryMargin); !held || at.Before(want) || at.After(want.Add(time.Second)) {
		t.Fatalf("the quota's key expires at %v (held: %v), want at its window's end %v and the margin", at, held, end)
	}
	c.advance(50 * time.Minute)
	if outs := c.spend(quotaBucket("1:quota", 5, 3, end)); outs[0].Allowed {
		t.Fatalf("50 minutes on, 3 more of 5 were allowed: %+v", outs[0])
	}
	expect(t, "the last 2 of 5", c.spend(quotaBucket("1:quota", 5, 2, end))[0], limiter.Outcome{Allowed: true, ResetAfter: 5 * time.Microsecond})
	next := end.Add(time.Hour)
	expect(t, "5 in the next window", c.spend(quotaBucket("1:quota", 5, 5, next))[0], limiter.Outcome{Allowed: true, ResetAfter: 5 * time.Microsecond})
}

// testQuotaConcurrentSpends: concurrent spends of one unit on a quota admit
// exactly as many as its count allows.
func testQuotaConcurrentSpends(t *testing.T, h Harness) {
	end := time.Now().Add(time.Hour)
	for _, count := range []int64{50, 500} {
		key := fmt.Sprintf("1:quota%d", count)
		var allowed atomic.Int64
		run(t, 20, 10, func() error {
			b := []limiter.Bucket{quotaBucket(key, count, 1, end)}
			ok, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), b)
			if ok {
				allowed.Add(1)
			}
			return err
		})
		if got, want := allowed.Load(), min(200, count); got != want {
			t.Fatalf("200 concurrent spends on a quota of %d admitted %d, want %d", count, got, want)
		}
	}
}
