package limiter

import "time"

// MostRestrictive picks the decision that the RateLimit headers
// describe, -1 for none: every front end (REST, Envoy's gRPC) shows the
// same one. Shadow
// buckets never restrict and unlimited ones have no limit. Of the denied
// buckets it is the one with the longest retry-after (one that can never
// succeed first); when none is denied, the one with the fewest tokens
// left. A degraded answer knows nothing of the buckets it allowed, so only
// a denied bucket can be described. A refund denies nothing: its buckets
// compete on tokens left.
func (r Result) MostRestrictive(op Op) int {
	best, bestDenied := -1, false
	for i := range r.Decisions {
		d := &r.Decisions[i]
		if d.Shadow || d.Source == SourceUnlimited {
			continue
		}
		denied := !d.Allowed && op != Refund
		if r.Degraded && !denied {
			continue
		}
		if best < 0 {
			best, bestDenied = i, denied
			continue
		}
		b := &r.Decisions[best]
		switch {
		case denied && !bestDenied,
			denied && longerRetry(d.RetryAfter, b.RetryAfter),
			!denied && !bestDenied && d.Remaining < b.Remaining:
			best, bestDenied = i, denied
		}
	}
	return best
}

// longerRetry reports whether retry-after a is longer than b; Never is the
// longest.
func longerRetry(a, b time.Duration) bool {
	switch {
	case b == Never:
		return false
	case a == Never:
		return true
	}
	return a > b
}

// UntilReset is the RateLimit header's t: the draft's reset is when the
// client may send again, so for a denied bucket it is the time until this
// cost would be allowed (its section 6 and example B.1.4), and for an
// allowed one the time until the bucket is full. A bucket that can never
// take the cost has no such time: it says when the bucket is full.
func (d *Decision) UntilReset(op Op) time.Duration {
	if !d.Allowed && op != Refund && d.RetryAfter > 0 && d.RetryAfter != Never {
		return d.RetryAfter
	}
	return d.ResetAfter
}

// PolicyWindow is the RateLimit-Policy header's w: the time over which
// the decision's burst is its quota. For a rate limit it is the time an
// empty bucket takes to fill, burst·T (a blocked bucket, burst 0, has
// none: its quota of 0 is given over the period); for a calendar quota,
// the current window's length; for a concurrency limit, its period, the
// longest a lease holds its units without renewal.
func (d *Decision) PolicyWindow() time.Duration {
	if d.Calendar != "" || d.Kind == KindConcurrency {
		return d.Params.Period
	}
	if w := time.Duration(d.Params.Rate().Offset()) * time.Microsecond; w > 0 {
		return w
	}
	return d.Params.Period
}
