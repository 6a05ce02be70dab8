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
	// Allowed reports that a spend or check may proceed, or that a refund
	// gave something back.
	Allowed bool
	// Reason is empty when Allowed, and for refunds.
	Reason Reason
	// Remaining is the number of whole tokens left after the request.
	Remaining int64
	// RetryAfter is zero when allowed, Never when the request can never
	// succeed, else the time until this cost would be allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the bucket is full again.
	ResetAfter time.Duration
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
			RetryAfter: Never,
			ResetAfter: micros(ahead),
		}
	}
	next := t + cost*r.Interval
	if next-now > offset {
		return tat, Outcome{
			Reason:     ReasonLimited,
			Remaining:  tokens(offset-ahead, r.Interval),
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
		return tat, Outcome{Remaining: tokens(r.Offset()-ahead, r.Interval), ResetAfter: micros(ahead)}
	}
	next := now
	// Compare in tokens first so that cost·T cannot overflow.
	if cost < (ahead+r.Interval-1)/r.Interval {
		next = t - cost*r.Interval
	}
	return next, Outcome{Allowed: true, Remaining: tokens(r.Offset()-(next-now), r.Interval), ResetAfter: micros(next - now)}
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

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
