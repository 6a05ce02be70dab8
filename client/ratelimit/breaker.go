package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// breaker keeps a Client from sending to a ratelimitd that keeps failing.
// Closed, it lets every call through and counts the requests that fail in
// a row; at failures it opens. Open, it refuses calls, which then get the
// fail mode's answer at once, until cooldown has passed; then it lets one
// call through as the probe, and refuses the others while the probe's
// request is out. The request's success closes it, its failure opens it
// for another cooldown.
type breaker struct {
	failures int
	cooldown time.Duration
	hook     func(open bool)

	// open and failed are written under mu and read without it, so that
	// a closed breaker with no failures costs a call an atomic load.
	open   atomic.Bool
	failed atomic.Int32 // requests failed in a row

	mu      sync.Mutex
	until   time.Time // end of the cooldown, while open
	probing bool      // a probe was let through and has not come back
}

// allow reports whether a call may go to ratelimitd, and whether it is the
// probe of an open breaker.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	if !b.open.Load() {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.open.Load():
		return true, false
	case b.probing || now.Before(b.until):
		return false, false
	}
	b.probing = true
	return true, true
}

// record counts the outcome of a request. A request that was out when the
// breaker opened may close it by succeeding: ratelimitd answered.
func (b *breaker) record(now time.Time, ok bool) {
	if ok && !b.open.Load() && b.failed.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.probing = false
	changed := false
	if ok {
		b.failed.Store(0)
		changed = b.open.Swap(false)
	} else {
		n := b.failed.Add(1)
		if b.open.Load() || int(n) >= b.failures {
			b.until = now.Add(b.cooldown)
			changed = !b.open.Swap(true)
		}
	}
	// Under the lock, so that the hook hears of the changes in order.
	if changed && b.hook != nil {
		b.hook(b.open.Load())
	}
	b.mu.Unlock()
}

// abandon lets another probe through when the probe's call was given up
// before its request was sent.
func (b *breaker) abandon() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}
