package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

func (s *countingStore) ApplyMany(ctx context.Context, now time.Time, batches []limiter.Batch) {
	if err := s.call(); err != nil {
		for i := range batches {
			batches[i].Err = err
		}
		return
	}
	s.Store.ApplyMany(ctx, now, batches)
}

// manySnapshot has rate limits with blocked, small and unlimited
// overrides, a shadow limit and a concurrency limit.
func manySnapshot(t *testing.T) *limiter.Snapshot {
	small := override("NewOrdersPerAccount", "5", 2)
	blocked := override("NewOrdersPerAccount", "666", 0)
	unlimited := limiter.Override{Limit: "NewOrdersPerAccount", BucketID: "9", Enabled: true, Unlimited: true}
	return build(t, []limiter.Limit{orders(), emails(), shadowLimit(), calls("Calls", 130, 3, 30*time.Second)}, small, blocked, unlimited)
}

// single answers c by the single method of its operation.
func single(ctx context.Context, l *limiter.Limiter, c limiter.Call) limiter.Call {
	var err error
	switch c.Op {
	case limiter.Acquire:
		var res limiter.LeaseResult
		res, err = l.Acquire(ctx, c.Requests, c.TTL)
		c.Result, c.Lease = res.Result, res.Lease
	case limiter.Release:
		c.Released, err = l.Release(ctx, c.LeaseID)
	case limiter.Renew:
		var lease limiter.Lease
		if lease, err = l.Renew(ctx, c.LeaseID, c.TTL); err == nil {
			c.Lease = &lease
		}
	default:
		c.Result, err = l.Decide(ctx, c.Op, c.Requests, nil)
	}
	c.Err = err
	return c
}

// sameAnswer describes how two answers to one call differ, "" when they
// do not; lease ids differ by design, so only whether there is a lease
// and when it expires count.
func sameAnswer(a, b limiter.Call) string {
	switch {
	case (a.Err == nil) != (b.Err == nil) || a.Err != nil && a.Err.Error() != b.Err.Error():
		return fmt.Sprintf("error %v, alone %v", a.Err, b.Err)
	case (a.Lease == nil) != (b.Lease == nil) || a.Lease != nil && !a.Lease.Expires.Equal(b.Lease.Expires):
		return fmt.Sprintf("lease %+v, alone %+v", a.Lease, b.Lease)
	case a.Released != b.Released:
		return fmt.Sprintf("released %v, alone %v", a.Released, b.Released)
	case a.Result.Allowed != b.Result.Allowed || a.Result.RetryAfter != b.Result.RetryAfter ||
		a.Result.ResetAfter != b.Result.ResetAfter || a.Result.Degraded != b.Result.Degraded ||
		len(a.Result.Decisions) != len(b.Result.Decisions):
		return fmt.Sprintf("result %+v, alone %+v", a.Result, b.Result)
	}
	for i := range a.Result.Decisions {
		if a.Result.Decisions[i] != b.Result.Decisions[i] {
			return fmt.Sprintf("decision %d: %+v, alone %+v", i, a.Result.Decisions[i], b.Result.Decisions[i])
		}
	}
	return ""
}

// TestDecideManyAsAlone: random requests of every operation, decided
// many at a time, answer exactly as the same requests made one after the
// other through the single methods on a twin Limiter, denied caches on:
// in order, each all or nothing and refused on its own.
func TestDecideManyAsAlone(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 2))
	many := newFixture(t, limiter.Config{DeniedCacheSize: 100}, manySnapshot(t))
	alone := newFixture(t, limiter.Config{DeniedCacheSize: 100}, manySnapshot(t))
	ctx := context.Background()
	bucket := func() limiter.Request {
		ids := map[string][]string{
			"NewOrdersPerAccount": {"1", "01", "5", "666", "9", "abc"},
			"MailsPerAddress":     {"a@example.com"},
			"Shadowed":            {"1"},
			"Nope":                {"1"},
		}
		limit := []string{"NewOrdersPerAccount", "NewOrdersPerAccount", "MailsPerAddress", "Shadowed", "Nope"}[r.IntN(5)]
		return req(limit, ids[limit][r.IntN(len(ids[limit]))], int64(r.IntN(4)))
	}
	// leases[k] are the ids of the k-th lease each twin acquired.
	var leases [][2]string
	for round := range 60 {
		calls := make([]limiter.Call, 1+r.IntN(10))
		for i := range calls {
			c := &calls[i]
			switch n := r.IntN(20); {
			case n < 14:
				c.Op = []limiter.Op{limiter.Check, limiter.Spend, limiter.Spend, limiter.Refund, limiter.Settle}[r.IntN(5)]
				for range 1 + r.IntN(2) {
					b := bucket()
					if c.Op == limiter.Settle {
						b.Reserved = int64(r.IntN(3))
					}
					c.Requests = append(c.Requests, b)
				}
				if c.Op == limiter.Check && r.IntN(3) == 0 {
					c.Requests = append(c.Requests, req("Calls", "a", 0))
				}
			case n < 17:
				c.Op, c.Requests = limiter.Acquire, []limiter.Request{req("Calls", "a", int64(r.IntN(3)))}
				c.TTL = time.Duration(r.IntN(40)) * time.Second
			default:
				c.Op = []limiter.Op{limiter.Release, limiter.Renew}[r.IntN(2)]
				c.LeaseID = "lease?"
				c.TTL = time.Duration(r.IntN(40)) * time.Second
			}
		}
		// Lease ids are the twins' own: a release or renewal names the
		// k-th lease held so far, in each twin its own id.
		alone0 := make([]limiter.Call, len(calls))
		manyCalls := make([]limiter.Call, len(calls))
		k := 0
		if len(leases) > 0 {
			k = r.IntN(len(leases))
		}
		for i, c := range calls {
			if c.LeaseID != "" && len(leases) > 0 {
				c.LeaseID = leases[k][1]
			}
			alone0[i] = single(ctx, alone.l, c)
			if c.LeaseID != "" && len(leases) > 0 {
				c.LeaseID = leases[k][0]
			}
			manyCalls[i] = c
		}
		many.l.DecideMany(ctx, manyCalls, nil)
		for i := range calls {
			if msg := sameAnswer(manyCalls[i], alone0[i]); msg != "" {
				t.Fatalf("seed %d, round %d, call %d (%s %+v): %s", seed, round, i, calls[i].Op, calls[i].Requests, msg)
			}
			if manyCalls[i].Op == limiter.Acquire && manyCalls[i].Lease != nil {
				leases = append(leases, [2]string{manyCalls[i].Lease.ID, alone0[i].Lease.ID})
			}
		}
		step := time.Duration(r.IntN(20)) * time.Minute
		many.now, alone.now = many.now.Add(step), alone.now.Add(step)
	}
}

// TestDecideManyOneStoreCall: the requests of buckets go to the store in
// one call, whatever their number and operations.
func TestDecideManyOneStoreCall(t *testing.T) {
	f := newFixture(t, limiter.Config{}, manySnapshot(t))
	calls := make([]limiter.Call, 64)
	for i := range calls {
		calls[i] = limiter.Call{Op: []limiter.Op{limiter.Spend, limiter.Check, limiter.Refund, limiter.Settle}[i%4],
			Requests: []limiter.Request{req("NewOrdersPerAccount", fmt.Sprint(i+1), 1)}}
	}
	f.l.DecideMany(context.Background(), calls, nil)
	for i, c := range calls {
		if c.Err != nil || c.Op != limiter.Refund && !c.Result.Allowed {
			t.Fatalf("call %d: %+v", i, c)
		}
	}
	if n := f.store.calls.Load(); n != 1 {
		t.Fatalf("64 requests made %d store calls, want 1", n)
	}
}

// TestDecideManyFailsEachAlone: an invalid request is refused on its own,
// with the fields its single method names; a store that fails answers
// each request by the fail mode, as its single method would.
func TestDecideManyFailsEachAlone(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			f := newFixture(t, limiter.Config{FailOpen: open}, manySnapshot(t))
			calls := []limiter.Call{
				{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "1", 1)}},
				{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "1", 1), req("Nope", "1", 1)}},
				{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "666", 1)}},
			}
			f.store.fail.Store(true)
			f.l.DecideMany(context.Background(), calls, nil)
			var ve *limiter.ValidationError
			if !errors.As(calls[1].Err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != "buckets[1].limit" {
				t.Errorf("the invalid request: %v", calls[1].Err)
			}
			if c := calls[2]; c.Err != nil || c.Result.Allowed || c.Result.Degraded {
				t.Errorf("a blocked bucket, which needs no store: %+v", c)
			}
			c := calls[0]
			switch {
			case !open && (!errors.Is(c.Err, limiter.ErrUnavailable) || c.Result.Allowed):
				t.Errorf("closed: %+v", c)
			case open && (c.Err != nil || !c.Result.Allowed || !c.Result.Degraded):
				t.Errorf("open: %+v", c)
			}
		})
	}
}

// TestDecideManyRefundBeforeACachedDenial: a spend after a refund of the
// same bucket, in one DecideMany, sees the refund, though the denied
// cache knew the bucket empty before it.
func TestDecideManyRefundBeforeACachedDenial(t *testing.T) {
	f := newFixture(t, limiter.Config{DeniedCacheSize: 100}, manySnapshot(t))
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 2))
	if res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 1)); res.Allowed {
		t.Fatalf("a spend of an empty bucket: %+v", res)
	}
	calls := []limiter.Call{
		{Op: limiter.Refund, Requests: []limiter.Request{req("NewOrdersPerAccount", "5", 1)}},
		{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "5", 1)}},
	}
	f.l.DecideMany(context.Background(), calls, nil)
	if c := calls[1]; c.Err != nil || !c.Result.Allowed {
		t.Fatalf("the spend after the refund: %+v", c)
	}
}

// TestDecideManyTracedAndObserved: the one store call of DecideMany is
// traced and timed once, under the operation its batches share, or Mixed,
// naming each limit once.
func TestDecideManyTracedAndObserved(t *testing.T) {
	type call struct {
		op      limiter.Op
		limits  []string
		allowed bool
		timed   bool
	}
	var calls []call
	trace := func(ctx context.Context, op limiter.Op, limits []string) (context.Context, func(bool, error)) {
		i := len(calls)
		calls = append(calls, call{op: op, limits: limits})
		return ctx, func(allowed bool, _ error) { calls[i].allowed = allowed }
	}
	observe := func(op limiter.Op, _ time.Duration, _ error) {
		if n := len(calls); n == 0 || calls[n-1].op != op || calls[n-1].timed {
			t.Errorf("a store call of %s timed but not traced: %+v", op, calls)
		} else {
			calls[n-1].timed = true
		}
	}
	f := newFixture(t, limiter.Config{}, manySnapshot(t))
	f.l = limiter.New(limiter.Config{Store: f.store, Now: func() time.Time { return f.now }, TraceStore: trace, ObserveStore: observe,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	f.l.SetSnapshot(manySnapshot(t))
	spends := []limiter.Call{
		{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "1", 1), req("MailsPerAddress", "a@example.com", 1)}},
		{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "2", 1)}},
	}
	f.l.DecideMany(context.Background(), spends, nil)
	mixed := []limiter.Call{
		{Op: limiter.Check, Requests: []limiter.Request{req("NewOrdersPerAccount", "1", 1)}},
		{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "5", 3)}},
	}
	f.l.DecideMany(context.Background(), mixed, nil)
	want := []call{
		{op: limiter.Spend, limits: []string{"NewOrdersPerAccount", "MailsPerAddress"}, allowed: true, timed: true},
		{op: limiter.Mixed, limits: []string{"NewOrdersPerAccount"}, allowed: false, timed: true},
	}
	if len(calls) != len(want) {
		t.Fatalf("store calls %+v, want %+v", calls, want)
	}
	for i := range want {
		if c := calls[i]; c.op != want[i].op || !slices.Equal(c.limits, want[i].limits) || c.allowed != want[i].allowed || !c.timed {
			t.Errorf("call %d: %+v, want %+v", i, c, want[i])
		}
	}
}
