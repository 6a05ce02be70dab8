package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
)

func calls(name string, enum int, burst int64, period time.Duration) limiter.Limit {
	return limiter.Limit{Name: name, Enum: enum, IDFormat: limiter.String, Kind: limiter.KindConcurrency,
		Params: limiter.Params{Burst: burst, Count: burst, Period: period}}
}

func TestLeaseStory(t *testing.T) {
	snap := build(t, []limiter.Limit{calls("Calls", 130, 3, 30*time.Second), calls("Jobs", 131, 10, time.Minute), orders()})
	f := newFixture(t, limiter.Config{}, snap)
	ctx := context.Background()
	acquire := func(ttl time.Duration, reqs ...limiter.Request) limiter.LeaseResult {
		t.Helper()
		res, err := f.l.Acquire(ctx, reqs, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := acquire(0, req("Calls", "a", 2), req("Jobs", "a", 1))
	if first.Lease == nil || !first.Lease.Expires.Equal(t0.Add(30*time.Second)) || first.Decisions[0].Held != 2 || first.Decisions[0].Remaining != 1 {
		t.Fatalf("first: %+v", first)
	}
	f.now = t0.Add(10 * time.Second)
	// All or nothing: Calls has 1 left, so Jobs takes nothing either.
	denied := acquire(0, req("Jobs", "a", 1), req("Calls", "a", 2))
	if denied.Allowed || denied.Lease != nil || denied.RetryAfter != 20*time.Second || denied.Decisions[0].Held != 1 || denied.Decisions[1].Held != 2 {
		t.Fatalf("denied: %+v", denied)
	}
	if res := f.decide(t, limiter.Check, req("Calls", "a", 0), req("Jobs", "a", 0)); res.Decisions[0].Held != 2 || res.Decisions[1].Held != 1 {
		t.Fatalf("check: %+v", res.Decisions)
	}
	if _, err := f.l.Decide(ctx, limiter.Spend, []limiter.Request{req("Calls", "a", 1)}, nil); !isField(err, "buckets[0].limit") {
		t.Fatalf("spend on a concurrency limit: %v", err)
	}
	if _, err := f.l.Acquire(ctx, []limiter.Request{req("NewOrdersPerAccount", "1", 1)}, 0); !isField(err, "buckets[0].limit") {
		t.Fatalf("acquire on a rate limit: %v", err)
	}
	if _, err := f.l.Acquire(ctx, []limiter.Request{req("Calls", "a", 1), req("Jobs", "a", 1)}, 31*time.Second); !isField(err, "ttl_ms") {
		t.Fatalf("ttl above the shortest period: %v", err)
	}
	// Renewed, the lease outlives its first expiry.
	renewed, err := f.l.Renew(ctx, first.Lease.ID, 0)
	if err != nil || !renewed.Expires.Equal(f.now.Add(30*time.Second)) {
		t.Fatalf("renew: %+v %v", renewed, err)
	}
	f.now = t0.Add(35 * time.Second)
	if res := f.decide(t, limiter.Check, req("Calls", "a", 0)); res.Decisions[0].Held != 2 {
		t.Fatalf("after the first expiry: %+v", res.Decisions)
	}
	if ok, err := f.l.Release(ctx, first.Lease.ID); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if ok, err := f.l.Release(ctx, first.Lease.ID); ok || err != nil {
		t.Fatalf("second release: %v %v", ok, err)
	}
	if _, err := f.l.Renew(ctx, first.Lease.ID, 0); !errors.Is(err, limiter.ErrLeaseNotFound) {
		t.Fatalf("renew after release: %v", err)
	}
	// Expiry frees the units without a release.
	second := acquire(time.Second, req("Calls", "a", 3))
	if second.Lease == nil {
		t.Fatalf("second: %+v", second)
	}
	f.now = f.now.Add(time.Second)
	if third := acquire(0, req("Calls", "a", 3)); third.Lease == nil || third.Decisions[0].Held != 3 {
		t.Fatalf("after expiry: %+v", third)
	}
	if _, err := f.l.Renew(ctx, second.Lease.ID, 0); !errors.Is(err, limiter.ErrLeaseNotFound) {
		t.Fatalf("renew of an expired lease: %v", err)
	}
	// Both renewals of a lease the store did not hold are counted: that is
	// where a lease a failover forgot shows.
	if n := f.l.Stats().RenewalsNotFound; n != 2 {
		t.Errorf("RenewalsNotFound = %d, want 2", n)
	}
}

// TestLeaseCheckDeniesTheBatch: a check that a full concurrency bucket
// denies spends nothing, like any denied batch, so the rate bucket beside
// it reports what it holds, not what a spend would have left it.
func TestLeaseCheckDeniesTheBatch(t *testing.T) {
	f := newFixture(t, limiter.Config{}, build(t, []limiter.Limit{calls("Calls", 130, 1, time.Minute), orders()}))
	if res, err := f.l.Acquire(context.Background(), []limiter.Request{req("Calls", "a", 1)}, 0); err != nil || res.Lease == nil {
		t.Fatalf("acquire: %+v %v", res, err)
	}
	res := f.decide(t, limiter.Check, req("NewOrdersPerAccount", "1", 1), req("Calls", "a", 1))
	if res.Allowed || res.Decisions[1].Allowed || res.Decisions[1].Held != 1 {
		t.Fatalf("a check past a full concurrency bucket: %+v", res)
	}
	if d := res.Decisions[0]; !d.Allowed || d.Remaining != 300 || d.ResetAfter != 0 {
		t.Errorf("the rate bucket of the denied check: allowed %v, remaining %d, reset after %v; want allowed, 300, 0 (what it holds)",
			d.Allowed, d.Remaining, d.ResetAfter)
	}
}

func TestLeasesExactUnderConcurrency(t *testing.T) {
	f := newFixture(t, limiter.Config{}, build(t, []limiter.Limit{calls("Calls", 130, 7, time.Minute)}))
	admitted := runConcurrently(100, func() bool {
		res, err := f.l.Acquire(context.Background(), []limiter.Request{req("Calls", "x", 1)}, 0)
		return err == nil && res.Lease != nil
	})
	if admitted != 7 {
		t.Fatalf("admitted %d of 100, want 7", admitted)
	}
}

func TestLeaseIDs(t *testing.T) {
	id := limiter.NewLeaseID()
	if !limiter.ValidLeaseID(id) || limiter.NewLeaseID() == id {
		t.Fatalf("%q", id)
	}
	for _, bad := range []string{"", "lse_", id + "a", id[:len(id)-1], "LSE_" + id[4:], id[:len(id)-1] + "1", id[:len(id)-1] + "b", "../../etc/passwd"} {
		if limiter.ValidLeaseID(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}

// isField reports whether err is a validation error naming field.
func isField(err error, field string) bool {
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) {
		return false
	}
	for _, fe := range ve.Fields {
		if fe.Field == field {
			return true
		}
	}
	return false
}

// TestLeaseOfUnlimitedBuckets: a lease that holds nothing, its buckets
// being unlimited, is still a lease: it releases and renews.
func TestLeaseOfUnlimitedBuckets(t *testing.T) {
	snap := build(t, []limiter.Limit{calls("Calls", 130, 1, time.Minute)},
		limiter.Override{Limit: "Calls", BucketID: "vip", Enabled: true, Unlimited: true})
	f := newFixture(t, limiter.Config{}, snap)
	ctx := context.Background()
	res, err := f.l.Acquire(ctx, []limiter.Request{req("Calls", "vip", 1)}, 0)
	if err != nil || res.Lease == nil {
		t.Fatalf("acquire: %+v %v", res, err)
	}
	if _, err := f.l.Renew(ctx, res.Lease.ID, 0); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if ok, err := f.l.Release(ctx, res.Lease.ID); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

// TestAcquireFailModes: an acquire the store cannot answer follows the
// fail mode, as a decision does, whether or not a bucket decided here (a
// blocked one) denies it already: closed, it fails as unavailable;
// open, it is answered degraded, and a blocked bucket still denies, with
// no lease. It is never allowed together with an error.
func TestAcquireFailModes(t *testing.T) {
	snap := build(t, []limiter.Limit{calls("Calls", 130, 3, 30*time.Second)}, limiter.Override{Limit: "Calls", BucketID: "blocked", Enabled: true,
		Params: limiter.Params{Burst: 0, Count: 0, Period: time.Hour}})
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			ms := memstore.New(memstore.Options{})
			t.Cleanup(ms.Close)
			store := &endingStore{Store: ms, err: errDown}
			l := limiter.New(limiter.Config{Store: store, FailOpen: open, Now: func() time.Time { return t0 },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			l.SetSnapshot(snap)
			acquire := func(reqs ...limiter.Request) (limiter.LeaseResult, error) {
				t.Helper()
				res, err := l.Acquire(context.Background(), reqs, 0)
				if err != nil && (res.Allowed || res.Lease != nil) {
					t.Errorf("allowed together with %v: %+v", err, res)
				}
				return res, err
			}

			res, err := acquire(req("Calls", "a", 1))
			switch {
			case !open && !errors.Is(err, limiter.ErrUnavailable):
				t.Errorf("closed, the store down: %+v, %v", res, err)
			case open && (err != nil || !res.Allowed || !res.Degraded || res.Lease == nil):
				t.Errorf("open, the store down: %+v, %v", res, err)
			}

			res, err = acquire(req("Calls", "blocked", 1), req("Calls", "a", 1))
			switch {
			case !open && !errors.Is(err, limiter.ErrUnavailable):
				t.Errorf("closed, a blocked bucket and the store down: %+v, %v", res, err)
			case open && (err != nil || res.Allowed || !res.Degraded || res.Lease != nil || res.RetryAfter != limiter.Never ||
				res.Decisions[0].Reason != limiter.ReasonBlocked || !res.Decisions[1].Allowed):
				t.Errorf("open, a blocked bucket and the store down: %+v, %v", res, err)
			}

			// A blocked bucket alone needs no store: denied, not degraded.
			res, err = acquire(req("Calls", "blocked", 1))
			if err != nil || res.Allowed || res.Degraded || res.Lease != nil {
				t.Errorf("a blocked bucket alone, the store down: %+v, %v", res, err)
			}
		})
	}
}
