package limiter_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, msg := limiter.LoadZone(name)
	if msg != "" {
		t.Fatalf("%s: %s", name, msg)
	}
	return loc
}

func quota(name string, enum int, c limiter.Calendar, tz string, count int64) limiter.Limit {
	return limiter.Limit{Name: name, Enum: enum, IDFormat: limiter.String, Calendar: c, TimeZone: tz,
		Params: limiter.Params{Burst: count, Count: count}}
}

// TestWindows checks the windows' boundaries and lengths across a
// daylight-saving change, month ends and 29 February.
func TestWindows(t *testing.T) {
	paris := zone(t, "Europe/Paris")
	for _, c := range []struct {
		cal        limiter.Calendar
		zone       string
		at         string // RFC 3339
		start, end string
		length     time.Duration
	}{
		{limiter.CalendarDay, "Europe/Paris", "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
		{limiter.CalendarDay, "Europe/Paris", "2026-10-25T23:59:59+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 25 * time.Hour},
		{limiter.CalendarDay, "America/New_York", "2026-11-01T01:30:00-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 25 * time.Hour},
		{limiter.CalendarMonth, "UTC", "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{limiter.CalendarMonth, "UTC", "2027-02-28T10:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{limiter.CalendarMonth, "Europe/Paris", "2026-12-31T23:30:00+01:00", "2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00", 31 * 24 * time.Hour},
		{limiter.CalendarWeek, "Europe/Paris", "2026-11-29T20:00:00+01:00", "2026-11-23T00:00:00+01:00", "2026-11-30T00:00:00+01:00", 7 * 24 * time.Hour},
		{limiter.CalendarWeek, "UTC", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 7 * 24 * time.Hour},
		{limiter.CalendarYear, "UTC", "2028-06-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z", 366 * 24 * time.Hour},
		{limiter.CalendarHour, "Asia/Kolkata", "2026-11-25T10:45:00+05:30", "2026-11-25T10:00:00+05:30", "2026-11-25T11:00:00+05:30", time.Hour},
		{limiter.CalendarHour, "Europe/Paris", "2026-10-25T02:30:00+01:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00", time.Hour},
		// America/Sao_Paulo skipped midnight on 2018-11-04: the day began at 01:00.
		{limiter.CalendarDay, "America/Sao_Paulo", "2018-11-04T12:00:00-02:00", "2018-11-04T01:00:00-02:00", "2018-11-05T00:00:00-02:00", 23 * time.Hour},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		start, end, length := limiter.Window(c.cal, zone(t, c.zone), at)
		ws, _ := time.Parse(time.RFC3339, c.start)
		we, _ := time.Parse(time.RFC3339, c.end)
		if !start.Equal(ws) || !end.Equal(we) || length != c.length {
			t.Errorf("%s in %s at %s: [%s, %s) %s, want [%s, %s) %s", c.cal, c.zone, c.at, start, end, length, ws, we, c.length)
		}
	}
	// Consecutive windows tile time, whatever the zone does.
	for _, cal := range []limiter.Calendar{limiter.CalendarHour, limiter.CalendarDay, limiter.CalendarWeek, limiter.CalendarMonth} {
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, paris)
		_, end, _ := limiter.Window(cal, paris, at)
		for range 400 {
			start, next, _ := limiter.Window(cal, paris, end)
			if !start.Equal(end) || !next.After(start) {
				t.Fatalf("%s: window after %s is [%s, %s)", cal, end, start, next)
			}
			end = next
		}
	}
}

// TestQuotaStory spends a daily quota in Paris across its day's end.
func TestQuotaStory(t *testing.T) {
	snap := build(t, []limiter.Limit{quota("Daily", 120, limiter.CalendarDay, "Europe/Paris", 3)})
	f := newFixture(t, limiter.Config{DeniedCacheSize: 100}, snap)
	paris := zone(t, "Europe/Paris")
	f.now = time.Date(2026, 10, 25, 22, 0, 0, 0, paris) // a 25-hour day, 2 hours before its end
	for i := range 3 {
		res := f.decide(t, limiter.Spend, req("Daily", "a", 1))
		if d := res.Decisions[0]; !res.Allowed || d.Remaining != int64(2-i) || d.ResetAfter != 2*time.Hour || d.Params.Period != 25*time.Hour {
			t.Fatalf("spend %d: %+v", i, d)
		}
	}
	for range 2 { // the second is answered by the denied cache
		res := f.decide(t, limiter.Spend, req("Daily", "a", 1))
		if d := res.Decisions[0]; res.Allowed || d.Reason != limiter.ReasonLimited || d.RetryAfter != 2*time.Hour || d.ResetAfter != 2*time.Hour {
			t.Fatalf("over quota: %+v", d)
		}
	}
	// A settle charges past the count, up to twice it.
	res := f.decide(t, limiter.Settle, limiter.Request{Limit: "Daily", BucketID: "a", Reserved: 0, Cost: 10})
	if d := res.Decisions[0]; !d.Allowed || !d.Capped || d.Debt != 3 || d.Remaining != 0 {
		t.Fatalf("settle: %+v", d)
	}
	f.now = time.Date(2026, 10, 25, 23, 59, 59, 0, paris)
	if res := f.decide(t, limiter.Spend, req("Daily", "a", 1)); res.Allowed || res.RetryAfter != time.Second {
		t.Fatalf("at 23:59:59: %+v", res)
	}
	f.now = time.Date(2026, 10, 26, 0, 0, 0, 0, paris)
	res = f.decide(t, limiter.Spend, req("Daily", "a", 3))
	if d := res.Decisions[0]; !res.Allowed || d.Remaining != 0 || d.ResetAfter != 24*time.Hour || d.Params.Period != 24*time.Hour {
		t.Fatalf("next day: %+v", d)
	}
	res = f.decide(t, limiter.Refund, req("Daily", "a", 2))
	if d := res.Decisions[0]; !d.Allowed || d.Remaining != 2 {
		t.Fatalf("refund: %+v", d)
	}
	// A count raised mid-window keeps what was used.
	o := limiter.Override{Limit: "Daily", BucketID: "a", Enabled: true, Params: limiter.Params{Burst: 10, Count: 10}}
	b := snap.Builder()
	if err := b.PutOverride(o); err != nil {
		t.Fatal(err)
	}
	f.l.SetSnapshot(b.Snapshot(2))
	res = f.decide(t, limiter.Check, req("Daily", "a", 0))
	if d := res.Decisions[0]; d.Remaining != 9 || d.Source != limiter.SourceOverride {
		t.Fatalf("raised: %+v", d)
	}
}

func TestQuotaLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		l     limiter.Limit
		field string
	}{
		{quota("Q", 120, limiter.CalendarDay, "../../etc/passwd", 3), "time_zone"},
		{quota("Q", 120, limiter.CalendarDay, "Local", 3), "time_zone"},
		{quota("Q", 120, limiter.CalendarDay, "", 3), "time_zone"},
		{quota("Q", 120, limiter.CalendarDay, "Mars/Olympus", 3), "time_zone"},
		{quota("Q", 120, "fortnight", "UTC", 3), "calendar"},
		{quota("Q", 120, limiter.CalendarHour, "UTC", 1<<40), "count"},
		{limiter.Limit{Name: "Q", Enum: 120, IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "UTC", Params: limiter.Params{Burst: 5, Count: 3}}, "burst"},
		{limiter.Limit{Name: "Q", Enum: 120, IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "UTC", Params: limiter.Params{Burst: 3, Count: 3, Period: time.Hour}}, "period"},
		{limiter.Limit{Name: "Q", Enum: 120, IDFormat: limiter.String, Kind: limiter.KindConcurrency, Calendar: limiter.CalendarDay, TimeZone: "UTC", Params: limiter.Params{Burst: 3, Count: 3, Period: time.Hour}}, "calendar"},
		{limiter.Limit{Name: "Q", Enum: 120, IDFormat: limiter.String, TimeZone: "UTC", Params: limiter.Params{Burst: 3, Count: 3, Period: time.Hour}}, "time_zone"},
		{limiter.Limit{Name: "Q", Enum: 120, IDFormat: limiter.String, Kind: "bucket", Params: limiter.Params{Burst: 3, Count: 3, Period: time.Hour}}, "kind"},
	} {
		fields := c.l.Validate()
		found := false
		for _, fe := range fields {
			found = found || fe.Field == c.field
		}
		if !found {
			t.Errorf("%+v: errors %v, want one on %s", c.l, fields, c.field)
		}
	}
}

func TestQuotaExactUnderConcurrency(t *testing.T) {
	f := newFixture(t, limiter.Config{}, build(t, []limiter.Limit{quota("Q", 120, limiter.CalendarMonth, "Asia/Tokyo", 50)}))
	admitted := runConcurrently(200, func() bool {
		res, err := f.l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("Q", "x", 1)}, nil)
		return err == nil && res.Allowed
	})
	if admitted != 50 {
		t.Fatalf("admitted %d of 200, want 50", admitted)
	}
}

// runConcurrently calls f n times at once and counts the true answers.
func runConcurrently(n int, f func() bool) int {
	var wg sync.WaitGroup
	var yes atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f() {
				yes.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(yes.Load())
}

// TestWindowsKeepQuotasApart checks, over zones with odd offsets and
// changes (30-minute and 2-hour shifts, a skipped day, midnight changes)
// and random instants from 1970 to 2100, what the quota encoding rests on
// (calendar.go): the window holds the instant, and the next window ends at
// least the calendar's shortest window later, so that a TAT two counts
// past one window's end is behind the next window's clock.
func TestWindowsKeepQuotasApart(t *testing.T) {
	zones := []string{"UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham",
		"Australia/Lord_Howe", "Pacific/Apia", "America/Sao_Paulo", "Africa/Casablanca", "Antarctica/Troll", "America/Havana",
		"Asia/Tehran", "Pacific/Kiritimati", "America/St_Johns", "Europe/Dublin"}
	shortest := map[limiter.Calendar]time.Duration{
		limiter.CalendarHour: 30 * time.Minute, limiter.CalendarDay: 20 * time.Hour, limiter.CalendarWeek: 6 * 24 * time.Hour,
		limiter.CalendarMonth: 27 * 24 * time.Hour, limiter.CalendarYear: 364 * 24 * time.Hour,
	}
	r := rand.New(rand.NewPCG(19, 22))
	from, to := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, name := range zones {
		loc := zone(t, name)
		// Random instants, and instants around every change of offset
		// from 1990 to 2040, where the windows are odd. (Before, zones
		// shifted by 20 or 40 minutes, Kiritimati in 1979, which the
		// hour's count bound does not allow for; no quota runs then.)
		var ats []time.Time
		for range 400 {
			ats = append(ats, time.Unix(from+r.Int64N(to-from), r.Int64N(1e9)))
		}
		for _, c := range offsetChanges(loc, time.Date(1990, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)) {
			for _, d := range []time.Duration{-25 * time.Hour, -time.Hour, -time.Second, 0, time.Second, 30 * time.Minute, time.Hour, 23 * time.Hour} {
				ats = append(ats, c.Add(d))
			}
		}
		for cal, least := range shortest {
			for _, at := range ats {
				start, end, _ := limiter.Window(cal, loc, at)
				if at.Before(start) || !at.Before(end) {
					t.Fatalf("%s %s at %s: window [%s, %s) does not hold it", name, cal, at, start, end)
				}
				// The window's first and last instants have the same window.
				for _, edge := range []time.Time{start, end.Add(-time.Nanosecond)} {
					if s, e, _ := limiter.Window(cal, loc, edge); !s.Equal(start) || !e.Equal(end) {
						t.Fatalf("%s %s at %s: window [%s, %s), but at %s [%s, %s)", name, cal, at, start, end, edge, s, e)
					}
				}
				_, next, _ := limiter.Window(cal, loc, end)
				if next.Sub(end) < least {
					t.Fatalf("%s %s at %s: the next window ends %s after this one's end %s, less than %s", name, cal, at, next.Sub(end), end, least)
				}
			}
		}
	}
}

// offsetChanges returns the instants in [from, to) at which loc's offset
// changes, found a day at a time and then to the second.
func offsetChanges(loc *time.Location, from, to time.Time) []time.Time {
	var out []time.Time
	_, off := from.In(loc).Zone()
	for lo := from; lo.Before(to); lo = lo.Add(24 * time.Hour) {
		hi := lo.Add(24 * time.Hour)
		_, o := hi.In(loc).Zone()
		if o == off {
			continue
		}
		a, b := lo, hi
		for b.Sub(a) > time.Second {
			mid := a.Add(b.Sub(a) / 2)
			if _, m := mid.In(loc).Zone(); m == off {
				a = mid
			} else {
				b = mid
			}
		}
		out = append(out, b)
		off = o
	}
	return out
}
