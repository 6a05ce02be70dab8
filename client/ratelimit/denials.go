package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// denials remembers the buckets ratelimitd denied a spend of, until their
// retry-after has passed, so that spends of the same bucket at the same
// cost or more are denied without a request, as ratelimitd's own denied
// cache does for its store. What it trades: a refund or reset made
// elsewhere, or a limit or override raised meanwhile, is seen only once
// the remembered time has passed. Refunds and settles made through this
// Client forget their buckets, and a denial answered after a refund began
// is not remembered: the spend may have been decided before the refund.
// Buckets are keyed by the ids the caller gave, so that a hit costs no
// canonicalisation.
type denials struct {
	size int
	// n mirrors len(m), so that the common case, no bucket denied, costs
	// an atomic load instead of the lock.
	n atomic.Int32
	// forgets counts the refunds and settles begun; it changes under mu.
	forgets atomic.Uint64
	mu      sync.Mutex
	m       map[bucketKey]denial
}

type bucketKey struct{ limit, id string }

type denial struct {
	// cost is the cost denied; a smaller one may be allowed sooner.
	cost int64
	// at is when the denial was asked for, until when it ends.
	at, until time.Time
	d         Decision
}

func newDenials(size int) *denials {
	return &denials{size: size, m: make(map[bucketKey]denial)}
}

// deny answers a spend of buckets from the denials remembered, when one of
// them denies its bucket at its cost: the whole spend is then denied, as
// ratelimitd would deny it.
func (ds *denials) deny(now time.Time, buckets []Bucket) (Result, bool) {
	if ds == nil || ds.n.Load() == 0 {
		return Result{}, false
	}
	var r Result
	ds.mu.Lock()
	for _, b := range buckets {
		k := bucketKey{b.Limit, b.ID}
		e, ok := ds.m[k]
		if !ok {
			continue
		}
		if !now.Before(e.until) {
			ds.delete(k)
			continue
		}
		if b.Cost < e.cost {
			continue
		}
		d := e.d
		d.RetryAfter = e.until.Sub(now)
		d.ResetAfter = max(d.RetryAfter, d.ResetAfter-now.Sub(e.at))
		r.Decisions = append(r.Decisions, d)
		r.RetryAfter = max(r.RetryAfter, d.RetryAfter)
		r.ResetAfter = max(r.ResetAfter, d.ResetAfter)
	}
	ds.mu.Unlock()
	r.Local = r.Decisions != nil
	return r, r.Local
}

// epoch is read before a spend is asked for, for learn.
func (ds *denials) epoch() uint64 {
	if ds == nil {
		return 0
	}
	return ds.forgets.Load()
}

// learn remembers the buckets a spend asked for at at, and after epoch,
// was denied on, unless a refund or settle began meanwhile; and forgets
// those it was allowed on.
func (ds *denials) learn(at time.Time, epoch uint64, buckets []Bucket, decisions []Decision) {
	if ds == nil {
		return
	}
	for i := range min(len(buckets), len(decisions)) {
		d := &decisions[i]
		k := bucketKey{buckets[i].Limit, buckets[i].ID}
		// Only a limit's own denial ends: a blocked bucket or a cost above
		// the burst never does (retry-after Never), until an override
		// changes, which the client cannot see.
		if d.Allowed || d.Shadow || d.Reason != "limited" || d.RetryAfter <= 0 {
			if ds.n.Load() > 0 {
				ds.mu.Lock()
				ds.delete(k)
				ds.mu.Unlock()
			}
			continue
		}
		ds.mu.Lock()
		if ds.forgets.Load() != epoch {
			ds.mu.Unlock()
			return
		}
		if _, ok := ds.m[k]; !ok && len(ds.m) >= ds.size {
			for old := range ds.m {
				delete(ds.m, old)
				break
			}
		}
		ds.m[k] = denial{cost: buckets[i].Cost, at: at, until: at.Add(d.RetryAfter), d: *d}
		ds.n.Store(int32(len(ds.m)))
		ds.mu.Unlock()
	}
}

// forget drops a bucket of a refund or settle, before it is asked for.
// It takes the lock even when nothing is remembered, so that a learn of a
// denial answered before the refund either comes first, and is dropped
// here, or sees the new epoch.
func (ds *denials) forget(limit, id string) {
	if ds == nil {
		return
	}
	ds.mu.Lock()
	ds.forgets.Add(1)
	ds.delete(bucketKey{limit, id})
	ds.mu.Unlock()
}

// delete drops k; the caller holds the lock.
func (ds *denials) delete(k bucketKey) {
	delete(ds.m, k)
	ds.n.Store(int32(len(ds.m)))
}
