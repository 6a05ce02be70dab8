package limiter

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"strconv"
	"sync"
	"time"
)

// ErrLeaseNotFound reports a lease that is unknown, expired or released.
var ErrLeaseNotFound = &sentinel{"lease not found", ErrNotFound}

// leaseIDPrefix and leaseIDLen give lease ids their one shape: "lse_" and
// the base32 of 128 random bits, lower case, unpadded.
const (
	leaseIDPrefix = "lse_"
	leaseIDLen    = len(leaseIDPrefix) + 26
)

var leaseEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewLeaseID returns a fresh lease id. It is the capability to release or
// renew the lease, so it holds 128 bits from the system's random source.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return leaseIDPrefix + leaseEncoding.EncodeToString(b[:])
}

// ValidLeaseID reports whether id has the shape NewLeaseID gives, so that
// anything else is refused before a store sees it.
func ValidLeaseID(id string) bool {
	if len(id) != leaseIDLen || id[:len(leaseIDPrefix)] != leaseIDPrefix {
		return false
	}
	for i := len(leaseIDPrefix); i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	// The last character carries 2 bits beyond the 128, which must be
	// zero, so that a lease has one spelling.
	b, err := leaseEncoding.DecodeString(id[len(leaseIDPrefix):])
	return err == nil && leaseEncoding.EncodeToString(b) == id[len(leaseIDPrefix):]
}

// LeaseBucket is one bucket of a lease operation as a LeaseStore sees it.
type LeaseBucket struct {
	// Key names the bucket, as Bucket.Key does; a lease bucket's key never
	// names a rate bucket, since kinds never share an enum.
	Key []byte
	// Burst is the most units the bucket holds at once; 0 blocks it.
	Burst int64
	// Cost is the units the lease takes.
	Cost int64
	// Shadow marks a bucket of a shadow limit: it takes the lease's units
	// when they fit, but its denial does not stop the rest of the batch.
	Shadow bool
	// Held, Earliest and Latest are set by the store: the units the
	// bucket held before the call, its expired leases dropped, and the
	// expiries (Unix µs) of its earliest- and latest-ending live leases,
	// 0 when it holds none.
	Held     int64
	Earliest int64
	Latest   int64
	// Expired is set by the store on an acquire: the leases of the bucket
	// it dropped because they had expired, for the metrics.
	Expired int64
	// Outcome is set by LeaseStep.
	Outcome Outcome
}

// LeaseRecord is what a store keeps of a lease, to release or renew it by
// its id alone.
type LeaseRecord struct {
	ID string
	// Expires is in Unix µs.
	Expires int64
	// MaxTTL is the longest a renewal may extend it: the shortest period
	// of its buckets' limits when it was acquired.
	MaxTTL time.Duration
	// Keys and Costs are its buckets and what it holds of each; a shadow
	// bucket it did not fit in is not among them.
	Keys  []string
	Costs []int64
}

// LeaseStore keeps the leases of concurrency limits. A bucket holds the
// units of its live leases; an expired lease is dropped, once, by an
// acquire on its bucket or by Expire, which the Limiter calls for the
// buckets of the leases it acquired as they expire, so no sweep has to
// visit every bucket. Whoever drops an expired lease reports it, so that
// each is counted once.
type LeaseStore interface {
	// Acquire reads the batch's buckets at now and decides with
	// LeaseStep; when that allows, it records lease id, which expires at
	// rec.Expires, holding each bucket's cost, all in one atomic step:
	// concurrent acquires never hold more than a burst. It reports
	// whether it acquired. rec's Keys and Costs are filled in by the
	// store.
	Acquire(ctx context.Context, now time.Time, rec *LeaseRecord, batch []LeaseBucket) (bool, error)
	// Held reads the batch's buckets at now without changing them.
	Held(ctx context.Context, now time.Time, batch []LeaseBucket) error
	// Release frees the units of lease id at once and returns its record,
	// or ErrLeaseNotFound when it is unknown, expired or released.
	Release(ctx context.Context, now time.Time, id string) (LeaseRecord, error)
	// Renew sets the expiry of lease id, on every bucket that still holds
	// it, to what expires computes from its record (which may refuse the
	// renewal, say for a ttl beyond MaxTTL), and returns the record as it
	// was before. It fails with ErrLeaseNotFound when the lease expired
	// or was released: its units may be another's by now. A bucket reset
	// since holds nothing of it, and is left so.
	Renew(ctx context.Context, now time.Time, id string, expires func(LeaseRecord) (int64, error)) (LeaseRecord, error)
	// Expire drops the leases of the buckets at keys that expired by now
	// and returns how many it dropped of each (0 for a bucket it does not
	// hold). Leases dropped before, by an acquire or an earlier Expire,
	// are not among them. On an error, the counts of the buckets it did
	// drop leases of are still returned.
	Expire(ctx context.Context, now time.Time, keys []string) ([]int64, error)
}

// LeaseStep decides an acquire of the batch at now for a lease that
// expires at expires (Unix µs), from what the store read: a bucket allows
// when the cost is at most its burst and what it holds leaves room for the
// cost. It sets each bucket's Outcome, as it stands after the call, and
// reports whether the lease is to be recorded: when every bucket outside
// shadow limits allows. A shadow bucket takes the lease's units only if
// it allows. Check is the same step with cost 0, never recorded.
func LeaseStep(now, expires int64, batch []LeaseBucket) bool {
	ok := true
	for i := range batch {
		b := &batch[i]
		out := Outcome{Allowed: true}
		switch {
		case b.Burst == 0 && b.Cost > 0:
			out = Outcome{Reason: ReasonBlocked, RetryAfter: Never}
		case b.Cost > b.Burst:
			out = Outcome{Reason: ReasonCostExceedsBurst, RetryAfter: Never}
		case b.Held+b.Cost > b.Burst:
			// Only the expiry of a lease frees units without a release.
			out = Outcome{Reason: ReasonLimited, RetryAfter: micros(max(b.Earliest-now, 0))}
		}
		out.Held = b.Held
		out.ResetAfter = micros(max(b.Latest-now, 0))
		b.Outcome = out
		ok = ok && (out.Allowed || b.Shadow)
	}
	for i := range batch {
		b := &batch[i]
		if ok && expires > 0 && b.Takes() {
			b.Outcome.Held += b.Cost
			b.Outcome.ResetAfter = micros(max(b.Latest, expires) - now)
		}
		b.Outcome.Remaining = max(b.Burst-b.Outcome.Held, 0)
	}
	return ok && expires > 0
}

// Takes reports whether an acquire that LeaseStep allowed puts the lease's
// units into b.
func (b *LeaseBucket) Takes() bool { return b.Outcome.Allowed && b.Cost > 0 }

// Lease is a lease as a client sees it.
type Lease struct {
	ID      string
	Expires time.Time
}

// LeaseResult is the answer of an acquire.
type LeaseResult struct {
	Result
	// Lease is nil when the acquire was denied.
	Lease *Lease
}

// Acquire takes a lease of every request's cost on its concurrency
// limit's bucket, all or nothing, for ttl (the shortest period of the
// buckets' limits when 0). Requests of other limits are refused with a
// field error; so is a ttl beyond that period.
func (l *Limiter) Acquire(ctx context.Context, reqs []Request, ttl time.Duration) (LeaseResult, error) {
	snap := l.snap.Load()
	if snap == nil {
		return LeaseResult{}, ErrNoSnapshot
	}
	now := l.now()
	nowUS := now.UnixMicro()
	decisions := make([]Decision, len(reqs))
	batch, pos, maxTTL, err := l.resolveLeases(snap, reqs, now, decisions)
	if err != nil {
		return LeaseResult{}, err
	}
	var ve ValidationError
	switch {
	case ttl < 0:
		ve.Add("ttl_ms", "must be at least 1")
	case ttl > maxTTL:
		ve.Add("ttl_ms", "must be at most "+strconv.FormatInt(maxTTL.Milliseconds(), 10)+", the shortest period of the buckets")
	case ttl == 0:
		ttl = maxTTL
	}
	if len(ve.Fields) > 0 {
		return LeaseResult{}, &ValidationError{Fields: ve.Fields}
	}
	rec := LeaseRecord{ID: NewLeaseID(), Expires: now.Add(ttl).UnixMicro(), MaxTTL: maxTTL}
	acquired := false
	lease := &Lease{ID: rec.ID, Expires: time.UnixMicro(rec.Expires)}
	if allowedHere(decisions, pos) {
		// The store records the lease even when no bucket of it needs
		// holding (unlimited ones only), so that its release and renewal
		// answer as any lease's do.
		acquired, err = l.store.Acquire(ctx, now, &rec, batch)
		if err != nil {
			l.health(ctx, err)
			res, err := l.storeFailed(ctx, decisions, pos, err)
			if err != nil {
				return LeaseResult{}, err
			}
			// Failing open, the lease is held nowhere: its release does
			// nothing.
			return LeaseResult{Result: res, Lease: lease}, nil
		}
	} else if len(batch) > 0 {
		// A bucket decided here denies: read the others for the answer.
		// Should the store fail, the fail mode answers, as for a decision
		// (failing open, the bucket decided here still denies).
		if err := l.store.Held(ctx, now, batch); err != nil {
			l.health(ctx, err)
			res, err := l.storeFailed(ctx, decisions, pos, err)
			return LeaseResult{Result: res}, err
		}
		LeaseStep(nowUS, 0, batch)
	}
	for i, p := range pos {
		if p >= 0 {
			decisions[i].Outcome = batch[p].Outcome
		}
	}
	res := summarize(decisions)
	out := LeaseResult{Result: res}
	if acquired {
		out.Lease = lease
		l.due.add(rec.Expires, rec.Keys)
	}
	if l.observeLease != nil {
		for i, p := range pos {
			if p < 0 {
				continue
			}
			if b := &batch[p]; b.Expired > 0 {
				l.observeLease(decisions[i].Limit, LeaseExpired, b.Expired)
			}
			if out.Lease != nil && batch[p].Takes() {
				l.observeLease(decisions[i].Limit, LeaseAcquired, 1)
			}
		}
	}
	return out, nil
}

// LeaseEvent is what happened to a lease on a bucket, for the metrics.
type LeaseEvent uint8

// The events of leases. Leases held per limit are acquired minus released
// minus expired.
const (
	LeaseAcquired LeaseEvent = iota + 1
	LeaseReleased
	LeaseRenewed
	// LeaseExpired is counted when the store drops the expired lease: an
	// acquire on its bucket, or SweepLeases.
	LeaseExpired
)

// String returns the lower-case name used in metrics.
func (e LeaseEvent) String() string {
	switch e {
	case LeaseAcquired:
		return "acquired"
	case LeaseReleased:
		return "released"
	case LeaseRenewed:
		return "renewed"
	case LeaseExpired:
		return "expired"
	}
	return "unknown"
}

// observeLeaseKeys tells the metrics of an event on each bucket of a
// lease.
func (l *Limiter) observeLeaseKeys(e LeaseEvent, keys []string) {
	for _, k := range keys {
		l.observeLeaseKey(e, k, 1)
	}
}

// observeLeaseKey tells the metrics of n events on the bucket at key, by
// its limit's name, which the key's enum gives.
func (l *Limiter) observeLeaseKey(e LeaseEvent, k string, n int64) {
	snap := l.snap.Load()
	if l.observeLease == nil || snap == nil {
		return
	}
	end := 0
	for end < len(k) && k[end] >= '0' && k[end] <= '9' {
		end++
	}
	enum, err := strconv.Atoi(k[:end])
	if err != nil {
		return
	}
	if le, ok := snap.byEnum[enum]; ok && len(k) > len(le.prefix) && k[:len(le.prefix)] == le.prefix {
		l.observeLease(le.Name, e, n)
	}
}

// LeaseSweepInterval is how often the service calls SweepLeases: well
// within a Redis lease bucket's life after its last lease
// (redisstore.DefaultExpiryMargin), so that the sweep, not Redis, drops an
// expired lease, and counts it.
const LeaseSweepInterval = 250 * time.Millisecond

// SweepLeases drops, from the buckets that still hold them, the leases
// acquired or renewed through this Limiter that have expired, and counts
// them expired, as an acquire that drops expired leases does: the store
// drops each expired lease once, whoever drops it, so that acquired -
// released - expired is what the buckets hold. A failed sweep is tried
// again by the next.
func (l *Limiter) SweepLeases(ctx context.Context) error {
	now := l.now()
	keys := l.due.take(now.UnixMicro())
	if len(keys) == 0 {
		return nil
	}
	counts, err := l.store.Expire(ctx, now, keys)
	for i, n := range counts {
		if n > 0 {
			l.observeLeaseKey(LeaseExpired, keys[i], n)
		}
	}
	l.health(ctx, err)
	if err != nil {
		l.due.add(now.UnixMicro(), keys)
		return storeError(ctx, err)
	}
	return nil
}

// RunLeaseSweeper calls SweepLeases every interval until ctx ends.
func (l *Limiter) RunLeaseSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = l.SweepLeases(ctx) // logged as a store failure
		}
	}
}

// dueLeases holds the buckets of the leases acquired or renewed through a
// Limiter, by expiry, until SweepLeases takes them. A lease released or
// renewed since stays in it: its sweep finds nothing expired.
type dueLeases struct {
	mu sync.Mutex
	h  dueHeap
}

// add records that the buckets at keys hold a lease until expires (Unix
// µs).
func (d *dueLeases) add(expires int64, keys []string) {
	if len(keys) == 0 {
		return
	}
	d.mu.Lock()
	heap.Push(&d.h, dueEntry{expires: expires, keys: keys})
	d.mu.Unlock()
}

// take removes and returns the buckets whose leases are due by nowUS, each
// once.
func (d *dueLeases) take(nowUS int64) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var keys []string
	seen := map[string]bool{}
	for len(d.h) > 0 && d.h[0].expires <= nowUS {
		for _, k := range heap.Pop(&d.h).(dueEntry).keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys
}

type dueEntry struct {
	expires int64
	keys    []string
}

// dueHeap is a min-heap of dueEntry by expiry (container/heap).
type dueHeap []dueEntry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// allowedHere reports whether the buckets decided without the store allow
// the lease.
func allowedHere(decisions []Decision, pos []int) bool {
	for i, p := range pos {
		if p < 0 && !decisions[i].Allowed && !decisions[i].Shadow {
			return false
		}
	}
	return true
}

// resolveLeases resolves an acquire's requests, which must all be of
// concurrency limits, into the batch of the buckets that need the store,
// and returns the shortest period of the buckets' limits.
func (l *Limiter) resolveLeases(snap *Snapshot, reqs []Request, now time.Time, decisions []Decision) ([]LeaseBucket, []int, time.Duration, error) {
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		return nil, nil, 0, &ValidationError{Fields: []FieldError{{Field: "buckets", Message: "must hold 1 to " + strconv.Itoa(MaxBatch) + " buckets"}}}
	}
	var ve ValidationError
	batch := make([]LeaseBucket, 0, len(reqs))
	pos := make([]int, len(reqs))
	keys := make([][]byte, len(reqs))
	maxTTL := MaxLeasePeriod
	for i, req := range reqs {
		field := func(name string) string { return "buckets[" + strconv.Itoa(i) + "]" + name }
		r, key, err := snap.resolve(nil, req.Limit, req.BucketID, now.UnixMicro())
		var fe FieldError
		if err != nil && !errors.As(err, &fe) {
			return nil, nil, 0, err
		}
		// What is wrong with the bucket comes before what is wrong with
		// its cost, as in the body.
		bad := len(ve.Fields)
		switch {
		case err != nil:
			ve.Add(field("."+fe.Field), fe.Message)
		case r.Limit.KindOf() != KindConcurrency:
			ve.Add(field(".limit"), "is a rate limit; acquire takes concurrency limits only")
		default:
			keys[i] = key
			for j := range i {
				if string(keys[j]) == string(key) {
					ve.Add(field(""), "same bucket as buckets["+strconv.Itoa(j)+"]")
				}
			}
		}
		if req.Cost < 1 {
			ve.Add(field(".cost"), "must be at least 1 to acquire; check inspects a bucket")
		}
		if len(ve.Fields) > bad {
			continue
		}
		d := &decisions[i]
		d.Limit, d.BucketID, d.Params, d.Source, d.Shadow, d.Unit = r.Limit.Name, r.BucketID, r.Params, r.Source, r.Limit.Shadow, r.Limit.Counts()
		d.Kind = KindConcurrency
		maxTTL = min(maxTTL, r.Params.Period)
		pos[i] = -1
		switch {
		case r.Source == SourceUnlimited:
			d.Outcome = Outcome{Allowed: true, Remaining: r.Params.Burst}
		case r.Params.Burst == 0:
			d.Outcome = Outcome{Reason: ReasonBlocked, RetryAfter: Never}
		default:
			pos[i] = len(batch)
			batch = append(batch, LeaseBucket{Key: key, Burst: r.Params.Burst, Cost: req.Cost, Shadow: r.Limit.Shadow})
		}
	}
	if len(ve.Fields) > 0 {
		return nil, nil, 0, &ValidationError{Fields: ve.Fields}
	}
	return batch, pos, maxTTL, nil
}

// Release frees the units of lease id at once. It reports false for a
// lease that is unknown, expired or released already, so that a retried
// release is safe.
func (l *Limiter) Release(ctx context.Context, id string) (bool, error) {
	if !ValidLeaseID(id) {
		return false, &ValidationError{Fields: []FieldError{{Field: "lease_id", Message: "must be a lease id as acquire returns it (lse_ and 26 characters)"}}}
	}
	rec, err := l.store.Release(ctx, l.now(), id)
	switch {
	case errors.Is(err, ErrLeaseNotFound):
		return false, nil
	case err != nil:
		l.health(ctx, err)
		return false, storeError(ctx, err)
	}
	l.observeLeaseKeys(LeaseReleased, rec.Keys)
	return true, nil
}

// Renew extends lease id to ttl from now (its longest, the shortest period
// of its limits, when 0). A lease that no longer holds its units gives
// ErrLeaseNotFound: they may be another's by now.
func (l *Limiter) Renew(ctx context.Context, id string, ttl time.Duration) (Lease, error) {
	var ve ValidationError
	if !ValidLeaseID(id) {
		ve.Add("lease_id", "must be a lease id as acquire returns it (lse_ and 26 characters)")
	}
	if ttl < 0 {
		ve.Add("ttl_ms", "must be at least 1")
	}
	if len(ve.Fields) > 0 {
		return Lease{}, &ValidationError{Fields: ve.Fields}
	}
	now := l.now()
	var expires int64
	rec, err := l.store.Renew(ctx, now, id, func(rec LeaseRecord) (int64, error) {
		d := ttl
		if d == 0 {
			d = rec.MaxTTL
		}
		if d > rec.MaxTTL {
			return 0, &ValidationError{Fields: []FieldError{{Field: "ttl_ms", Message: "must be at most " + strconv.FormatInt(rec.MaxTTL.Milliseconds(), 10) + ", the shortest period of the lease's buckets"}}}
		}
		expires = now.Add(d).UnixMicro()
		return expires, nil
	})
	var verr *ValidationError
	switch {
	case errors.Is(err, ErrLeaseNotFound):
		l.renewalsNotFound.Add(1)
		return Lease{}, err
	case errors.As(err, &verr):
		return Lease{}, err
	case err != nil:
		l.health(ctx, err)
		return Lease{}, storeError(ctx, err)
	}
	l.observeLeaseKeys(LeaseRenewed, rec.Keys)
	l.due.add(expires, rec.Keys)
	return Lease{ID: id, Expires: time.UnixMicro(expires)}, nil
}
