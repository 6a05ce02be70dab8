//go:build linux

package e2e

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestThreeProcesses runs three service processes on one Redis and one
// Postgres database. Concurrent spends spread over the three against a
// burst of B, with a refill too slow to matter, must admit exactly B: the
// buckets live in Redis, and a spend is one atomic script there. An
// override created through one process must then be used by the others
// within a second.
func TestThreeProcesses(t *testing.T) {
	t.Parallel()
	redisURL := testenv.RedisURL(t)
	opts := options{
		databaseURL: testenv.Postgres(t),
		redisURL:    redisURL,
		redisPrefix: testenv.RandomName("e2e:") + ":",
		bootstrap:   testenv.RandomName("bootstrap-"),
	}
	procs := make([]*service, 3)
	for i := range procs {
		procs[i] = newService(t, "ratelimitd-"+strconv.Itoa(i+1), opts)
	}
	admin := procs[0].admin()
	const limit, burst = "ThreeProcesses", 50
	// One token an hour: nothing refills during the test.
	putLimit(t, admin, limit, client.LimitPut{IDFormat: client.IDFormatRegID, Burst: ptr(int64(burst)), Count: ptr(int64(1)), Period: ptr("1h")})
	decide := createToken(t, admin, "spender", client.ScopeDecide)
	clients := make([]*client.ClientWithResponses, len(procs))
	for i, p := range procs {
		clients[i] = p.client(decide)
		waitKnown(t, clients[i], limit, "1")
	}

	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	var allowed, denied atomic.Int64
	var n atomic.Int64
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for range perWorker {
				i := n.Add(1)
				c := clients[int(i)%len(clients)]
				res, err := c.SpendWithResponse(bg, bucket(limit, "42"))
				switch {
				case err != nil:
					t.Errorf("spend: %v", err)
				case res.JSON200 == nil:
					t.Errorf("spend: %d %s", res.StatusCode(), res.Body)
				case res.JSON200.Degraded:
					t.Errorf("spend answered degraded: %s", res.Body)
				case res.JSON200.Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
					if h := res.Headers200; h == nil || h.RetryAfter == nil || h.RateLimit == nil || h.RateLimitPolicy == nil {
						t.Errorf("a denial without Retry-After, RateLimit and RateLimit-Policy: %v", res.HTTPResponse.Header)
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if allowed.Load() != burst || allowed.Load()+denied.Load() != workers*perWorker {
		t.Errorf("%d spends over 3 processes against a burst of %d: %d allowed, %d denied; want exactly %d allowed",
			workers*perWorker, burst, allowed.Load(), denied.Load(), burst)
	}
	t.Logf("measured: three processes: %d concurrent spends (%d goroutines, round robin) against burst %d: %d allowed, %d denied",
		workers*perWorker, workers, burst, allowed.Load(), denied.Load())

	// An override created through the first process is used by all.
	created := time.Now()
	res, err := admin.CreateOverrideWithResponse(bg, client.OverrideCreate{Limit: limit, BucketID: "0042", Burst: ptr(int64(1000)), Count: ptr(int64(1000)), Period: ptr("1h")})
	if err != nil || res.JSON201 == nil {
		t.Fatalf("creating the override: %v", describe(res, err))
	}
	if res.JSON201.BucketID != "42" {
		t.Errorf("bucket id %q stored, want the canonical 42", res.JSON201.BucketID)
	}
	delays := make([]time.Duration, len(procs))
	for i, c := range clients {
		wg.Go(func() {
			for time.Since(created) < 10*time.Second {
				if usesOverride(c, limit, "42", 1000) {
					delays[i] = time.Since(created)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Errorf("process %d did not use the override within 10 s", i+1)
		})
	}
	wg.Wait()
	t.Logf("measured: three processes: an override created through process 1 was used by processes 1, 2, 3 after %v", roundAll(delays))
}

func roundAll(ds []time.Duration) string {
	out := ""
	for i, d := range ds {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprint(d.Round(time.Millisecond))
	}
	return out
}
