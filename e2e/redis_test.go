//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// answerBound is the liveness bound of every decision while Redis fails:
// the per-call timeout plus a slack that only a hang exceeds, even on a
// loaded machine. The measured figures are logged, not asserted.
const answerBound = redisTimeout + 1900*time.Millisecond

// Tolerances of the leak checks: what the process holds after a fault
// and its recovery may exceed what it held before by at most this much
// (but see the Redis pool below). A leak grows with the number of failed
// calls, thousands here.
const (
	goroutineSlack = 5
	fdSlack        = 3
	redisConnSlack = 2
)

// TestRedisFaults runs decisions under load while the service's private
// redis-server is killed (down) or stopped with SIGSTOP (stalled), in each
// fail mode. Every decision must be answered within the per-call timeout
// (plus slack), as the fail mode says: allowed and degraded when open, 503
// problem+json when closed; never anything else. /readyz must say 503
// during the fault. When Redis is back, decisions must be normal again,
// and the process must hold no more goroutines, file descriptors and
// Redis connections than before.
func TestRedisFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"down", "stalled"} {
		for _, mode := range []string{"open", "closed"} {
			t.Run(fault+"/"+mode, func(t *testing.T) {
				t.Parallel()
				testRedisFault(t, fault, mode)
			})
		}
	}
}

func testRedisFault(t *testing.T, fault, mode string) {
	rs := testenv.RedisServer(t)
	svc := newService(t, "ratelimitd", options{redisURL: "redis://" + rs.Addr(), failMode: mode})
	// Buckets that never run out: every normal answer is allowed.
	putLimit(t, svc.admin(), "RedisFault", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1e9)), Count: ptr(int64(1e9)), Period: ptr("1h")})
	// And a limit that abusers exhaust: one emptied before the fault, one
	// blocked by an override.
	putLimit(t, svc.admin(), "Tight", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	createOverride(t, svc.admin(), client.OverrideCreate{Limit: "Tight", BucketID: "blocked", Burst: ptr(int64(0)), Count: ptr(int64(1)), Period: ptr("1h")})
	decide := createToken(t, svc.admin(), "load", client.ScopeDecide)
	waitKnown(t, svc.admin(), "RedisFault", "w0-0")
	waitFor(t, 10*time.Second, "the blocking override in the snapshot", func() bool { return usesOverride(svc.admin(), "Tight", "blocked", 0) })
	for range 3 {
		spend(svc.admin(), bucket("Tight", "abuser"))
	}
	const workers = 3
	clients := make([]*client.ClientWithResponses, workers)
	transports := make([]*http.Transport, workers)
	for i := range clients {
		transports[i] = http.DefaultTransport.(*http.Transport).Clone()
		transports[i].MaxIdleConnsPerHost = 32
		clients[i] = newClientOn(t, svc.url, decide, 50, transports[i])
	}
	// The load's idle keep-alive connections, and the server's goroutine
	// and descriptor for each, are the test's, not the service's: a stalled
	// store holds requests longer, and the clients open more. They are
	// closed before each count.
	closeIdle := func() {
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}
	body := func(w, i int) client.DecisionRequest {
		return bucket("RedisFault", fmt.Sprintf("w%d-%d", w, i%64))
	}
	fail, restore := rs.Stop, rs.Start
	if fault == "stalled" {
		fail, restore = rs.Pause, rs.Resume
	}
	want := degraded
	if mode == "closed" {
		want = unavailable
	}

	// The baseline is taken between two loads on the same clients, so
	// that both counts include the readiness probe's keep-alive connection
	// and the Redis pool the first load filled.
	ready := watchReadiness(t, svc)
	warmUp(t, func() []sample {
		warm := startLoad(t, clients, workers, 2*time.Millisecond, body)
		waitFor(t, 20*time.Second, "warm-up", func() bool { return len(warm.since(time.Time{})) >= 300 })
		return warm.halt()
	})
	closeIdle()
	time.Sleep(200 * time.Millisecond)
	before := svc.metrics("go_goroutines", "process_open_fds")
	redisBefore := redisClients(t, rs.Addr())

	l := startLoad(t, clients, workers, 2*time.Millisecond, body)
	time.Sleep(300 * time.Millisecond)
	faultAt := time.Now()
	fail()
	failed := time.Now()
	// What the process knows without Redis still denies: a bucket it saw
	// empty, a blocked one. Open or closed, abuse known is not let through.
	time.Sleep(200 * time.Millisecond)
	for _, id := range []string{"abuser", "blocked"} {
		res, err := clients[0].SpendWithResponse(bg, bucket("Tight", id))
		if err != nil || res.JSON200 == nil || res.JSON200.Allowed || res.JSON200.Degraded {
			t.Errorf("spending the %s bucket during the fault: %v; want 200, denied, not degraded", id, describe(res, err))
		}
	}
	time.Sleep(time.Until(failed.Add(1500 * time.Millisecond)))
	restoring := time.Now()
	restore()
	restoredAt := time.Now()
	lastBad := waitRecovered(t, l, restoredAt, 15*time.Second)
	samples := l.halt()
	probes := ready.halt()

	// Every answer is a normal one or the fail mode's, in time.
	var slow []sample
	for _, s := range samples {
		if s.answer != normal && s.answer != want {
			t.Errorf("a decision answered %v (%s); want %v or normal", s.answer, s.what, want)
		}
		if s.latency > answerBound {
			slow = append(slow, s)
		}
	}
	if len(slow) > 0 {
		t.Errorf("%d decisions took longer than %v, the longest %v", len(slow), answerBound, summarize(slow).max)
		for _, s := range slow {
			t.Logf("slow: started %v after the fault, took %v, %v %s (fault took %v, restore began %v after it, Redis answered %v after it)", s.start.Sub(faultAt), s.latency, s.answer, s.what, failed.Sub(faultAt), restoring.Sub(faultAt), restoredAt.Sub(faultAt))
		}
	}
	// While Redis fails, every decision is the fail mode's; one still
	// waiting when Redis comes back may be answered normally.
	var during []sample
	for _, s := range between(samples, failed, restoring) {
		if s.end().Before(restoring) {
			during = append(during, s)
		}
	}
	if got := count(during); got[want] != len(during) || len(during) == 0 {
		t.Errorf("during the fault: %v; want only %v", got, want)
	}

	// /readyz says the store fails, then that it answers.
	notReady, ok := firstAfter(probes, faultAt, http.StatusServiceUnavailable)
	if !ok || !notReady.at.Before(restoredAt) {
		t.Errorf("/readyz did not answer 503 during the fault")
	} else if notReady.detail != "the store does not answer" {
		t.Errorf("/readyz during the fault: %q", notReady.detail)
	}
	readyAgain, ok := firstAfter(probes, restoredAt, http.StatusOK)
	if !ok {
		t.Errorf("/readyz did not answer 200 after the fault")
	}

	firstNormal := restoredAt
	for _, s := range samples {
		if !s.start.Before(restoredAt) && s.answer == normal {
			firstNormal = s.end()
			break
		}
	}
	t.Logf("measured: redis %s, fail mode %s: during the fault %v, answers %v; before it %v",
		fault, mode, summarize(during), count(during), summarize(between(samples, time.Time{}, faultAt)))
	t.Logf("measured: redis %s, fail mode %s: /readyz 503 %v after the fault; after Redis answered again: first normal decision %v, last abnormal %v, /readyz 200 %v",
		fault, mode, notReady.at.Sub(faultAt).Round(time.Millisecond), firstNormal.Sub(restoredAt).Round(time.Millisecond),
		max(0, lastBad.Sub(restoredAt)).Round(time.Millisecond), readyAgain.at.Sub(restoredAt).Round(time.Millisecond))

	// Nothing leaked. Goroutines go back to their level. Redis connections
	// may not: a dial that a call started, and gave up waiting for, can
	// succeed once Redis is back, and the pool keeps that connection idle
	// for reuse. go-redis bounds them (PoolSize, 10 per GOMAXPROCS, in use
	// and as many dials at once), whatever the number of failed calls, and
	// every descriptor more is one of them.
	poolBound := 2 * 10 * runtime.GOMAXPROCS(0)
	var after map[string]float64
	var redisAfter int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		closeIdle()
		after = svc.metrics("go_goroutines", "process_open_fds")
		redisAfter = redisClients(t, rs.Addr())
		extraConns := max(0, redisAfter-redisBefore)
		if after["go_goroutines"] <= before["go_goroutines"]+goroutineSlack &&
			redisAfter <= max(redisBefore+redisConnSlack, poolBound) &&
			after["process_open_fds"] <= before["process_open_fds"]+float64(extraConns)+fdSlack {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("10 s after the fault the process holds more than before it: goroutines %v -> %v, open fds %v -> %v, redis connections %d -> %d (bound %d)",
				before["go_goroutines"], after["go_goroutines"], before["process_open_fds"], after["process_open_fds"], redisBefore, redisAfter, poolBound)
			break
		}
	}
	logged := strings.Count(svc.logs.String(), `"path":"/v1/spend"`)
	t.Logf("measured: redis %s, fail mode %s: %d log lines about failed decisions, %d of the store's own (go-redis pool)",
		fault, mode, logged, strings.Count(svc.logs.String(), "redis: "))
	t.Logf("measured: redis %s, fail mode %s: goroutines %v -> %v, open fds %v -> %v, redis connections %d -> %d (%d decisions)",
		fault, mode, before["go_goroutines"], after["go_goroutines"], before["process_open_fds"], after["process_open_fds"],
		redisBefore, redisAfter, len(samples))
}

// waitRecovered waits until the decisions that started after from have
// been normal for a second, and returns when the last abnormal one ended
// (from when there was none). It fails the test after within.
func waitRecovered(t *testing.T, l *load, from time.Time, within time.Duration) time.Time {
	t.Helper()
	for {
		lastBad := from
		samples := l.since(from)
		for _, s := range samples {
			if s.answer != normal && s.end().After(lastBad) {
				lastBad = s.end()
			}
		}
		good := 0
		for _, s := range samples {
			if s.answer == normal && s.start.After(lastBad) {
				good++
			}
		}
		if time.Since(lastBad) >= time.Second && good >= 20 {
			return lastBad
		}
		if time.Since(from) > within {
			t.Fatalf("decisions not normal again within %v of the fault's end: %v since", within, count(samples))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
