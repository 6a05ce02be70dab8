package limiter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
)

// endingStore fails every call whose context has ended with the context's
// error, as the Redis store does, and can fail the others with err.
type endingStore struct {
	limiter.Store
	err error
}

func (s *endingStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.err
}

func (s *endingStore) Apply(ctx context.Context, op limiter.Op, now time.Time, b []limiter.Bucket) (bool, error) {
	if err := s.check(ctx); err != nil {
		return false, err
	}
	return s.Store.Apply(ctx, op, now, b)
}

func (s *endingStore) ApplyMany(ctx context.Context, now time.Time, batches []limiter.Batch) {
	if err := s.check(ctx); err != nil {
		for i := range batches {
			batches[i].Err = err
		}
		return
	}
	s.Store.ApplyMany(ctx, now, batches)
}

func (s *endingStore) Acquire(ctx context.Context, now time.Time, rec *limiter.LeaseRecord, b []limiter.LeaseBucket) (bool, error) {
	if err := s.check(ctx); err != nil {
		return false, err
	}
	return s.Store.Acquire(ctx, now, rec, b)
}

func (s *endingStore) Held(ctx context.Context, now time.Time, b []limiter.LeaseBucket) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.Store.Held(ctx, now, b)
}

func (s *endingStore) Release(ctx context.Context, now time.Time, id string) (limiter.LeaseRecord, error) {
	if err := s.check(ctx); err != nil {
		return limiter.LeaseRecord{}, err
	}
	return s.Store.Release(ctx, now, id)
}

func (s *endingStore) Renew(ctx context.Context, now time.Time, id string, expires func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	if err := s.check(ctx); err != nil {
		return limiter.LeaseRecord{}, err
	}
	return s.Store.Renew(ctx, now, id, expires)
}

func (s *endingStore) Expire(ctx context.Context, now time.Time, keys []string) ([]int64, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return s.Store.Expire(ctx, now, keys)
}

func (s *endingStore) Reset(ctx context.Context, keys []string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.Store.Reset(ctx, keys)
}

// TestCallerGoneIsNoOutage: a store call that fails because its caller
// went away (its context cancelled) says nothing of the store. It is neither counted nor logged as a store error, nor
// timed as a failed call, and the fail mode does not answer it: failing
// open, an abandoned spend must not come back allowed and degraded, nor
// failing closed as an unavailable store. A store that times out on its
// own, while the caller waits, still is an outage, and so is one slower
// than the caller's own deadline.
func TestCallerGoneIsNoOutage(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			var logs bytes.Buffer
			var mu sync.Mutex
			var observed []error
			ms := memstore.New(memstore.Options{})
			t.Cleanup(ms.Close)
			store := &endingStore{Store: ms}
			now := t0
			l := limiter.New(limiter.Config{Store: store, FailOpen: open, Now: func() time.Time { return now },
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				ObserveStore: func(_ limiter.Op, _ time.Duration, err error) {
					mu.Lock()
					observed = append(observed, err)
					mu.Unlock()
				}})
			l.SetSnapshot(build(t, []limiter.Limit{orders(), emails(), calls("Calls", 130, 3, 30*time.Second)}))
			held, err := l.Acquire(context.Background(), []limiter.Request{req("Calls", "a", 1)}, 0)
			if err != nil || held.Lease == nil {
				t.Fatalf("acquire: %+v, %v", held, err)
			}
			id := held.Lease.ID

			canceled, cancel := context.WithCancel(context.Background())
			cancel()
			for _, ctx := range []context.Context{canceled} {
				want := ctx.Err()
				gone := func(what string, allowed, degraded bool, err error) {
					t.Helper()
					if !errors.Is(err, want) || errors.Is(err, limiter.ErrUnavailable) || allowed || degraded {
						t.Errorf("%s, the caller gone (%v): allowed %v, degraded %v, err %v; want %v alone", what, want, allowed, degraded, err, want)
					}
				}
				for _, op := range []limiter.Op{limiter.Spend, limiter.Check} {
					res, err := l.Decide(ctx, op, []limiter.Request{req("NewOrdersPerAccount", "1", 1)}, nil)
					gone(op.String(), res.Allowed, res.Degraded, err)
				}
				res, err := l.Decide(ctx, limiter.Check, []limiter.Request{req("Calls", "a", 0)}, nil)
				gone("check of a lease bucket", res.Allowed, res.Degraded, err)
				lres, err := l.Acquire(ctx, []limiter.Request{req("Calls", "b", 1)}, 0)
				gone("acquire", lres.Allowed || lres.Lease != nil, lres.Degraded, err)
				released, err := l.Release(ctx, id)
				gone("release", released, false, err)
				_, err = l.Renew(ctx, id, 0)
				gone("renew", false, false, err)
				if _, err := l.Reset(ctx, []limiter.Request{req("NewOrdersPerAccount", "1", 0)}); !errors.Is(err, want) || errors.Is(err, limiter.ErrUnavailable) {
					t.Errorf("reset, the caller gone: %v", err)
				}
				many := []limiter.Call{
					{Op: limiter.Spend, Requests: []limiter.Request{req("NewOrdersPerAccount", "2", 1)}},
					{Op: limiter.Release, LeaseID: id},
				}
				l.DecideMany(ctx, many, nil)
				gone("DecideMany's spend", many[0].Result.Allowed, many[0].Result.Degraded, many[0].Err)
				gone("DecideMany's release", many[1].Released, false, many[1].Err)
			}
			now = t0.Add(time.Minute)
			if err := l.SweepLeases(canceled); !errors.Is(err, context.Canceled) || errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("a sweep cancelled: %v", err)
			}

			if got := l.Stats().StoreErrors; got != 0 {
				t.Errorf("StoreErrors = %d, want 0", got)
			}
			if logs.Len() != 0 {
				t.Errorf("the log: %s", logs.String())
			}
			mu.Lock()
			for _, err := range observed {
				if err != nil {
					t.Errorf("a store call observed failed: %v", err)
				}
			}
			mu.Unlock()

			// The store's own timeout, the caller still waiting, is an
			// outage; so is the caller's own deadline passing before the
			// store answered: the store was too slow for it, the caller
			// did not leave.
			store.err = fmt.Errorf("redis evalsha: %w", context.DeadlineExceeded)
			late, cancelLate := context.WithDeadline(context.Background(), t0.Add(-time.Second))
			defer cancelLate()
			for i, ctx := range []context.Context{context.Background(), late} {
				res, err := l.Decide(ctx, limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "1", 1)}, nil)
				switch {
				case !open && !errors.Is(err, limiter.ErrUnavailable):
					t.Errorf("closed, outage %d: %+v, %v", i, res, err)
				case open && (err != nil || !res.Degraded):
					t.Errorf("open, outage %d: %+v, %v", i, res, err)
				}
				if got := l.Stats().StoreErrors; got != uint64(i+1) {
					t.Errorf("StoreErrors after outage %d = %d, want %d", i, got, i+1)
				}
			}
		})
	}
}
