package limiter

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Call is one request of DecideMany: what one of the Limiter's single
// methods takes (Decide, Acquire, Release or Renew), and what it answers.
type Call struct {
	// Op is Check, Spend, Refund, Settle, Acquire, Release or Renew.
	Op Op
	// Requests are the buckets of every operation but Release and Renew.
	Requests []Request
	// TTL is an Acquire's or a Renew's, 0 for the longest; LeaseID a
	// Release's or a Renew's.
	TTL     time.Duration
	LeaseID string

	// Result is what Decide or Acquire answers; Lease the lease an
	// Acquire took (nil when denied) or a Renew extended; Released what
	// Release answers. Err is the error the single method would return:
	// a *ValidationError, ErrLeaseNotFound, one wrapping
	// ErrUnavailable, or, when ctx ended before the store answered, one
	// wrapping the context's error.
	Result   Result
	Lease    *Lease
	Released bool
	Err      error
}

// Decides reports whether op is one of Decide's: Check, Spend, Refund or
// Settle.
func (op Op) Decides() bool { return op == Check || op == Spend || op == Refund || op == Settle }

// DecideMany answers many independent requests, each exactly as its single
// method would: all or nothing on its own, refused or failed on its own,
// the fail mode applied to each. They take effect in their order: a
// request sees what the requests before it did to its buckets. The
// batches of every Check, Spend, Refund and Settle go to the store in one
// call (Store.ApplyMany), so that a remote store needs one round trip for
// all of them; a Check's concurrency buckets and the lease operations
// follow, one store call each, in the order of the calls. Both kinds
// never share a bucket, so each bucket still sees its requests in order.
//
// The decisions of Check, Spend, Refund and Settle are appended to
// dst[:0], each call's Result.Decisions a part of it, and the slice is
// returned for reuse, as Decide does with dst.
func (l *Limiter) DecideMany(ctx context.Context, calls []Call, dst []Decision) []Decision {
	n := 0
	for i := range calls {
		if calls[i].Op.Decides() {
			n += len(calls[i].Requests)
		}
	}
	decisions := slices.Grow(dst[:0], n)[:n]
	clear(decisions)
	snap := l.snap.Load()
	now := l.now()
	m := l.many.Get().(*manyScratch)
	defer l.many.Put(m)
	m.reset(len(calls))

	// Resolve every request of buckets and gather the batches the store
	// decides.
	off := 0
	for i := range calls {
		c := &calls[i]
		c.Result, c.Lease, c.Released, c.Err = Result{}, nil, false, nil
		if !c.Op.Decides() {
			continue
		}
		d := decisions[off : off+len(c.Requests) : off+len(c.Requests)]
		off += len(c.Requests)
		if snap == nil {
			c.Err = ErrNoSnapshot
			continue
		}
		sc := l.scratch.Get().(*scratch)
		sc.reset()
		m.sc[i] = sc
		local, err := l.resolve(snap, c.Op, c.Requests, now, d, sc, m.refilled)
		if err != nil {
			c.Err = err
			continue
		}
		c.Result.Decisions = d
		m.local[i] = local
		if len(sc.batch) > 0 {
			m.batch[i] = len(m.batches)
			m.batches = append(m.batches, Batch{Op: storeOp(c.Op, local), Buckets: sc.batch})
		}
		if l.denied != nil && (c.Op == Refund || c.Op == Settle) {
			for j, p := range sc.pos {
				if p >= 0 {
					m.refilled[string(sc.key(j))] = struct{}{}
				}
			}
		}
	}
	if len(m.batches) > 0 {
		l.callStoreMany(ctx, now, calls, m)
	}

	// Then every request in its order: the rest of its decision, or its
	// lease operation.
	for i := range calls {
		c := &calls[i]
		switch {
		case c.Err != nil:
		case c.Op.Decides():
			var err error
			if b := m.batch[i]; b >= 0 {
				err = m.batches[b].Err
			}
			c.Result, c.Err = l.finish(ctx, c.Op, now, c.Result.Decisions, m.sc[i], m.local[i], err)
		case c.Op == Acquire:
			var res LeaseResult
			res, c.Err = l.Acquire(ctx, c.Requests, c.TTL)
			c.Result, c.Lease = res.Result, res.Lease
		case c.Op == Release:
			c.Released, c.Err = l.Release(ctx, c.LeaseID)
		case c.Op == Renew:
			var lease Lease
			if lease, c.Err = l.Renew(ctx, c.LeaseID, c.TTL); c.Err == nil {
				c.Lease = &lease
			}
		default:
			c.Err = fmt.Errorf("unknown operation %d", c.Op)
		}
	}
	for _, sc := range m.sc {
		if sc != nil {
			l.scratch.Put(sc)
		}
	}
	return decisions
}

// manyScratch is the working memory of DecideMany, pooled.
type manyScratch struct {
	// sc[i] is the scratch of call i, a request of buckets.
	sc []*scratch
	// local[i] is whether a bucket of call i denied without the store.
	local []bool
	// batch[i] is the index in batches of call i's batch, -1 for none.
	batch   []int
	batches []Batch
	// refilled are the keys that refunds and settles among the calls may
	// have made fuller (resolve).
	refilled map[string]struct{}
	// limits names the limits of the store call, for its trace.
	limits []string
}

func (m *manyScratch) reset(n int) {
	m.sc = slices.Grow(m.sc[:0], n)[:n]
	clear(m.sc)
	m.local = slices.Grow(m.local[:0], n)[:n]
	clear(m.local)
	m.batch = slices.Grow(m.batch[:0], n)[:n]
	for i := range m.batch {
		m.batch[i] = -1
	}
	clear(m.batches)
	m.batches = m.batches[:0]
	clear(m.refilled)
	m.limits = m.limits[:0]
}

// has reports whether set holds key; a nil set holds nothing.
func has(set map[string]struct{}, key []byte) bool {
	if len(set) == 0 {
		return false
	}
	_, ok := set[string(key)]
	return ok
}

// callStoreMany makes the one store call of DecideMany, traced and
// observed as callStore's are: under the operation its batches share, or
// Mixed.
func (l *Limiter) callStoreMany(ctx context.Context, now time.Time, calls []Call, m *manyScratch) {
	op := m.batches[0].Op
	for _, b := range m.batches {
		if b.Op != op {
			op = Mixed
		}
	}
	var end func(bool, error)
	if l.trace != nil {
		for i, b := range m.batch {
			if b >= 0 {
				m.limits = storeLimits(m.limits, calls[i].Result.Decisions, m.sc[i].pos)
			}
		}
		ctx, end = l.trace(ctx, op, m.limits)
	}
	var start time.Time
	if l.observe != nil {
		start = time.Now()
	}
	l.store.ApplyMany(ctx, now, m.batches)
	var err error
	allowed := true
	for i := range m.batches {
		b := &m.batches[i]
		if err == nil {
			err = b.Err
		}
		allowed = allowed && within(b.Buckets)
	}
	if l.observe != nil && !callerGone(ctx, err) {
		l.observe(op, time.Since(start), err)
	}
	if end != nil {
		end(allowed, err)
	}
	l.health(ctx, err)
}
