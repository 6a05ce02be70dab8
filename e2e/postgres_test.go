//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestPostgresDown cuts the service off from Postgres while decisions and
// admin writes go on. Decisions must go on unchanged from the last
// snapshot (an override keeps applying, defaults too), /readyz must stay
// 200, and admin writes must answer 503 problem+json. When Postgres is
// back, the loader must catch up (a new override applies), and every
// write that was acknowledged must be there with its history entry.
//
// The outage is a TCP proxy between the service and the shared Postgres
// server going down: every connection drops and new ones are refused,
// which is what the service would see of a server that went away. The
// server itself must keep serving the other test packages.
func TestPostgresDown(t *testing.T) {
	t.Parallel()
	dbURL, viaProxy, proxy := proxiedPostgres(t)
	svc := newService(t, "ratelimitd", options{databaseURL: viaProxy})
	admin := svc.admin()

	// Decisions use one limit, the stream of writes another, whose
	// overrides are all the stream's.
	const limit, written = "PostgresDown", "PostgresDownWrites"
	putLimit(t, admin, limit, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(5)), Count: ptr(int64(5)), Period: ptr("1h")})
	putLimit(t, admin, written, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(5)), Count: ptr(int64(5)), Period: ptr("1h")})
	writer := svc.client(createToken(t, admin, "writer", client.ScopeAdmin))
	decide := createToken(t, admin, "decider", client.ScopeDecide)
	vip := createOverride(t, admin, client.OverrideCreate{Limit: limit, BucketID: "vip", Burst: ptr(int64(1e9)), Count: ptr(int64(1e9)), Period: ptr("1h")})
	waitFor(t, 10*time.Second, "the override in the snapshot", func() bool {
		return usesOverride(admin, limit, "vip", 1e9)
	})

	// Decisions alternate between the override's bucket and fresh default
	// buckets, each spent once of its five tokens: all allowed, each from
	// its own source, whether or not the database answers.
	clients := []*client.ClientWithResponses{newClient(t, svc.url, decide, 50), newClient(t, svc.url, decide, 50)}
	decisions := startLoad(t, clients, 2, 2*time.Millisecond, func(w, i int) client.DecisionRequest {
		if i%2 == 0 {
			return bucket(limit, "vip")
		}
		return bucket(limit, fmt.Sprintf("d%d-%d", w, i))
	})
	ready := watchReadiness(t, svc)
	writes := startWrites(t, writer, written, "s", 2, 20*time.Millisecond)
	waitFor(t, 20*time.Second, "writes before the outage", func() bool { return writes.count() >= 30 })

	statusBefore := status(t, admin)
	downAt := time.Now()
	proxy.Down()
	inStepLost := waitFor(t, 10*time.Second, "/v1/status to say the snapshot is out of step", func() bool {
		return !status(t, admin).Snapshot.InStep
	})
	// Reads that need the database fail as writes do.
	if res, err := admin.GetOverrideWithResponse(bg, vip.ID); err != nil || res.ApplicationProblemJSON503 == nil {
		t.Errorf("GET /v1/overrides/{id} during the outage: %v, want 503 problem+json", describe(res, err))
	}
	if res, err := admin.ListLimitsWithResponse(bg); err != nil || res.ApplicationProblemJSON503 == nil {
		t.Errorf("GET /v1/limits during the outage: %v, want 503 problem+json", describe(res, err))
	}
	time.Sleep(time.Until(downAt.Add(2 * time.Second)))
	statusDuring := status(t, admin)
	upAt := time.Now()
	proxy.Up()

	firstWrite := waitFor(t, 20*time.Second, "an acknowledged write after the outage", func() bool {
		for _, w := range writes.since(upAt) {
			if w.acked() {
				return true
			}
		}
		return false
	})
	// A change made as soon as writes succeed again applies once the
	// loader has caught up.
	createOverride(t, admin, client.OverrideCreate{Limit: limit, BucketID: "after", Burst: ptr(int64(1000)), Count: ptr(int64(1000)), Period: ptr("1h")})
	applied := waitFor(t, 20*time.Second, "an override created after the outage to apply", func() bool {
		return usesOverride(admin, limit, "after", 1000)
	})
	waitFor(t, 20*time.Second, "/v1/status in step again", func() bool { return status(t, admin).Snapshot.InStep })
	inStep := time.Since(upAt)
	waitFor(t, 20*time.Second, "writes after the outage", func() bool { return len(writes.since(upAt)) >= 20 })
	all := writes.halt()
	samples := decisions.halt()
	probes := ready.halt()

	// Decisions never noticed.
	for _, s := range samples {
		want := client.DecisionSourceDefault
		if s.bucket == "vip" {
			want = client.DecisionSourceOverride
		}
		if s.answer != normal || !s.allowed || s.source != want {
			t.Errorf("decision on %s: %v allowed=%v source=%s (%s); want normal, allowed, from %s", s.bucket, s.answer, s.allowed, s.source, s.what, want)
			break
		}
	}
	for _, p := range probes {
		if p.status != http.StatusOK {
			t.Errorf("/readyz answered %d (%s) at %v after the outage began; the database is not needed to decide", p.status, p.detail, p.at.Sub(downAt))
			break
		}
	}
	if statusDuring.Snapshot.Version < statusBefore.Snapshot.Version {
		t.Errorf("the snapshot went back from version %d to %d during the outage", statusBefore.Snapshot.Version, statusDuring.Snapshot.Version)
	}

	// Writes during the outage were refused with 503 problem+json.
	refused := 0
	for _, w := range all {
		if w.start.After(downAt) && w.end.Before(upAt) {
			if w.status != http.StatusServiceUnavailable || !w.problem {
				t.Errorf("%s %s during the outage: status %d problem=%v err=%v; want 503 problem+json", w.op, w.bucket, w.status, w.problem, w.err)
			}
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("no write was tried during the outage")
	}
	v := verifyWrites(t, admin, dbURL, written, "writer", all, func(w write) bool { return w.spans(downAt) })

	outage := between(samples, downAt, upAt)
	t.Logf("measured: postgres down 2s: decisions during the outage %v %v, before it %v", summarize(outage), count(outage), summarize(between(samples, time.Time{}, downAt)))
	t.Logf("measured: postgres down: %d writes refused with 503 during the outage; /v1/status out of step %v after it began; after Postgres returned: first acknowledged write %v, an override created then applied %v later, /v1/status in step %v after the return",
		refused, inStepLost.Round(time.Millisecond), firstWrite.Round(time.Millisecond), applied.Round(time.Millisecond), inStep.Round(time.Millisecond))
	t.Logf("measured: postgres down: %v", v)
}

// status reads /v1/status.
func status(t *testing.T, c *client.ClientWithResponses) client.Status {
	t.Helper()
	res, err := c.StatusWithResponse(bg)
	if err != nil {
		t.Fatalf("GET /v1/status: %v", err)
	}
	if res.JSON200 == nil {
		t.Fatalf("GET /v1/status: %d %s", res.StatusCode(), res.Body)
	}
	return *res.JSON200
}

// TestPostgresStalled stalls the connections between one process and
// Postgres, as a lost network path does: they stay open and nothing comes
// back. Decisions and /readyz must not notice. Admin requests are
// answered 503 within seconds, on this process (its requests have a
// deadline) and on another one that reaches Postgres directly, although a
// write transaction stalled while it holds the write lock blocks every
// writer: they wait lock_timeout at most, and Postgres ends the stalled
// session after idle_in_transaction_session_timeout.
func TestPostgresStalled(t *testing.T) {
	t.Parallel()
	dbURL, viaProxy, proxy := proxiedPostgres(t)
	cut := newService(t, "ratelimitd-cut-off", options{databaseURL: viaProxy})
	other := newService(t, "ratelimitd-direct", options{databaseURL: dbURL})
	const limit = "PostgresStalled"
	putLimit(t, cut.admin(), limit, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1e9)), Count: ptr(int64(1e9)), Period: ptr("1h")})
	waitKnown(t, cut.admin(), limit, "x")

	decisions := startLoad(t, []*client.ClientWithResponses{newClient(t, cut.url, cut.bootstrap, 50)}, 2, 2*time.Millisecond,
		func(w, i int) client.DecisionRequest { return bucket(limit, fmt.Sprintf("d%d-%d", w, i%32)) })
	ready := watchReadiness(t, cut)
	// Writes keep the write lock busy, so that the stall likely catches
	// one holding it.
	writes := startWrites(t, cut.admin(), limit, "s", 4, 5*time.Millisecond)
	// Cleanups run last first: the stall ends, failing what waits on it,
	// before the writes are stopped.
	t.Cleanup(proxy.Down)
	waitFor(t, 20*time.Second, "writes before the stall", func() bool { return writes.count() >= 40 })
	stalledAt := time.Now()
	proxy.Stall()
	time.Sleep(2 * time.Second)
	samples := decisions.halt()
	probes := ready.halt()
	for _, s := range samples {
		if s.answer != normal || !s.allowed {
			t.Errorf("a decision while Postgres stalls: %v allowed=%v (%s)", s.answer, s.allowed, s.what)
			break
		}
	}
	for _, p := range probes {
		if p.status != http.StatusOK {
			t.Errorf("/readyz answered %d (%s) while Postgres stalls", p.status, p.detail)
			break
		}
	}
	during := between(samples, stalledAt, time.Now())
	t.Logf("measured: postgres stalled: decisions %v %v", summarize(during), count(during))
	for _, s := range []*service{cut, other} {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		start := time.Now()
		res, err := s.admin().CreateOverrideWithResponse(ctx, client.OverrideCreate{Limit: limit, BucketID: s.name, Unlimited: ptr(true)})
		cancel()
		switch {
		case err != nil:
			t.Errorf("%s: an admin write while Postgres stalls got no answer within 10 s: %v", s.name, err)
		case s == cut && res.ApplicationProblemJSON503 == nil:
			// Its only way to Postgres is stalled: a 201 would mean the
			// stall never happened.
			t.Errorf("%s: an admin write while its Postgres stalls: %d %s; want 503", s.name, res.StatusCode(), res.Body)
		case res.StatusCode() != http.StatusCreated && res.ApplicationProblemJSON503 == nil:
			t.Errorf("%s: an admin write while Postgres stalls: %d %s; want 201 or 503", s.name, res.StatusCode(), res.Body)
		default:
			t.Logf("measured: postgres stalled: %s answered an admin write %d after %v", s.name, res.StatusCode(), time.Since(start).Round(time.Millisecond))
		}
	}
}

// proxiedPostgres returns a fresh database's URL, the URL of the same
// database through a proxy that the test can cut or stall, and the proxy.
func proxiedPostgres(t *testing.T) (dbURL, viaProxy string, proxy *testenv.Proxy) {
	dbURL = testenv.Postgres(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy = testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	return dbURL, u.String(), proxy
}
