package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestPolicyWindow: a decision tells the fronts what its limit is, so that
// they describe it in its own terms: a rate by the time an empty bucket
// takes to fill, a quota by its current window, a concurrency limit by the
// longest a lease lives.
func TestPolicyWindow(t *testing.T) {
	paris := zone(t, "Europe/Paris")
	snap := build(t, []limiter.Limit{orders(), quota("Daily", 120, limiter.CalendarDay, "Europe/Paris", 70_000_000),
		calls("Calls", 130, 3, 30*time.Second)}, override("NewOrdersPerAccount", "666", 0))
	f := newFixture(t, limiter.Config{}, snap)
	f.now = time.Date(2026, 10, 25, 22, 0, 0, 0, paris) // a day of 25 hours
	res := f.decide(t, limiter.Check, req("NewOrdersPerAccount", "1", 0), req("NewOrdersPerAccount", "666", 0),
		req("Daily", "a", 0), req("Calls", "a", 0))
	lease, err := f.l.Acquire(context.Background(), []limiter.Request{req("Calls", "b", 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ds := append(res.Decisions, lease.Decisions...)
	want := []struct {
		kind   limiter.Kind
		cal    limiter.Calendar
		window time.Duration
	}{
		{limiter.KindRate, "", 3 * time.Hour},
		// Blocked: no burst, so the override's period.
		{limiter.KindRate, "", time.Hour},
		// Not 70e6 × ⌊90000 s / 70e6⌋, a rate's burst·T, which falls 50 s short.
		{limiter.KindRate, limiter.CalendarDay, 25 * time.Hour},
		{limiter.KindConcurrency, "", 30 * time.Second},
		{limiter.KindConcurrency, "", 30 * time.Second},
	}
	for i, w := range want {
		d := &ds[i]
		if d.Kind != w.kind || d.Calendar != w.cal || d.PolicyWindow() != w.window {
			t.Errorf("%s %s: kind %q calendar %q window %s, want %q %q %s", d.Limit, d.BucketID, d.Kind, d.Calendar, d.PolicyWindow(), w.kind, w.cal, w.window)
		}
	}
}
