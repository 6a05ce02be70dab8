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
// minutes, the shift cuts the hour it falls in.
func window(c Calendar, zone *time.Location, now time.Time) (start, end time.Time) {
	local := now.In(zone)
	if c == CalendarHour {
		_, offset := local.Zone()
		shift := time.Duration(offset%3600) * time.Second
		start = now.Add(shift).Truncate(time.Hour).Add(-shift)
		end = start.Add(time.Hour)
		// In a zone that shifts by 30 minutes, the hours on either side
		// of the shift are aligned differently: the shift cuts them, so
		// that no two windows overlap. (A shift by whole hours keeps the
		// alignment, even where it happens at an odd minute.)
		from, to := local.ZoneBounds()
		switch {
		case !from.IsZero() && from.After(start) && otherAlignment(from.Add(-time.Nanosecond), zone, offset):
			start = from
		case !to.IsZero() && to.Before(end) && otherAlignment(to, zone, offset):
			end = to
		}
		return start, end
	}
	y, m, d := local.Date()
	// boundary(k) is the start of the k-th window after the one whose
	// local date now shows.
	var boundary func(k int) time.Time
	switch c {
	case CalendarDay:
		boundary = func(k int) time.Time { return midnight(y, m, d+k, zone) }
	case CalendarWeek:
		back := (int(local.Weekday()) + 6) % 7 // days since Monday
		boundary = func(k int) time.Time { return midnight(y, m, d-back+7*k, zone) }
	case CalendarMonth:
		boundary = func(k int) time.Time { return midnight(y, m+time.Month(k), 1, zone) }
	default: // CalendarYear; Validate admits no other
		boundary = func(k int) time.Time { return midnight(y+k, 1, 1, zone) }
	}
	start, end = boundary(0), boundary(1)
	// A clock set back across midnight shows the day before again, after
	// the next day has begun (St. John's did, at 00:01): windows follow
	// the instants, so such a time is in the next day's window.
	for k := 2; !now.Before(end) && k < 4; k++ {
		start, end = end, boundary(k)
	}
	return start, end
}

// otherAlignment reports whether the offset at t aligns hours otherwise
// than offset does.
func otherAlignment(t time.Time, zone *time.Location, offset int) bool {
	_, o := t.In(zone).Zone()
	return (o-offset)%3600 != 0
}

// midnight returns the first instant at which the zone's clock shows a
// date from y-m-d on. time.Date alone does not: where a zone skips
// midnight (a daylight-saving change at 00:00, Kiritimati's 40 minutes in
// 1979) or the whole day (Samoa skipped 30 December 2011), it may give an
// instant of the day before, and where midnight comes twice (Paris set
// its clocks back from 01:00 to 00:00 in 1976) it may give the second.
// The zone's changes around the instant it gives say where the day
// really starts.
func midnight(y int, m time.Month, d int, zone *time.Location) time.Time {
	want := days(y, m, d)
	t := time.Date(y, m, d, 0, 0, 0, 0, zone)
	if ty, tm, td := t.Date(); days(ty, tm, td) < want {
		// Midnight was skipped: the day starts when the clock jumps.
		if _, change := t.ZoneBounds(); !change.IsZero() {
			return change
		}
		return t
	}
	// Midnight came twice when the offset before t's period also shows
	// it, before the change.
	if change, _ := t.ZoneBounds(); !change.IsZero() {
		_, before := change.Add(-time.Nanosecond).Zone()
		first := time.Date(y, m, d, 0, 0, 0, 0, time.FixedZone("", before)).In(zone)
		if fy, fm, fd := first.Date(); first.Before(change) && days(fy, fm, fd) == want {
			return first
		}
	}
	return t
}

// days numbers a date of the proleptic Gregorian calendar, so that dates
// compare as integers, month and day overflow normalised.
func days(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
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
