package limiter

import "time"

// The generic cell rate algorithm keeps one number per bucket: its
// theoretical arrival time (TAT), the moment at which the bucket is full
// again. A TAT at or before now, or none at all, is a full bucket. With the
// emission interval T = period/count, a request of cost c at now moves the
// TAT to max(TAT, now) + c·T and is allowed while that is at most burst·T
// ahead of now. Times here are integer microseconds since the Unix epoch,
// the unit the stores keep, so that the Go and Lua versions compute the same
// numbers.

// Op is what a decision does to its buckets.
type Op uint8

// The operations of a decision.
const (
	// Check answers as Spend would, changing nothing.
	Check Op = iota + 1
	// Spend takes the cost from every bucket of a batch, or from none.
	Spend
	// Refund gives the cost back to every bucket, never past full.
	Refund
	// Settle charges what requests really cost once that is known: it
	// gives back what was reserved beyond it, or charges the excess even
	// past empty, up to one burst of debt.
	Settle
	// Acquire, Release and Renew are the operations on leases (lease.go),
	// which a Call of DecideMany names beside those above; a Store's
	// Apply takes none of them.
	Acquire
	Release
	Renew
	// Mixed names, in the store's metrics and traces, a call of
	// Store.ApplyMany whose batches are of several operations.
	Mixed
)

// String returns the lower-case name used in metrics and logs.
func (o Op) String() string {
	switch o {
	case Check:
		return "check"
	case Spend:
		return "spend"
	case Refund:
		return "refund"
	case Settle:
		return "settle"
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Renew:
		return "renew"
	case Mixed:
		return "mixed"
	}
	return "unknown"
}

// Reason says why a bucket was denied.
type Reason string

// The reasons of a denial.
const (
	// ReasonLimited: the bucket has fewer tokens than the cost; retrying
	// after RetryAfter succeeds unless others spend first.
	ReasonLimited Reason = "limited"
	// ReasonBlocked: an override with burst 0 blocks the bucket.
	ReasonBlocked Reason = "blocked"
	// ReasonCostExceedsBurst: the cost is above the burst, so the request
	// can never be allowed.
	ReasonCostExceedsBurst Reason = "cost_exceeds_burst"
)

// Never is the RetryAfter of a request that can never succeed.
const Never time.Duration = -1

// Outcome is what the GCRA says about one bucket.
type Outcome struct {
	// Allowed reports that a spend or check may proceed, that a refund
	// gave something back, or that a settle was applied (always, but on a
	// blocked bucket).
	Allowed bool
	// Reason is empty when Allowed, and for refunds.
	Reason Reason
	// Remaining is the number of whole tokens left after the request.
	Remaining int64
	// Debt is the number of tokens owed beyond empty after the request,
	// rounded up, so that it is 0 exactly when the bucket is not in debt.
	// A settle puts a bucket at most one burst into debt; a lowered limit
	// can leave more.
	Debt int64
	// Capped reports that a settle charged less than its excess, because
	// the rest would have put the bucket more than one burst into debt.
	Capped bool
	// RetryAfter is zero when allowed, Never when the request can never
	// succeed, else the time until this cost would be allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the bucket is full again: for a lease
	// bucket, until its last lease expires; for a calendar quota, until
	// its window ends.
	ResetAfter time.Duration
	// Held is the units a lease bucket holds after the request; 0 for
	// the other kinds.
	Held int64
}

// SpendStep applies a spend of cost at now to a bucket whose stored TAT is
// tat. It returns the TAT to store, which is tat itself when nothing is to
// be written (a denial, or cost 0), and the outcome. A check is the same
// step with its TAT discarded.
func SpendStep(tat, now int64, r Rate, cost int64) (int64, Outcome) {
	offset := r.Offset()
	t := max(tat, now)
	ahead := t - now
	switch {
	case r.Burst == 0 && cost > 0:
		return tat, Outcome{Reason: ReasonBlocked, RetryAfter: Never}
	case cost > r.Burst:
		return tat, Outcome{
			Reason:     ReasonCostExceedsBurst,
			Remaining:  tokens(offset-ahead, r.Interval),
			Debt:       owed(ahead-offset, r.Interval),
			RetryAfter: Never,
			ResetAfter: micros(ahead),
		}
	}
	next := t + cost*r.Interval
	if next-now > offset {
		return tat, Outcome{
			Reason:     ReasonLimited,
			Remaining:  tokens(offset-ahead, r.Interval),
			Debt:       owed(ahead-offset, r.Interval),
			RetryAfter: micros(next - now - offset),
			ResetAfter: micros(ahead),
		}
	}
	out := Outcome{Allowed: true, Remaining: tokens(offset-(next-now), r.Interval), ResetAfter: micros(next - now)}
	if cost == 0 {
		return tat, out
	}
	return next, out
}

// RefundStep gives cost tokens back to a bucket whose stored TAT is tat,
// never past full. It returns the TAT to store (at most now when the bucket
// is full, which a store may delete) and the outcome, allowed when anything
// was given back.
func RefundStep(tat, now int64, r Rate, cost int64) (int64, Outcome) {
	t := max(tat, now)
	ahead := t - now
	if cost <= 0 || ahead == 0 || r.Burst == 0 {
		return tat, held(ahead, r, Outcome{})
	}
	next := now
	// Compare in tokens first so that cost·T cannot overflow.
	if cost < (ahead+r.Interval-1)/r.Interval {
		next = t - cost*r.Interval
	}
	return next, held(next-now, r, Outcome{Allowed: true})
}

// SettleStep settles a request that reserved tokens up front and used
// actual, both at least 0, on a bucket whose stored TAT is tat. Using less
// gives the difference back as RefundStep does; using more charges the
// excess even past empty, so that the bucket goes into debt, but never
// beyond now + 2·burst·T: the rest is dropped and the outcome Capped. A
// settle is allowed on any bucket but a blocked one (burst 0), which it
// leaves alone. It returns the TAT to store, tat itself when nothing
// changes, and the outcome.
func SettleStep(tat, now int64, r Rate, reserved, actual int64) (int64, Outcome) {
	if r.Burst == 0 {
		return tat, Outcome{Reason: ReasonBlocked, RetryAfter: Never}
	}
	if actual < reserved {
		next, out := RefundStep(tat, now, r, reserved-actual)
		out.Allowed = true
		return next, out
	}
	t := max(tat, now)
	next, capped := tat, false
	if excess := actual - reserved; excess > 0 {
		limit := now + 2*r.Offset()
		switch {
		case t >= limit:
			// Already a burst in debt, or more after a lowered limit:
			// nothing more is charged, and the TAT never moves back.
			capped = true
		case excess > (limit-t)/r.Interval: // excess·T > limit - t, without overflow
			next, capped = limit, true
		default:
			next = t + excess*r.Interval
		}
	}
	return next, held(max(next, now)-now, r, Outcome{Allowed: true, Capped: capped})
}

// held fills in what a bucket whose TAT runs ahead of now holds.
func held(ahead int64, r Rate, out Outcome) Outcome {
	out.Remaining = tokens(r.Offset()-ahead, r.Interval)
	out.Debt = owed(ahead-r.Offset(), r.Interval)
	out.ResetAfter = micros(ahead)
	return out
}

// StepBatch applies op's step at batchNow (or the bucket's own Now) to every bucket of a batch whose TATs
// a store has just read into Bucket.TAT, and sets each bucket's Next and
// Outcome. It reports whether the batch is to be written: always for
// Refund and Settle, never for Check, and for Spend when every bucket that
// is not Shadow allows its cost. A batch that is not written keeps its
// TATs (Next is TAT); when a bucket outside shadow limits denies it, the
// buckets that allowed their cost report what they hold, since the batch
// as a whole spends nothing. Every Store decides with it, so that
// each bucket's step is computed once.
func StepBatch(op Op, batchNow int64, batch []Bucket) bool {
	for i := range batch {
		b := &batch[i]
		now := batchNow
		if b.Now != 0 {
			now = b.Now
		}
		switch op {
		case Refund:
			b.Next, b.Outcome = RefundStep(b.TAT, now, b.Rate, b.Cost)
		case Settle:
			b.Next, b.Outcome = SettleStep(b.TAT, now, b.Rate, b.Reserved, b.Cost)
		default:
			b.Next, b.Outcome = SpendStep(b.TAT, now, b.Rate, b.Cost)
		}
	}
	within := op == Refund || op == Settle || within(batch)
	if op == Refund || op == Settle || op == Spend && within {
		return true
	}
	for i := range batch {
		b := &batch[i]
		b.Next = b.TAT
		if !within {
			b.Outcome = unspent(b.Outcome, b.Cost, b.Rate)
		}
	}
	return false
}

// within reports whether every bucket outside shadow limits allows its
// cost.
func within(batch []Bucket) bool {
	for i := range batch {
		if !batch[i].Outcome.Allowed && !batch[i].Shadow {
			return false
		}
	}
	return true
}

// unspent turns the outcome of a spend that its bucket allowed, but that
// was not made, into what the bucket holds: the cost is still there.
func unspent(out Outcome, cost int64, r Rate) Outcome {
	if !out.Allowed {
		return out
	}
	out.Remaining += cost
	out.ResetAfter -= micros(cost * r.Interval)
	return out
}

// tokens converts the room left in a bucket into whole tokens, never
// negative: a bucket can hold more than its burst when its limit was lowered
// after it was spent.
func tokens(room, interval int64) int64 {
	if room <= 0 {
		return 0
	}
	return room / interval
}

// owed converts how far a TAT runs beyond empty into whole tokens, rounded
// up, never negative.
func owed(beyond, interval int64) int64 {
	if beyond <= 0 {
		return 0
	}
	return (beyond + interval - 1) / interval
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
