package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// quota creates a calendar quota of string ids through the API.
func (e *env) quota(name, calendar, zone string, count int) {
	e.t.Helper()
	e.putLimit(name, obj{"id_format": "string", "calendar": calendar, "time_zone": zone, "count": count})
}

// quotaEnvs runs f on a service over each store (storeEnvs), its clock at
// start.
func quotaEnvs(t *testing.T, start time.Time, f func(t *testing.T, e *env)) {
	storeEnvs(t, func(t *testing.T, e *env) {
		e.clock.Advance(start.Sub(e.clock.Now()))
		f(t, e)
	})
}

// resetAfter resets the buckets when the test ends, so that Redis drops
// their keys, which would otherwise live until the windows of the clock's
// future end.
func (e *env) resetAfter(t *testing.T, buckets ...obj) {
	t.Cleanup(func() {
		e.do("POST", "/v1/buckets/reset", e.admin, obj{"buckets": buckets}).expect(t, http.StatusOK)
	})
}

// next25HourDay returns the start of the next day after now that lasts
// 25 hours in zone, when summer time ends: the quota story runs on it, in
// the future, so that Redis keeps the keys of its windows.
func next25HourDay(t *testing.T, zone *time.Location, now time.Time) time.Time {
	t.Helper()
	y, m, d := now.In(zone).Date()
	for i := 1; i <= 400; i++ {
		start := time.Date(y, m, d+i, 0, 0, 0, 0, zone)
		if time.Date(y, m, d+i+1, 0, 0, 0, 0, zone).Sub(start) == 25*time.Hour {
			return start
		}
	}
	t.Fatalf("no day of 25 hours in %s within 400 days", zone)
	return time.Time{}
}

// TestQuotaStory is the daily quota of docs/api.md: three exports a day
// in Paris, on the day summer time ends, which lasts 25 hours.
func TestQuotaStory(t *testing.T) {
	paris, msg := limiter.LoadZone("Europe/Paris")
	if msg != "" {
		t.Fatal(msg)
	}
	day := next25HourDay(t, paris, time.Now())
	at := func(h, m int) time.Time { return time.Date(day.Year(), day.Month(), day.Day(), h, m, 0, 0, paris) }
	quotaEnvs(t, at(22, 0), func(t *testing.T, e *env) {
		e.quota("ExportsPerDay", "day", "Europe/Paris", 3)
		e.resetAfter(t, obj{"limit": "ExportsPerDay", "bucket_id": "acct-42"})
		step := func(op string, cost int, allowed bool, remaining, retry, reset int64, period, policy, ratelimit, retryAfter string) {
			t.Helper()
			r, res := e.decided(op, e.admin, bucket("ExportsPerDay", "acct-42", cost))
			d := r.Decisions[0]
			if r.Allowed != allowed || d.Remaining != remaining || d.RetryAfterMS != retry || d.ResetAfterMS != reset ||
				d.Period != period || d.Burst != 3 || d.Count != 3 || d.Held != nil {
				t.Fatalf("%s of %d at %s: %s", op, cost, e.clock.Now().In(paris), res.body)
			}
			wantHeaders(t, res, policy, ratelimit, retryAfter)
		}
		// 22:00, two hours before the end of a day of 25.
		step("spend", 1, true, 2, 0, 7_200_000, "25h0m0s", `"ExportsPerDay";q=3;w=90000`, `"ExportsPerDay";r=2;t=7200`, "")
		step("spend", 2, true, 0, 0, 7_200_000, "25h0m0s", `"ExportsPerDay";q=3;w=90000`, `"ExportsPerDay";r=0;t=7200`, "")
		// 22:30: the quota is used up until midnight.
		e.clock.Advance(30 * time.Minute)
		step("spend", 1, false, 0, 5_400_000, 5_400_000, "25h0m0s", `"ExportsPerDay";q=3;w=90000`, `"ExportsPerDay";r=0;t=5400`, "5400")
		step("check", 0, true, 0, 0, 5_400_000, "25h0m0s", `"ExportsPerDay";q=3;w=90000`, `"ExportsPerDay";r=0;t=5400`, "")
		// Midnight: a new window of 24 hours, full again.
		e.clock.Advance(at(24, 0).Sub(e.clock.Now()))
		step("spend", 1, true, 2, 0, 86_400_000, "24h0m0s", `"ExportsPerDay";q=3;w=86400`, `"ExportsPerDay";r=2;t=86400`, "")
	})
}

// TestQuotaWindowOps: refund and settle act on the current window; a
// settle takes it at most one count into debt, which ends with the
// window; an hourly quota's usage per window shows in the metrics.
func TestQuotaWindowOps(t *testing.T) {
	start := time.Now().Add(time.Hour).Truncate(time.Hour).Add(10 * time.Minute)
	quotaEnvs(t, start, func(t *testing.T, e *env) {
		e.quota("TokensPerHour", "hour", "UTC", 1000)
		e.resetAfter(t, obj{"limit": "TokensPerHour", "bucket_id": "k"})
		e.decided("spend", e.admin, bucket("TokensPerHour", "k", 400))
		if r, _ := e.decided("refund", e.admin, bucket("TokensPerHour", "k", 100)); r.Decisions[0].Remaining != 700 {
			t.Fatalf("refund: %+v", r.Decisions[0])
		}
		r, _ := e.decided("settle", e.admin, settle("TokensPerHour", "k", 0, 5000))
		if d := r.Decisions[0]; d.Remaining != 0 || d.Debt != 1000 || d.Capped == nil || !*d.Capped || d.ResetAfterMS != 50*60*1000 {
			t.Fatalf("settle: %+v", d)
		}
		if r, res := e.decided("spend", e.admin, bucket("TokensPerHour", "k", 1)); r.Allowed || r.RetryAfterMS != 50*60*1000 {
			t.Fatalf("spend in debt: %s", res.body)
		}
		e.clock.Advance(50 * time.Minute)
		if r, _ := e.decided("spend", e.admin, bucket("TokensPerHour", "k", 250)); !r.Allowed || r.Decisions[0].Remaining != 750 || r.Decisions[0].Debt != 0 {
			t.Fatalf("the next hour: %+v", r.Decisions[0])
		}
		metrics := e.do("GET", "/metrics", "", nil).expect(t, http.StatusOK).body
		if !contains(metrics, "\n"+`ratelimitd_quota_spent_units_total{limit="TokensPerHour",unit="requests"} 650`+"\n") {
			t.Errorf("quota units: %s", metrics)
		}
	})
}

// TestQuotaExactUnderConcurrency: N concurrent spends of 1 on a fresh
// quota bucket of count admit exactly min(N, count), through HTTP; the
// count is an override's, made through the API.
func TestQuotaExactUnderConcurrency(t *testing.T) {
	const count, tries = 10, 40
	start := time.Now().Add(24 * time.Hour)
	quotaEnvs(t, start, func(t *testing.T, e *env) {
		e.quota("Daily", "day", "America/New_York", 3)
		e.override(obj{"limit": "Daily", "bucket_id": "x", "count": count})
		e.resetAfter(t, obj{"limit": "Daily", "bucket_id": "x"})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range tries {
			wg.Go(func() {
				res := e.do("POST", "/v1/spend", e.admin, obj{"buckets": []obj{bucket("Daily", "x", 1)}})
				var r result
				if res.status != http.StatusOK {
					t.Errorf("%d %s", res.status, res.body)
					return
				}
				res.json(t, &r)
				if r.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if admitted.Load() != count {
			t.Fatalf("admitted %d of %d, want %d", admitted.Load(), tries, count)
		}
	})
}

// TestBlockedQuota: an override of count 0 blocks a quota's bucket, and
// every route answers it (it once divided by the count), on every store.
func TestBlockedQuota(t *testing.T) {
	storeEnvs(t, testBlockedQuota)
}

func testBlockedQuota(t *testing.T, e *env) {
	e.putLimit("Daily", obj{"id_format": "string", "count": 5, "calendar": "day", "time_zone": "Europe/Paris"})
	e.override(obj{"limit": "Daily", "bucket_id": "banned", "count": 0})
	e.waitSource("Daily", "banned", limiter.SourceOverride)
	for _, op := range []string{"spend", "check", "refund", "settle"} {
		b := bucket("Daily", "banned", 1)
		if op == "settle" {
			b = obj{"limit": "Daily", "bucket_id": "banned", "actual": 1}
		}
		r, res := e.decided(op, e.admin, b)
		d := r.Decisions[0]
		if res.status != http.StatusOK || op != "refund" && d.reason() != "blocked" || d.Burst != 0 || d.Count != 0 {
			t.Errorf("%s: %d %s", op, res.status, res.body)
		}
	}
}

// TestZonesOutsideTheBinaryAreRefused: a zone name that the database built
// into ratelimitd lacks is a 422 naming time_zone, even where the host
// has a file of that name (localtime, posixrules, right/UTC), through a
// limit's PUT and through an Envoy import, on both engines; nothing is
// written.
func TestZonesOutsideTheBinaryAreRefused(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.quota("Q", "day", "Europe/Paris", 10)
			before := e.rows()
			for _, zone := range []string{"localtime", "posixrules", "right/UTC", "Local", "", "Europe/Pariss", "Europe/Paris\x00"} {
				for _, name := range []string{"Q", "New"} {
					p := e.do("PUT", "/v1/limits/"+name, e.admin, obj{"id_format": "string", "calendar": "day", "time_zone": zone, "count": 10}).
						expect(t, http.StatusUnprocessableEntity).problem(t)
					wantFields(t, p, "time_zone")
				}
				// JSON's quoting is YAML's, escapes included.
				quoted, _ := json.Marshal(zone)
				doc := "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n" +
					"    metadata: {ratelimitd: {calendar: day, time_zone: " + string(quoted) + "}}\n"
				var res importResult
				e.importYAML("kind=envoy", doc).expect(t, http.StatusUnprocessableEntity).json(t, &res)
				if len(res.Errors) != 1 || res.Errors[0].Line != 5 || !strings.Contains(res.Errors[0].Message, "time_zone") {
					t.Errorf("import with zone %q: %+v", zone, res.Errors)
				}
			}
			e.unchanged(before)
		})
	}
}
