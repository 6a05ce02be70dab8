package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// ErrLeaseLost is wrapped by the Err of a lease that a renewal found gone: it
// expired before the renewal reached ratelimitd, or its bucket was reset.
// Its units may be another's now.
var ErrLeaseLost = errors.New("ratelimit: the lease no longer exists")

// ErrLeaseExpired is the Err of a lease whose renewals failed until it
// expired; it wraps the last renewal's error.
var ErrLeaseExpired = errors.New("ratelimit: the lease expired: its renewals failed")

// Acquire holds each bucket's cost of units of a concurrency limit, all
// or nothing, for "at most N of these at once": when allowed, Result.Lease
// holds them and renews itself while held, until Release or until ctx
// ends (give Acquire the context of the work the lease guards). The lease
// lives ttl without renewal (0: the shortest period of the buckets'
// limits) and is renewed every third of that. A denied acquire has no
// lease, and RetryAfter is the time until the earliest lease of a full
// bucket expires (a release may free units sooner).
//
// The call's own deadline is the Client's Timeout, or ctx's deadline when
// sooner. Failing open, an acquire ratelimitd did not answer is allowed
// with a lease that holds nothing, renews nothing and releases nothing.
func (c *Client) Acquire(ctx context.Context, ttl time.Duration, buckets ...Bucket) (Result, error) {
	start := time.Now()
	cl, err := c.ask(ctx, call{op: opAcquire, buckets: buckets, ttl: ttl})
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			return Result{}, err
		}
		r, err := c.failMode(err)
		if r.Allowed {
			r.Lease = c.keepLease(ctx, "", 0, start)
		}
		return r, err
	}
	r, id := cl.res, cl.lease.ID
	c.putCall(cl)
	if !r.Allowed {
		return r, nil
	}
	if ttl <= 0 {
		for _, d := range r.Decisions {
			if d.Period > 0 && (ttl <= 0 || d.Period < ttl) {
				ttl = d.Period
			}
		}
	}
	r.Lease = c.keepLease(ctx, id, ttl, start)
	return r, nil
}

// Lease is an acquired lease. It renews itself every third of its ttl
// until Release is called or the context given to Acquire ends, which
// releases it. A renewal that finds the lease gone, or renewals that fail
// until it has expired, end it: Done is then closed and Err says why, so
// that the holder can stop the work the lease guarded.
type Lease struct {
	c   *Client
	id  string
	ttl time.Duration

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu  sync.Mutex
	err error
	// released is set once ratelimitd has answered a release, Release's
	// or the one sent when the context ended.
	released bool
}

// keepLease starts the goroutine that renews a lease acquired at start
// (an id of "" holds nothing and is not renewed; nor is a ttl of 0).
func (c *Client) keepLease(ctx context.Context, id string, ttl time.Duration, start time.Time) *Lease {
	l := &Lease{c: c, id: id, ttl: ttl, stop: make(chan struct{}), done: make(chan struct{})}
	go l.keep(ctx, start.Add(ttl))
	return l
}

// ID is the lease's id, "" for a lease the fail mode gave.
func (l *Lease) ID() string { return l.id }

// Done is closed when the lease has ended: released, its context ended,
// or lost.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is held and after Release; after its
// context ended, the context's error; after it was lost, an error
// wrapping ErrLeaseLost and the renewal's 404 *Problem, or one wrapping
// ErrLeaseExpired; after ratelimitd refused a renewal,
// an error wrapping its *Problem, whose field errors name the renewal's
// own fields ("lease_id", "ttl_ms").
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Release frees the lease's units at once and stops its renewals. A lease
// already ended, released or not, is not an error: a release is safe to
// repeat. The error says that ratelimitd could not be told; the units are
// then freed when the lease expires.
func (l *Lease) Release(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	// A lease released (by Release, or when its context ended) or lost
	// has nothing left to free; one whose renewals failed or were refused
	// may still hold its units, and one whose release at its context's
	// end failed, if ratelimitd is back. Two Releases at once may both
	// ask: the second is told released false, which is no error.
	l.mu.Lock()
	done := l.id == "" || l.released || errors.Is(l.err, ErrLeaseLost)
	l.mu.Unlock()
	if done {
		return nil
	}
	cl, err := l.c.ask(ctx, call{op: opRelease, leaseID: l.id})
	if err != nil {
		return err
	}
	l.c.putCall(cl)
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}

// keep renews the lease until it is released or lost. expires is when the
// lease ends unless renewed, on this process's clock and never later than
// on ratelimitd's: each ttl counts from before the request that set it.
func (l *Lease) keep(ctx context.Context, expires time.Time) {
	defer close(l.done)
	interval := l.ttl / 3
	var tick <-chan time.Time
	var timer *time.Timer
	if l.id != "" && interval > 0 {
		timer = time.NewTimer(interval)
		defer timer.Stop()
		tick = timer.C
	}
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			if l.id != "" {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.timeout)
				if cl, err := l.c.ask(rctx, call{op: opRelease, leaseID: l.id}); err == nil {
					l.c.putCall(cl)
					l.mu.Lock()
					l.released = true
					l.mu.Unlock()
				}
				cancel()
			}
			l.end(ctx.Err())
			return
		case <-tick:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.timeout)
		cl, err := l.c.ask(rctx, call{op: opRenew, leaseID: l.id, ttl: l.ttl})
		cancel()
		var p *Problem
		switch {
		case err == nil:
			l.c.putCall(cl)
			expires = sent.Add(l.ttl)
			timer.Reset(interval)
		case errors.Is(err, ErrUnavailable):
			// Try again sooner while the lease lasts: a renewal may fail
			// for a moment without the lease being lost. (A whole request
			// refused, a 404 of a ratelimitd without /v1/decisions
			// included, is this too, not the lease's own 404.)
			left := time.Until(expires)
			if left <= 0 {
				l.end(fmt.Errorf("%w: %w", ErrLeaseExpired, err))
				return
			}
			timer.Reset(min(interval/4+1, left))
		case errors.As(err, &p) && p.Status == http.StatusNotFound:
			l.end(fmt.Errorf("%w: %w", ErrLeaseLost, err))
			return
		default:
			l.end(fmt.Errorf("ratelimit: the lease's renewal was refused: %w", err))
			return
		}
	}
}

func (l *Lease) end(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}
