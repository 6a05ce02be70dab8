package limiter

import (
	"strconv"
	"time"
)

// Kind is what a limit bounds: the rate of its buckets (GCRA) or how many
// units each holds at once (leases).
type Kind string

// The kinds of limits. A limit's kind is fixed at creation.
const (
	KindRate        Kind = "rate"
	KindConcurrency Kind = "concurrency"
)

// Calendar is the window of a calendar quota; empty for a limit that is
// no quota.
type Calendar string

// The calendar windows: each starts at the boundary in the quota's zone.
const (
	CalendarHour  Calendar = "hour"
	CalendarDay   Calendar = "day"
	CalendarWeek  Calendar = "week"
	CalendarMonth Calendar = "month"
	CalendarYear  Calendar = "year"
)

// Lease periods: a concurrency limit's period is the longest a lease lives
// without renewal.
const (
	MinLeasePeriod = time.Second
	MaxLeasePeriod = 24 * time.Hour
)

// maxQuota is the largest count of each calendar. A quota keeps its usage
// as a TAT that runs ahead of the window's end by one microsecond per unit
// (calendar.go), and at most 2·count (a settle's debt) must fit in the next
// window: count is at most half the shortest window each calendar can have
// in any zone, with room for zones that shift by 30 minutes or skipped a
// day.
var maxQuota = map[Calendar]int64{
	CalendarHour:  int64(30*time.Minute/time.Microsecond) / 2,
	CalendarDay:   int64(20*time.Hour/time.Microsecond) / 2,
	CalendarWeek:  int64(6*24*time.Hour/time.Microsecond) / 2,
	CalendarMonth: int64(27*24*time.Hour/time.Microsecond) / 2,
	CalendarYear:  int64(364*24*time.Hour/time.Microsecond) / 2,
}

// KindOf returns the limit's kind, KindRate when it names none, so that
// code that builds limits without caring makes rate limits.
func (l Limit) KindOf() Kind {
	if l.Kind == "" {
		return KindRate
	}
	return l.Kind
}

// Quota reports whether the limit is a calendar quota.
func (l Limit) Quota() bool { return l.Calendar != "" }

// validateKind adds the field errors of the limit's kind, calendar and
// zone, and of its parameters as they read for that kind.
func (l Limit) validateKind(ve *ValidationError) {
	switch l.KindOf() {
	case KindRate:
	case KindConcurrency:
		if l.Quota() {
			ve.Add("calendar", "a concurrency limit cannot be a calendar quota")
		}
	default:
		// "quota" is the guess of whoever reads of calendar quotas: say
		// how to make one.
		ve.Add("kind", `must be rate or concurrency; a calendar quota is kind "rate" with "calendar" set to hour, day, week, month or year`)
		return
	}
	if l.Quota() {
		if _, ok := maxQuota[l.Calendar]; !ok {
			ve.Add("calendar", "must be hour, day, week, month or year")
			return
		}
		if _, msg := LoadZone(l.TimeZone); msg != "" {
			ve.Add("time_zone", msg)
		}
	} else if l.TimeZone != "" {
		ve.Add("time_zone", "only a calendar quota has a time zone")
	}
	ve.Fields = append(ve.Fields, l.ParamsProblems(l.Params, false)...)
}

// ParamsProblems returns the field errors of p as the parameters of the
// limit's buckets: its defaults, or an override's when blockable (burst 0
// blocks a bucket). A rate limit needs Params.Validate; a concurrency
// limit holds at most burst units, count equal to burst, for leases of 1 s
// to 24 h; a quota counts count units per window, burst equal to count, and
// has no period.
func (l Limit) ParamsProblems(p Params, blockable bool) []FieldError {
	var ve ValidationError
	minBurst := int64(1)
	if blockable {
		minBurst = 0
	}
	switch {
	case l.Quota():
		if p.Count < minBurst {
			ve.Add("count", "must be at least "+strconv.FormatInt(minBurst, 10))
		} else if most := maxQuota[l.Calendar]; p.Count > most {
			ve.Add("count", "must be at most "+strconv.FormatInt(most, 10)+" per "+string(l.Calendar))
		}
		if p.Burst != p.Count {
			ve.Add("burst", "must equal count for a calendar quota")
		}
		if p.Period != 0 {
			ve.Add("period", "a calendar quota has no period: its window is the calendar's")
		}
	case l.KindOf() == KindConcurrency:
		if p.Burst < minBurst {
			ve.Add("burst", "must be at least "+strconv.FormatInt(minBurst, 10))
		} else if p.Burst > MaxCost {
			ve.Add("burst", "must be at most "+strconv.FormatInt(MaxCost, 10))
		}
		if p.Count != p.Burst {
			ve.Add("count", "must equal burst for a concurrency limit")
		}
		if p.Period < MinLeasePeriod || p.Period > MaxLeasePeriod {
			ve.Add("period", "must be between 1s and 24h for a concurrency limit: the longest a lease lives")
		}
	default:
		return p.Validate(blockable)
	}
	return ve.Fields
}
