package limiter

import (
	"strconv"
	"time"
)

// maxBurstOffset bounds burst·T. It keeps every TAT far inside both int64
// microseconds and the 2^53 integers that Redis' Lua numbers hold exactly.
const maxBurstOffset = 100 * 365 * 24 * time.Hour

// Params are the GCRA parameters of a bucket: Count requests per Period on
// average, and at most Burst at once.
type Params struct {
	Burst  int64
	Count  int64
	Period time.Duration
}

// Validate returns the field errors of p, named "burst", "count" and
// "period". Limits need a burst of at least 1; an override may block its
// bucket with burst 0, which blockable allows.
func (p Params) Validate(blockable bool) []FieldError {
	var ve ValidationError
	minBurst := int64(1)
	if blockable {
		minBurst = 0
	}
	if p.Burst < minBurst {
		ve.Add("burst", "must be at least "+strconv.FormatInt(minBurst, 10))
	}
	if p.Count < 1 {
		ve.Add("count", "must be at least 1")
	}
	if p.Period <= 0 {
		ve.Add("period", "must be a positive duration")
	}
	if len(ve.Fields) > 0 {
		return ve.Fields
	}
	interval := p.Period / time.Duration(p.Count)
	if interval < time.Microsecond {
		ve.Add("period", "period / count must be at least 1µs")
		ve.Add("count", "period / count must be at least 1µs")
		return ve.Fields
	}
	if p.Burst > int64(maxBurstOffset/interval) || time.Duration(p.Burst)*interval >= maxBurstOffset {
		ve.Add("burst", "burst * period / count must be below 100 years")
	}
	return ve.Fields
}

// Rate converts p into the integer microseconds of the GCRA. The interval is
// rounded down to a whole microsecond, which Validate guarantees is at least
// one; the bucket refills at most 1µs per token faster than nominal.
func (p Params) Rate() Rate {
	return Rate{Interval: p.Period.Microseconds() / p.Count, Burst: p.Burst}
}

// Rate holds a bucket's GCRA parameters in the unit of stored TATs: the
// emission interval T in microseconds and the burst in tokens.
type Rate struct {
	Interval int64
	Burst    int64
}

// Offset is burst·T, how far ahead of now a TAT may run: a bucket whose TAT
// is now+Offset is empty.
func (r Rate) Offset() int64 { return r.Burst * r.Interval }
