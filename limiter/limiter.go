package limiter

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// MaxBatch is the largest number of buckets in one decision.
const MaxBatch = 100

// ErrNoSnapshot reports a decision asked for before the first snapshot was
// loaded.
var ErrNoSnapshot = fmt.Errorf("no snapshot of limits loaded yet: %w", ErrUnavailable)

// Request asks for a decision on one bucket.
type Request struct {
	Limit    string
	BucketID string
	// Cost is the number of tokens; 0 inspects the bucket. For a settle it
	// is what the request really used, so that a spend and its settle name
	// the same tokens with the same field.
	Cost int64
	// Reserved is, for a settle, what the request's spend took up front.
	// Other operations ignore it.
	Reserved int64
}

// Decision is the answer for one bucket of a batch. In a spend that is
// denied as a whole nothing is spent: each decision says whether its bucket
// alone allows its cost, and what the bucket holds.
type Decision struct {
	Limit string
	// BucketID is the canonical id.
	BucketID string
	Outcome
	// Params are the parameters in force: the override's or the defaults.
	// An unlimited bucket reports its limit's defaults and a full bucket.
	Params Params
	// Unit is what the limit counts (Limit.Counts).
	Unit string
	// Kind and Calendar are the limit's (Limit.KindOf, Limit.Calendar):
	// with them a front end tells what Params.Period means, a rate's
	// period, a lease's longest life or a quota's current window, to
	// describe the decision in its own terms (PolicyWindow).
	Kind     Kind
	Calendar Calendar
	Source   Source
	// Shadow decisions never deny the batch.
	Shadow bool
}

// Result is the answer for a batch.
type Result struct {
	// Allowed is true when no bucket outside shadow limits is denied.
	Allowed bool
	// RetryAfter is zero when allowed, Never when a denied bucket can never
	// succeed, else the longest retry-after of the denied buckets.
	RetryAfter time.Duration
	// ResetAfter is the longest reset-after of the buckets outside shadow
	// limits.
	ResetAfter time.Duration
	// Degraded reports that the store failed and the answer was given
	// without it, by the fail-open policy.
	Degraded bool
	// Decisions are in the order of the requests.
	Decisions []Decision
}

// Config configures a Limiter.
type Config struct {
	Store Store
	// Now reads the clock; time.Now when nil.
	Now func() time.Time
	// FailOpen answers allowed and degraded when the store fails, instead
	// of returning ErrUnavailable.
	FailOpen bool
	// DeniedCacheSize bounds the local cache of empty buckets; 0 disables it.
	DeniedCacheSize int
	// Logger receives the store's changes between failing and answering;
	// slog.Default() when nil.
	Logger *slog.Logger
	// TraceStore, when set, is called before each call to the store of a
	// decision with its operation and the names of its buckets' limits,
	// each once, so that a trace shows the call without a bucket id; the
	// call runs in the context it returns, and the func it returns is
	// called after the call with whether every bucket outside shadow
	// limits allowed its cost, and the call's error. Nil, the default,
	// costs the decision nothing.
	TraceStore func(ctx context.Context, op Op, limits []string) (context.Context, func(allowed bool, err error))
	// ObserveStore, when set, is told how long each store call of a
	// decision took and its error, for the store's latency metric. Nil
	// costs the decision nothing.
	ObserveStore func(op Op, took time.Duration, err error)
	// ObserveLease, when set, is told of leases acquired, released,
	// renewed and found expired, by limit, never by bucket.
	ObserveLease func(limit string, e LeaseEvent, n int64)
}

// Stats are the Limiter's counters since it started.
type Stats struct {
	StoreErrors    uint64
	DeniedCacheHit uint64
	// RenewalsNotFound counts renewals of leases the store did not hold:
	// expired or released, or forgotten by a failover of the store.
	RenewalsNotFound uint64
}

// Limiter answers batches of decisions from the current snapshot and the
// store. It is safe for concurrent use.
type Limiter struct {
	store   Store
	trace   func(ctx context.Context, op Op, limits []string) (context.Context, func(allowed bool, err error))
	observe func(op Op, took time.Duration, err error)
	// observeLease is Config.ObserveLease.
	observeLease func(limit string, e LeaseEvent, n int64)
	now          func() time.Time
	failOpen     bool
	log          *slog.Logger
	snap         atomic.Pointer[Snapshot]
	denied       *deniedCache
	scratch      sync.Pool
	// many pools DecideMany's working memory (*manyScratch).
	many sync.Pool

	storeDown        atomic.Bool
	storeErrors      atomic.Uint64
	renewalsNotFound atomic.Uint64
	// due are the buckets of leases to sweep as they expire (lease.go).
	due dueLeases
}

// New returns a Limiter with no snapshot: decisions fail with ErrNoSnapshot
// until SetSnapshot is called.
func New(cfg Config) *Limiter {
	l := &Limiter{store: cfg.Store, trace: cfg.TraceStore, observe: cfg.ObserveStore, observeLease: cfg.ObserveLease, now: cfg.Now, failOpen: cfg.FailOpen, log: cfg.Logger}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if cfg.DeniedCacheSize > 0 {
		l.denied = newDeniedCache(cfg.DeniedCacheSize)
	}
	l.scratch.New = func() any { return &scratch{} }
	l.many.New = func() any { return &manyScratch{refilled: map[string]struct{}{}} }
	return l
}

// SetSnapshot makes s the snapshot of every later decision.
func (l *Limiter) SetSnapshot(s *Snapshot) { l.snap.Store(s) }

// Snapshot returns the current snapshot, nil before the first.
func (l *Limiter) Snapshot() *Snapshot { return l.snap.Load() }

// FailOpen reports whether the Limiter answers allowed and degraded when
// the store fails, so that a front end applies the same policy to what it
// answers without a decision (a lease's release or renewal).
func (l *Limiter) FailOpen() bool { return l.failOpen }

// Ping reports whether the store answers.
func (l *Limiter) Ping(ctx context.Context) error { return l.store.Ping(ctx) }

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	s := Stats{StoreErrors: l.storeErrors.Load(), RenewalsNotFound: l.renewalsNotFound.Load()}
	if l.denied != nil {
		s.DeniedCacheHit = l.denied.hits.Load()
	}
	return s
}

// scratch is the per-call working memory, pooled so that a decision
// allocates nothing but its answer.
type scratch struct {
	batch []Bucket
	// epochs[p] is the denied cache's epoch of batch[p], read before the
	// store call.
	epochs []uint64
	// buf holds the bucket keys of the requests, one after the other;
	// request i's key ends at ends[i] (empty when it did not resolve).
	buf  []byte
	ends []int
	// pos[i] is the index in batch of request i, -1 when its decision
	// was made without the store, or -2-j for leases[j].
	pos []int
	// leases are the buckets of concurrency limits that a check reads.
	leases []LeaseBucket
	// quotaEnd[i] is the end of request i's window, in Unix µs, when it
	// is a calendar quota's; else 0.
	quotaEnd []int64
}

func (sc *scratch) reset() {
	sc.batch, sc.epochs, sc.buf, sc.ends, sc.pos = sc.batch[:0], sc.epochs[:0], sc.buf[:0], sc.ends[:0], sc.pos[:0]
	sc.leases, sc.quotaEnd = sc.leases[:0], sc.quotaEnd[:0]
}

// opReset resolves the buckets of Limiter.Reset, which may be of any kind.
const opReset Op = 0

// key returns the key of request i.
func (sc *scratch) key(i int) []byte {
	start := 0
	if i > 0 {
		start = sc.ends[i-1]
	}
	return sc.buf[start:sc.ends[i]]
}

// Decide answers a batch of 1 to MaxBatch requests. The decisions are
// appended to dst[:0], so that a caller answering many requests can reuse
// one slice; dst may be nil. Invalid requests give a *ValidationError
// naming every bad field; a failing store gives an error wrapping
// ErrUnavailable, unless the Limiter fails open; a caller that gives up
// (ctx ends) before the store answers gets its context's error.
func (l *Limiter) Decide(ctx context.Context, op Op, reqs []Request, dst []Decision) (Result, error) {
	if !op.Decides() {
		return Result{}, fmt.Errorf("unknown operation %d", op)
	}
	snap := l.snap.Load()
	if snap == nil {
		return Result{}, ErrNoSnapshot
	}
	now := l.now()
	sc := l.scratch.Get().(*scratch)
	defer l.scratch.Put(sc)
	sc.reset()

	decisions := slices.Grow(dst[:0], len(reqs))[:len(reqs)]
	clear(decisions)
	localDenial, err := l.resolve(snap, op, reqs, now, decisions, sc, nil)
	if err != nil {
		return Result{}, err
	}
	if len(sc.batch) > 0 {
		err = l.callStore(ctx, storeOp(op, localDenial), now, sc.batch, decisions, sc.pos)
	}
	return l.finish(ctx, op, now, decisions, sc, localDenial, err)
}

// storeOp is what the store is asked to do for op: a spend that a bucket
// decided here already denies spends nothing, so the store is only read.
func storeOp(op Op, localDenial bool) Op {
	if op == Spend && localDenial {
		return Check
	}
	return op
}

// finish completes the decisions of a resolved request once the store
// answered its batch, sc.batch, with storeErr: it reads the concurrency
// buckets of a check, applies the fail mode, and tells the denied cache.
func (l *Limiter) finish(ctx context.Context, op Op, now time.Time, decisions []Decision, sc *scratch, localDenial bool, storeErr error) (Result, error) {
	if storeErr != nil {
		return l.storeFailed(ctx, decisions, sc.pos, storeErr)
	}
	if len(sc.leases) > 0 {
		// A check of concurrency buckets reads what they hold; it needs
		// no atomicity with the rate buckets, as nothing is written.
		if err := l.store.Held(ctx, now, sc.leases); err != nil {
			l.health(ctx, err)
			return l.storeFailed(ctx, decisions, sc.pos, err)
		}
		LeaseStep(now.UnixMicro(), 0, sc.leases)
		// A full concurrency bucket denies the check as a whole, as a
		// bucket decided here does.
		for i := range sc.leases {
			localDenial = localDenial || !sc.leases[i].Outcome.Allowed && !sc.leases[i].Shadow
		}
	}
	for i, p := range sc.pos {
		switch {
		case p >= 0:
			decisions[i].Outcome = sc.batch[p].Outcome
		case p <= -2:
			decisions[i].Outcome = sc.leases[-2-p].Outcome
		}
	}
	if localDenial && (op == Spend || op == Check) && within(sc.batch) {
		// A bucket decided here, or a concurrency bucket, denies the
		// spend or check, which the rate buckets' store call did not see:
		// its buckets that allow their cost report what they hold, as
		// StepBatch reports a denied batch.
		for i, p := range sc.pos {
			if p >= 0 {
				b := &sc.batch[p]
				decisions[i].Outcome = unspent(b.Outcome, b.Cost, b.Rate)
			}
		}
	}
	for i, end := range sc.quotaEnd {
		if end != 0 {
			decisions[i].Outcome = quotaOutcome(decisions[i].Outcome, end, now.UnixMicro())
		}
	}
	res := summarize(decisions)
	l.updateDenied(op, now.UnixMicro(), sc.batch, sc.epochs)
	return res, nil
}

// updateDenied tells the denied cache the TAT of every bucket after the
// call. Those of a refund, and those a settle gave back to, are forgotten
// instead: they are fuller than before, and the cache only holds empty
// ones.
func (l *Limiter) updateDenied(op Op, nowUS int64, batch []Bucket, epochs []uint64) {
	if l.denied == nil {
		return
	}
	for i := range batch {
		b := &batch[i]
		if op == Refund || b.Next < b.TAT {
			l.denied.forget(b.Key)
			continue
		}
		now := nowUS
		if b.Now != 0 {
			now = b.Now
		}
		l.denied.remember(b.Key, b.Next, now, b.Rate, epochs[i])
	}
}

// callStore applies op to batch, whose buckets are those of the decisions
// that pos points to, and keeps the store's health.
func (l *Limiter) callStore(ctx context.Context, op Op, now time.Time, batch []Bucket, decisions []Decision, pos []int) error {
	storeCtx := ctx
	var end func(bool, error)
	if l.trace != nil {
		storeCtx, end = l.trace(ctx, op, storeLimits(nil, decisions, pos))
	}
	var start time.Time
	if l.observe != nil {
		// The wall clock's monotonic reading, not l.now, which tests step.
		start = time.Now()
	}
	_, err := l.store.Apply(storeCtx, op, now, batch)
	if l.observe != nil && !callerGone(ctx, err) {
		l.observe(op, time.Since(start), err)
	}
	if end != nil {
		end(within(batch), err)
	}
	l.health(ctx, err)
	return err
}

// callerGone reports whether err is only the cancellation of ctx, the
// caller's context: the caller went away before the store answered. That
// says nothing of the store, so it is no store error: neither counted,
// logged nor timed as one, and no fail mode answers it, since nobody waits
// for the answer. A caller's own deadline passing is not the caller going
// away: the store was slower than its caller allows (a hung store under
// Envoy's short timeouts looks only like this), so that still counts as an
// outage, as does a store's own timeout.
func callerGone(ctx context.Context, err error) bool {
	return err != nil && errors.Is(ctx.Err(), context.Canceled) && errors.Is(err, context.Canceled)
}

// storeError is the error of an operation whose store call failed with
// err: the caller's context's error when the caller gave up
// (callerGone), else one wrapping ErrUnavailable.
func storeError(ctx context.Context, err error) error {
	if callerGone(ctx, err) {
		return fmt.Errorf("the caller gave up before the store answered: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// health keeps the store's health from the error of a call made for a
// caller whose context is ctx, logging the changes between failing and
// answering. A call the caller gave up on tells neither.
func (l *Limiter) health(ctx context.Context, err error) {
	if callerGone(ctx, err) {
		return
	}
	if err != nil {
		l.storeErrors.Add(1)
		// A write the store made but could not vouch for (ErrNotDurable)
		// is no outage: the store answers, and it logs that episode
		// itself; were it counted here, the decisions it does answer in
		// between would log the outage's end and start again at the rate
		// of requests.
		if !errors.Is(err, ErrNotDurable) && !l.storeDown.Swap(true) {
			l.log.Warn("store unavailable", "err", err, "fail_open", l.failOpen)
		}
		return
	}
	if l.storeDown.Load() && l.storeDown.Swap(false) {
		l.log.Info("store answers again")
	}
}

// storeLimits appends to names the limits of the decisions that went to
// the store, each once, in the order of the batch.
func storeLimits(names []string, decisions []Decision, pos []int) []string {
	for i, p := range pos {
		if p >= 0 && !slices.Contains(names, decisions[i].Limit) {
			names = append(names, decisions[i].Limit)
		}
	}
	return names
}

// storeFailed applies the fail mode. Failing open, every bucket that needed
// the store is reported allowed with nothing known of its state; buckets
// decided without the store keep their decisions, so a blocked bucket still
// denies. A call its caller gave up on is no store failure: it fails with
// the caller's context's error whatever the mode (storeError).
func (l *Limiter) storeFailed(ctx context.Context, decisions []Decision, pos []int, err error) (Result, error) {
	if !l.failOpen || callerGone(ctx, err) {
		return Result{}, storeError(ctx, err)
	}
	for i, p := range pos {
		if p != -1 {
			decisions[i].Outcome = Outcome{Allowed: true}
		}
	}
	res := summarize(decisions)
	res.Degraded = true
	return res, nil
}

// resolve fills the decisions that need no store and the batch of those
// that do, collecting every field error. It reports whether a bucket outside
// shadow limits was denied without the store.
//
// refilled, when not nil, holds the keys of buckets that earlier requests
// of a DecideMany may have made fuller (refunds and settles): the denied
// cache, which knows the buckets as they were before those, does not
// answer for them.
func (l *Limiter) resolve(snap *Snapshot, op Op, reqs []Request, now time.Time, decisions []Decision, sc *scratch, refilled map[string]struct{}) (bool, error) {
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		return false, &ValidationError{Fields: []FieldError{{Field: "buckets", Message: "must hold 1 to " + strconv.Itoa(MaxBatch) + " buckets"}}}
	}
	// ve stays on the stack unless a field is bad.
	var ve ValidationError
	localDenial := false
	nowUS := now.UnixMicro()
	for i, req := range reqs {
		field := func(name string) string { return "buckets[" + strconv.Itoa(i) + "]" + name }
		switch {
		case op == Settle && req.Cost < 0:
			ve.Add(field(".actual"), "must be at least 0")
		case req.Cost < 0:
			ve.Add(field(".cost"), "must be at least 0")
		}
		if op == Settle && req.Reserved < 0 {
			ve.Add(field(".reserved"), "must be at least 0")
		}
		r, buf, err := snap.resolve(sc.buf, req.Limit, req.BucketID, nowUS)
		if err != nil {
			var fe FieldError
			if !errors.As(err, &fe) {
				return false, err
			}
			ve.Add(field("."+fe.Field), fe.Message)
			sc.ends = append(sc.ends, len(sc.buf))
			sc.quotaEnd = append(sc.quotaEnd, 0)
			continue
		}
		sc.buf = buf
		sc.ends = append(sc.ends, len(buf))
		sc.quotaEnd = append(sc.quotaEnd, 0)
		key := sc.key(i)
		for j := range i {
			if bytes.Equal(sc.key(j), key) {
				ve.Add(field(""), "same bucket as buckets["+strconv.Itoa(j)+"]")
			}
		}
		lease := r.Limit.KindOf() == KindConcurrency
		if lease && op != Check && op != opReset {
			ve.Add(field(".limit"), "is a concurrency limit: acquire, release and renew hold its units")
		}
		if len(ve.Fields) > 0 {
			continue
		}
		d := &decisions[i]
		d.Limit, d.BucketID, d.Params, d.Source, d.Shadow = r.Limit.Name, r.BucketID, r.Params, r.Source, r.Limit.Shadow
		d.Unit, d.Kind, d.Calendar = r.Limit.Counts(), r.Limit.KindOf(), r.Limit.Calendar
		rate, bucketNow := Rate{}, int64(0)
		if r.Limit.Quota() {
			var length time.Duration
			bucketNow, length = quotaNow(r.Limit.Calendar, r.zone, now)
			rate, d.Params.Period, sc.quotaEnd[i] = quotaRate(r.Params.Count), length, bucketNow
		} else if !lease {
			rate = r.Params.Rate()
		}
		switch {
		case r.Source == SourceUnlimited:
			d.Outcome = Outcome{Allowed: true, Remaining: r.Params.Burst}
		case lease:
			sc.pos = append(sc.pos, -2-len(sc.leases))
			sc.leases = append(sc.leases, LeaseBucket{Burst: r.Params.Burst, Cost: req.Cost, Shadow: r.Limit.Shadow})
			continue
		case r.Params.Burst == 0:
			// A blocked bucket holds nothing a store could change.
			b := [1]Bucket{{Rate: rate, Cost: req.Cost, Reserved: req.Reserved}}
			StepBatch(op, nowUS, b[:])
			d.Outcome = b[0].Outcome
		case (op == Spend || op == Check) && !has(refilled, key) && l.denied.deny(key, cmp.Or(bucketNow, nowUS), rate, req.Cost, &d.Outcome):
		default:
			sc.pos = append(sc.pos, len(sc.batch))
			sc.batch = append(sc.batch, Bucket{Rate: rate, Cost: req.Cost, Reserved: req.Reserved, Shadow: r.Limit.Shadow, Now: bucketNow})
			sc.epochs = append(sc.epochs, l.denied.epoch(key))
			continue
		}
		sc.pos = append(sc.pos, -1)
		localDenial = localDenial || !d.Allowed && !d.Shadow
	}
	if len(ve.Fields) > 0 {
		return false, &ValidationError{Fields: ve.Fields}
	}
	// Keys are set only now: appending to buf may have moved it.
	for i, p := range sc.pos {
		switch {
		case p >= 0:
			sc.batch[p].Key = sc.key(i)
		case p <= -2:
			sc.leases[-2-p].Key = sc.key(i)
		}
	}
	return localDenial, nil
}

// summarize computes the answer of a batch from its decisions.
func summarize(decisions []Decision) Result {
	res := Result{Allowed: true, Decisions: decisions}
	for i := range decisions {
		d := &decisions[i]
		if d.Shadow {
			continue
		}
		res.ResetAfter = max(res.ResetAfter, d.ResetAfter)
		if d.Allowed {
			continue
		}
		switch {
		case d.RetryAfter == Never:
			res.RetryAfter = Never
		case res.RetryAfter != Never:
			res.RetryAfter = max(res.RetryAfter, d.RetryAfter)
		}
		res.Allowed = false
	}
	return res
}

// Reset makes the buckets full again and returns how many it reset. Cost is
// ignored.
func (l *Limiter) Reset(ctx context.Context, reqs []Request) (int, error) {
	snap := l.snap.Load()
	if snap == nil {
		return 0, ErrNoSnapshot
	}
	sc := l.scratch.Get().(*scratch)
	defer l.scratch.Put(sc)
	sc.reset()
	decisions := make([]Decision, len(reqs))
	if _, err := l.resolve(snap, opReset, reqs, l.now(), decisions, sc, nil); err != nil {
		return 0, err
	}
	keys := make([]string, len(reqs))
	for i := range reqs {
		keys[i] = string(sc.key(i))
	}
	if err := l.store.Reset(ctx, keys); err != nil {
		return 0, storeError(ctx, err)
	}
	for i := range reqs {
		l.denied.forget(sc.key(i))
	}
	return len(keys), nil
}
