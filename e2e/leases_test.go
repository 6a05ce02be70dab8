//go:build linux

package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestLeasesAndQuotas runs the lease story and a quota's spends through the
// real binary on Postgres and Redis, with the generated client, which
// checks every answer against openapi.yaml. The service reads the real
// clock, so the answers are checked against bounds taken around each
// request, and a lease expires while the test waits for it: its ttl_ms is
// short, so that the wait is too.
func TestLeasesAndQuotas(t *testing.T) {
	t.Parallel()
	svc := newService(t, "ratelimitd", options{redisURL: testenv.RedisURL(t)})
	admin := svc.admin()
	calls := putLimit(t, admin, "ModelCalls", client.LimitPut{IDFormat: client.IDFormatString, Kind: ptr(client.LimitKindConcurrency),
		Burst: ptr(int64(2)), Period: ptr("1m")})
	if calls.Kind != client.LimitKindConcurrency || calls.Count != 2 || calls.Period == nil || *calls.Period != "1m0s" || calls.Calendar != nil {
		t.Errorf("the concurrency limit: %+v", calls)
	}
	exports := putLimit(t, admin, "ExportsPerDay", client.LimitPut{IDFormat: client.IDFormatString, Calendar: ptr(client.CalendarDay),
		TimeZone: ptr("Europe/Paris"), Count: ptr(int64(3))})
	if exports.Kind != client.LimitKindRate || exports.Burst != 3 || exports.Period != nil || exports.TimeZone == nil || *exports.TimeZone != "Europe/Paris" {
		t.Errorf("the quota: %+v", exports)
	}
	decide := svc.client(createToken(t, admin, "gateway", client.ScopeDecide))
	waitKnown(t, decide, "ModelCalls", "acct-42")
	waitKnown(t, decide, "ExportsPerDay", "acct-42")

	t.Run("leases", func(t *testing.T) { leaseStory(t, decide) })
	t.Run("quota", func(t *testing.T) { quotaSpends(t, decide, admin) })

	metrics, err := svc.client("").MetricsWithResponse(bg)
	must(t, err, metrics, metrics.StatusCode() == http.StatusOK)
	for _, line := range []string{
		`ratelimitd_leases_total{event="acquired",limit="ModelCalls"} 4`,
		`ratelimitd_leases_total{event="released",limit="ModelCalls"} 3`,
		`ratelimitd_leases_total{event="renewed",limit="ModelCalls"} 1`,
		`ratelimitd_leases_total{event="expired",limit="ModelCalls"} 1`,
		`ratelimitd_quota_spent_units_total{limit="ExportsPerDay",unit="requests"} 2`,
	} {
		if !strings.Contains(string(metrics.Body), "\n"+line+"\n") {
			t.Errorf("/metrics has no line %s", line)
		}
	}
}

// leaseStory acquires ModelCalls's bucket to its burst of 2, is denied
// until the earliest lease expires, releases, renews, and lets a lease
// expire. The metrics TestLeasesAndQuotas checks count its leases.
func leaseStory(t *testing.T, c *client.ClientWithResponses) {
	acquire := func(ttl int64) (*client.AcquireResponse, time.Time, time.Time) {
		t.Helper()
		req := client.AcquireRequest{Buckets: []client.LeaseBucket{{Limit: "ModelCalls", BucketID: "acct-42"}}}
		if ttl != 0 {
			req.TTLMs = &ttl
		}
		before := time.Now()
		res, err := c.AcquireWithResponse(bg, req)
		after := time.Now()
		must(t, err, res, res.JSON200 != nil && len(res.JSON200.Decisions) == 1 && res.JSON200.Decisions[0].Held != nil &&
			(res.JSON200.Lease != nil) == res.JSON200.Allowed)
		return res, before, after
	}
	held := func() int64 {
		t.Helper()
		d := check(t, c, "ModelCalls", "acct-42", 0)
		if d.Held == nil {
			t.Fatalf("a check of a concurrency bucket without held: %+v", d)
		}
		return *d.Held
	}
	const policy = `"ModelCalls";q=2;qu="concurrent-requests";w=60`

	// Two leases of the whole period fill the bucket.
	first, before, after := acquire(0)
	a := first.JSON200
	if d := a.Decisions[0]; !a.Allowed || a.Degraded || *d.Held != 1 || d.Remaining != 1 || !strings.HasPrefix(a.Lease.ID, "lse_") ||
		!within(a.Lease.ExpiresAt, before.Add(time.Minute), after.Add(time.Minute)) {
		t.Fatalf("the first acquire: %s", first.Body)
	}
	if h := first.Headers200; h == nil || h.RateLimitPolicy == nil || *h.RateLimitPolicy != policy || h.RetryAfter != nil {
		t.Errorf("the first acquire's headers: %v", first.HTTPResponse.Header)
	}
	second, _, _ := acquire(0)
	b := second.JSON200
	if d := b.Decisions[0]; !b.Allowed || *d.Held != 2 || d.Remaining != 0 {
		t.Fatalf("the second acquire: %s", second.Body)
	}

	// A third is denied until the first lease expires, not its own ttl.
	denied, before, after := acquire(0)
	if d := denied.JSON200.Decisions[0]; denied.JSON200.Allowed || d.Reason == nil || *d.Reason != client.DecisionReasonLimited || *d.Held != 2 ||
		!roundedWithin(d.RetryAfterMs, a.Lease.ExpiresAt.Sub(after), a.Lease.ExpiresAt.Sub(before)) || denied.JSON200.RetryAfterMs != d.RetryAfterMs {
		t.Fatalf("the third acquire: %s", denied.Body)
	}
	if h := denied.Headers200; h == nil || h.RetryAfter == nil || int64(*h.RetryAfter) != (denied.JSON200.RetryAfterMs+999)/1000 ||
		h.RateLimit == nil || !strings.HasPrefix(*h.RateLimit, `"ModelCalls";r=0;t=`) {
		t.Errorf("the denial's headers: %v", denied.HTTPResponse.Header)
	}

	// Released, the first lease's unit is free at once; a second release
	// is no error.
	for _, want := range []bool{true, false} {
		res, err := c.ReleaseWithResponse(bg, client.ReleaseRequest{LeaseID: a.Lease.ID})
		must(t, err, res, res.JSON200 != nil && res.JSON200.Released == want && !res.JSON200.Degraded)
	}
	if n := held(); n != 1 {
		t.Fatalf("after the release the bucket holds %d, want 1", n)
	}

	// Renewed without ttl_ms, the second lease gets the whole period from
	// now, which ends after its first expiry; more than the period is a
	// 422.
	renewed, err := c.RenewWithResponse(bg, client.RenewRequest{LeaseID: b.Lease.ID})
	must(t, err, renewed, renewed.JSON200 != nil)
	if l := renewed.JSON200.Lease; l.ID != b.Lease.ID || !l.ExpiresAt.After(b.Lease.ExpiresAt) || renewed.JSON200.Degraded {
		t.Errorf("the renewal: %s", renewed.Body)
	}
	tooLong, err := c.RenewWithResponse(bg, client.RenewRequest{LeaseID: b.Lease.ID, TTLMs: ptr(int64(60001))})
	must(t, err, tooLong, tooLong.ApplicationProblemJSON422 != nil)
	if p := tooLong.ApplicationProblemJSON422; p.Errors == nil || len(*p.Errors) != 1 || (*p.Errors)[0].Field != "ttl_ms" {
		t.Errorf("a renewal beyond the period: %s", tooLong.Body)
	}

	// A lease of 300 ms that nobody renews expires on the service's
	// clock: its unit comes back without a release, and it can no longer
	// be renewed or released.
	short, before, after := acquire(300)
	if !short.JSON200.Allowed || !within(short.JSON200.Lease.ExpiresAt, before.Add(300*time.Millisecond), after.Add(300*time.Millisecond)) {
		t.Fatalf("the short acquire: %s", short.Body)
	}
	took := waitFor(t, 10*time.Second, "the short lease to expire", func() bool { return held() == 1 })
	t.Logf("measured: a lease of 300 ms was seen expired %v after its acquire was answered", took.Round(time.Millisecond))
	gone, err := c.RenewWithResponse(bg, client.RenewRequest{LeaseID: short.JSON200.Lease.ID})
	must(t, err, gone, gone.ApplicationProblemJSON404 != nil)
	released, err := c.ReleaseWithResponse(bg, client.ReleaseRequest{LeaseID: short.JSON200.Lease.ID})
	must(t, err, released, released.JSON200 != nil && !released.JSON200.Released)

	// The next acquire takes the expired lease's place.
	last, _, _ := acquire(0)
	if !last.JSON200.Allowed || *last.JSON200.Decisions[0].Held != 2 {
		t.Fatalf("the acquire after the expiry: %s", last.Body)
	}
	for _, l := range []*client.Lease{b.Lease, last.JSON200.Lease} {
		res, err := c.ReleaseWithResponse(bg, client.ReleaseRequest{LeaseID: l.ID})
		must(t, err, res, res.JSON200 != nil && res.JSON200.Released)
	}
	if n := held(); n != 0 {
		t.Errorf("at the end the bucket holds %d, want 0", n)
	}
}

// quotaSpends spends ExportsPerDay's bucket of 3 a day in Paris: 2, then 2
// more denied until Paris's next midnight. admin resets the bucket when the
// test ends, so that Redis does not keep it until then.
func quotaSpends(t *testing.T, c, admin *client.ClientWithResponses) {
	t.Cleanup(func() {
		res, err := admin.ResetBucketsWithResponse(bg, client.ResetRequest{Buckets: []struct {
			BucketID string           `json:"bucket_id"`
			Limit    client.LimitName `json:"limit"`
		}{{BucketID: "acct-42", Limit: "ExportsPerDay"}}})
		must(t, err, res, res.JSON200 != nil)
	})
	paris, msg := limiter.LoadZone("Europe/Paris")
	if msg != "" {
		t.Fatal(msg)
	}
	// Both spends must fall in one day: close to midnight, the test waits
	// for the next one.
	if end := nextMidnight(time.Now(), paris); time.Until(end) < 10*time.Second {
		time.Sleep(time.Until(end) + 100*time.Millisecond)
	}
	start := time.Now()
	end := nextMidnight(start, paris)
	y, m, d := start.In(paris).Date()
	day := end.Sub(time.Date(y, m, d, 0, 0, 0, 0, paris))
	spend := func(cost int64) (*client.SpendResponse, time.Time, time.Time) {
		t.Helper()
		before := time.Now()
		res, err := c.SpendWithResponse(bg, client.DecisionRequest{Buckets: []client.BucketRequest{{Limit: "ExportsPerDay", BucketID: "acct-42", Cost: &cost}}})
		after := time.Now()
		must(t, err, res, res.JSON200 != nil && len(res.JSON200.Decisions) == 1)
		return res, before, after
	}

	first, before, after := spend(2)
	if d := first.JSON200.Decisions[0]; !first.JSON200.Allowed || d.Remaining != 1 || d.Held != nil || d.Period != day.String() ||
		!roundedWithin(d.ResetAfterMs, end.Sub(after), end.Sub(before)) {
		t.Fatalf("the first spend: %s", first.Body)
	}
	policy := `"ExportsPerDay";q=3;w=` + strconv.FormatInt(int64(day/time.Second), 10)
	if h := first.Headers200; h == nil || h.RateLimitPolicy == nil || *h.RateLimitPolicy != policy {
		t.Errorf("the first spend's headers: %v, want RateLimit-Policy %s", first.HTTPResponse.Header, policy)
	}
	// Nothing refills within a window: the rest of the day is the wait.
	second, before, after := spend(2)
	if d := second.JSON200.Decisions[0]; second.JSON200.Allowed || d.Reason == nil || *d.Reason != client.DecisionReasonLimited || d.Remaining != 1 ||
		!roundedWithin(d.RetryAfterMs, end.Sub(after), end.Sub(before)) {
		t.Fatalf("the second spend: %s", second.Body)
	}
	if h := second.Headers200; h == nil || h.RetryAfter == nil || int64(*h.RetryAfter) != (second.JSON200.RetryAfterMs+999)/1000 {
		t.Errorf("the denial's headers: %v", second.HTTPResponse.Header)
	}
}

// nextMidnight returns the first midnight in zone after t.
func nextMidnight(t time.Time, zone *time.Location) time.Time {
	y, m, d := t.In(zone).Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, zone)
}

// within reports whether at lies in [from, to], to the millisecond the
// answers are written in.
func within(at, from, to time.Time) bool {
	return !at.Before(from.Add(-time.Millisecond)) && !at.After(to.Add(time.Millisecond))
}

// roundedWithin reports whether a duration in milliseconds, as the service
// rounds it up, lies within [from, to].
func roundedWithin(ms int64, from, to time.Duration) bool {
	return ms >= from.Milliseconds() && ms <= (to+time.Millisecond-1).Milliseconds()
}
