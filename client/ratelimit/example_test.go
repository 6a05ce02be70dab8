package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
	"github.com/ratelimitd/ratelimitd/client/ratelimit"
)

// A service puts a limit of ratelimitd's in front of its handler: here
// RequestsPerIP, a burst of 2 per client address (the fake stands in for
// ratelimitd). The third request from one address is a 429.
func Example() {
	ratelimitd := fakeratelimitd.Start(map[string]int64{"RequestsPerIP": 2})
	defer ratelimitd.Close()

	// Timeout is a second, not the default 50ms, only because examples
	// run as tests on machines that may be busy.
	rl, err := ratelimit.New(ratelimit.Config{URL: ratelimitd.URL, Token: fakeratelimitd.Token, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	limited := ratelimit.Middleware(rl, ratelimit.Rule{Limit: "RequestsPerIP", Key: ratelimit.ClientIP(clientip.Loopback...)})
	handler := limited(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))

	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.7:41000"
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "RequestsPerIP";r=1;t=0 Retry-After: ""
	// 200 RateLimit: "RequestsPerIP";r=0;t=0 Retry-After: ""
	// 429 RateLimit: "RequestsPerIP";r=0;t=60 Retry-After: "60"
}

// Spend takes a cost from one bucket or several, all or nothing.
func ExampleClient_Spend() {
	ratelimitd := fakeratelimitd.Start(map[string]int64{"ExportsPerAccount": 5})
	defer ratelimitd.Close()
	rl, err := ratelimit.New(ratelimit.Config{URL: ratelimitd.URL, Token: fakeratelimitd.Token, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}

	res, err := rl.Spend(context.Background(), ratelimit.Bucket{Limit: "ExportsPerAccount", ID: "acct-42", Cost: 3})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Decisions[0].Remaining)
	res, err = rl.Spend(context.Background(), ratelimit.Bucket{Limit: "ExportsPerAccount", ID: "acct-42", Cost: 3})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.RetryAfter)
	// Output:
	// true 2
	// false 1m0s
}

// A lease holds a unit of a concurrency limit while a job runs, renewing
// itself; Done tells the job when the lease was lost.
func ExampleClient_Acquire() {
	ratelimitd := fakeratelimitd.Start(map[string]int64{"ExportJobs": 1})
	defer ratelimitd.Close()
	rl, err := ratelimit.New(ratelimit.Config{URL: ratelimitd.URL, Token: fakeratelimitd.Token, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	res, err := rl.Acquire(ctx, 30*time.Second, ratelimit.Bucket{Limit: "ExportJobs", ID: "acct-42", Cost: 1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first job:", res.Allowed)
	second, err := rl.Acquire(ctx, 30*time.Second, ratelimit.Bucket{Limit: "ExportJobs", ID: "acct-42", Cost: 1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("second job:", second.Allowed)

	select {
	case <-res.Lease.Done():
		fmt.Println("lease lost:", res.Lease.Err())
	default:
		fmt.Println("working")
	}
	if err := res.Lease.Release(ctx); err != nil {
		log.Print(err)
	}
	res, err = rl.Acquire(ctx, 30*time.Second, ratelimit.Bucket{Limit: "ExportJobs", ID: "acct-42", Cost: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer res.Lease.Release(ctx)
	fmt.Println("after the release:", res.Allowed)
	// Output:
	// first job: true
	// second job: false
	// working
	// after the release: true
}

// RoutePattern gives each route of an http.ServeMux its own bucket: the
// middleware wraps the handlers registered on the mux.
func ExampleRoutePattern() {
	ratelimitd := fakeratelimitd.Start(map[string]int64{"RequestsPerRoute": 100})
	defer ratelimitd.Close()
	rl, err := ratelimit.New(ratelimit.Config{URL: ratelimitd.URL, Token: fakeratelimitd.Token, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}

	perRoute := ratelimit.Middleware(rl, ratelimit.Rule{Limit: "RequestsPerRoute", Key: ratelimit.RoutePattern})
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", perRoute(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	for _, path := range []string{"/items/1", "/items/2"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, w.Header().Get("RateLimit"))
	}
	// Output:
	// /items/1 "RequestsPerRoute";r=99;t=0
	// /items/2 "RequestsPerRoute";r=98;t=0
}

// Hooks feed a service's own metrics: here counters a Prometheus
// registry would hold. Failing closed, a call ratelimitd does not answer
// returns ErrUnavailable.
func ExampleHooks() {
	ratelimitd := fakeratelimitd.Start(nil)
	ratelimitd.Close() // ratelimitd is down

	var failModes, breakerOpen atomic.Int64
	rl, err := ratelimit.New(ratelimit.Config{URL: ratelimitd.URL, Token: fakeratelimitd.Token, BreakerFailures: 2,
		Hooks: ratelimit.Hooks{
			FailMode: func(error) { failModes.Add(1) },
			Breaker: func(open bool) {
				if open {
					breakerOpen.Store(1)
				} else {
					breakerOpen.Store(0)
				}
			},
		}})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		res, err := rl.Spend(context.Background(), ratelimit.Bucket{Limit: "RequestsPerIP", ID: "192.0.2.7", Cost: 1})
		fmt.Println(res.Allowed, err != nil)
	}
	fmt.Println("fail-mode answers:", failModes.Load(), "breaker open:", breakerOpen.Load())
	// Output:
	// false true
	// false true
	// false true
	// fail-mode answers: 3 breaker open: 1
}
