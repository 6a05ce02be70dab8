package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// acquire acquires one unit of L's bucket "job" with ttl, failing the test
// unless a lease is held.
func acquire(t *testing.T, c *Client, ctx context.Context, ttl time.Duration) *Lease {
	t.Helper()
	r, err := c.Acquire(ctx, ttl, Bucket{Limit: "L", ID: "job", Cost: 1})
	if err != nil || !r.Allowed || r.Lease == nil {
		t.Fatalf("acquire: %+v, %v", r, err)
	}
	return r.Lease
}

// TestLeaseRenews: a held lease is renewed every third of its ttl, and
// Release frees it and stops the renewals.
func TestLeaseRenews(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	l := acquire(t, c, context.Background(), 150*time.Millisecond)
	waitFor(t, "three renewals", func() bool { return f.Op("renew") >= 3 })
	if l.Err() != nil {
		t.Errorf("a renewed lease: %v", l.Err())
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed while the lease is held")
	default:
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	renewals := f.Op("renew")
	if f.Op("release") != 1 || l.Err() != nil {
		t.Errorf("%d releases, Err %v", f.Op("release"), l.Err())
	}
	// A release is safe to repeat, and sends nothing more.
	if err := l.Release(context.Background()); err != nil || f.Op("release") != 1 {
		t.Errorf("a second release: %v, %d releases", err, f.Op("release"))
	}
	time.Sleep(200 * time.Millisecond)
	if f.Op("renew") != renewals {
		t.Errorf("renewed %d times after the release", f.Op("renew")-renewals)
	}
	// The unit is free again.
	if r, err := c.Acquire(context.Background(), time.Second, Bucket{Limit: "L", ID: "job", Cost: 1}); err != nil || !r.Allowed {
		t.Errorf("acquiring the released unit: %+v, %v", r, err)
	}
}

// TestLeaseContext: the end of the context given to Acquire releases the
// lease.
func TestLeaseContext(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	l := acquire(t, c, ctx, time.Minute)
	cancel()
	<-l.Done()
	if !errors.Is(l.Err(), context.Canceled) || f.Op("release") != 1 {
		t.Errorf("Err %v, %d releases", l.Err(), f.Op("release"))
	}
}

// TestLeaseLost: a renewal that finds the lease gone ends it, and says so.
func TestLeaseLost(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	l := acquire(t, c, context.Background(), 90*time.Millisecond)
	f.DropLeases()
	<-l.Done()
	if l.Err() != ErrLeaseLost {
		t.Errorf("Err %v, want ErrLeaseLost", l.Err())
	}
	if err := l.Release(context.Background()); err != nil || f.Op("release") != 0 {
		t.Errorf("releasing a lost lease: %v, %d releases sent", err, f.Op("release"))
	}
}

// TestLeaseDeadService: renewals that keep failing end the lease when it
// expires, with the cause; failing open changes nothing there. A 404 of
// the whole request (a ratelimitd without /v1/decisions) is such a
// failure, not the lease's own 404.
func TestLeaseDeadService(t *testing.T) {
	notFound := func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"type":"urn:ratelimitd:problem:not-found","title":"Not Found","status":404,"detail":"no such route"}`))
		return true
	}
	for name, fault := range map[string]func(http.ResponseWriter, *http.Request) bool{"5xx": faults["5xx"], "404 of the route": notFound} {
		t.Run(name, func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 1})
			var dead atomic.Bool
			f.Fault = func(w http.ResponseWriter, r *http.Request) bool { return dead.Load() && fault(w, r) }
			c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true, BreakerFailures: 1000})
			start := time.Now()
			l := acquire(t, c, context.Background(), 900*time.Millisecond)
			dead.Store(true)
			<-l.Done()
			if !errors.Is(l.Err(), ErrLeaseExpired) || !errors.Is(l.Err(), ErrUnavailable) {
				t.Errorf("Err %v, want ErrLeaseExpired wrapping ErrUnavailable", l.Err())
			}
			if took := time.Since(start); took < 900*time.Millisecond {
				t.Errorf("the lease ended %v after it was acquired, before its ttl of 900ms", took)
			}
			// The acquire, the renewal at 300ms, and retries every 75ms
			// until 900ms: a loaded machine may delay some, not all.
			if n := len(f.Arrived); n < 3 {
				t.Errorf("%d requests: the renewals were not retried", n)
			}
		})
	}
}

// TestLeaseFailOpen: an acquire ratelimitd does not answer, failing open,
// is allowed with a lease that holds nothing and is released without a
// request.
func TestLeaseFailOpen(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	f.Close()
	c := newClient(t, f, Config{FailOpen: true})
	r, err := c.Acquire(context.Background(), time.Second, Bucket{Limit: "L", ID: "job", Cost: 1})
	if err != nil || !r.Allowed || !r.Degraded || r.Lease == nil || r.Lease.ID() != "" {
		t.Fatalf("%+v, %v", r, err)
	}
	if err := r.Lease.Release(context.Background()); err != nil {
		t.Error(err)
	}
	<-r.Lease.Done()
}
