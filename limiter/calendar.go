package limiter

import "time"

// A calendar quota counts units in fixed windows, yet it runs on the same
// stores and the same GCRA step as a rate limit, so that every store keeps
// it exactly as it keeps a TAT, with the same atomic batches. The trick is
// the clock the step is given: within a window, a quota bucket's "now" is
// the window's end, and its emission interval is one microsecond, its burst
// the count. Time never moves inside the window, so nothing refills; the
// TAT runs ahead of the window's end by exactly the units used, a settle's
// debt included (at most 2·count, which maxQuota keeps below the length of
// the next window). When the next window starts, its "now" is its own end,
// which lies beyond every TAT the last window could have left: the bucket is
// full again without anyone writing it. A stored TAT is never before the
// real time while the window has usage, so every store keeps it until the
// window ends (Redis expires a key at its TAT); and since the units are
// microseconds whatever the count, an override that changes the count
// mid-window keeps what was used.

// quotaRate is the Rate of a quota bucket of count units.
func quotaRate(count int64) Rate { return Rate{Interval: 1, Burst: count} }

// window returns the start and end of the window of calendar c in zone
// that holds now.
//
// Days, weeks, months and years start at local midnight (Monday for a
// week, the 1st for a month, 1 January for a year), so that a day across a
// daylight-saving change lasts 23 or 25 hours and each month its own
// length. Hours are real hours aligned to the zone's offset: in a zone
// whose offset is whole hours they are the UTC hours, and a repeated hour
// of a fall-back day is two windows. In the few zones that shift by 30
// minutes, the hour of the shift is cut short.
func window(c Calendar, zone *time.Location, now time.Time) (start, end time.Time) {
	local := now.In(zone)
	if c == CalendarHour {
		_, offset := local.Zone()
		shift := time.Duration(offset%3600) * time.Second
		start = now.Add(shift).Truncate(time.Hour).Add(-shift)
		return start, start.Add(time.Hour)
	}
	y, m, d := local.Date()
	switch c {
	case CalendarDay:
		start, end = midnight(y, m, d, zone), midnight(y, m, d+1, zone)
	case CalendarWeek:
		back := (int(local.Weekday()) + 6) % 7 // days since Monday
		start, end = midnight(y, m, d-back, zone), midnight(y, m, d-back+7, zone)
	case CalendarMonth:
		start, end = midnight(y, m, 1, zone), midnight(y, m+1, 1, zone)
	default: // CalendarYear; Validate admits no other
		start, end = midnight(y, 1, 1, zone), midnight(y+1, 1, 1, zone)
	}
	return start, end
}

// midnight returns the first instant of a local date. Where a zone skips
// midnight (a daylight-saving change at 00:00), the day starts when its
// clock does, which time.Date may place an hour early; the start is then
// taken as the first instant whose local date is that day.
func midnight(y int, m time.Month, d int, zone *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, zone)
	if _, _, dd := t.Date(); dd != time.Date(y, m, d, 12, 0, 0, 0, zone).Day() {
		// time.Date gave an instant of the day before: the day's clock
		// starts after the skipped hour.
		t = t.Add(time.Hour)
	}
	return t
}

// quotaNow converts the real time of a quota decision into the clock of
// its bucket (its window's end, in Unix µs), and returns the window's
// length, which a decision reports as its period.
func quotaNow(c Calendar, zone *time.Location, now time.Time) (int64, time.Duration) {
	start, end := window(c, zone, now)
	return end.UnixMicro(), end.Sub(start)
}

// quotaOutcome turns what the GCRA step said of a quota bucket on its
// frozen clock into what a client needs: the window resets at its end,
// and a denied cost that fits the count is allowed from then.
func quotaOutcome(out Outcome, end, nowUS int64) Outcome {
	out.ResetAfter = micros(end - nowUS)
	if !out.Allowed && out.RetryAfter != Never && out.Reason != "" {
		out.RetryAfter = out.ResetAfter
	}
	return out
}
