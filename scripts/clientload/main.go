// Command clientload is the Go load program of `make bench`'s client rows:
// -goroutines goroutines, each in a closed loop, spend one token per
// call on bucket ids that step through 1..-ids of -limit, as services
// calling ratelimitd do, and check every answer. With -mode package the
// calls go through the Go package for services (client/ratelimit), which
// shares requests to POST /v1/decisions among them; with -mode rest, each
// is a POST /v1/spend through the generated client (package client), as
// a service calls ratelimitd without the package: the yardstick of what
// a call costs the client.
//
// It measures for -duration after -warmup and prints one line for
// scripts/bench.sh:
//
//	result <calls> <seconds> <p50 µs> <p99 µs> <errors> <wrong> <client CPU µs> <requests>
//
// calls counts the calls made, errors those that failed (any error,
// a fail-mode answer included), wrong those whose "allowed" was not
// -expect; client CPU is the user and system time of this process over
// the measured time (getrusage), so that of the calls and of measuring
// them; requests is how many HTTP requests carried the calls (-mode
// package; in -mode rest, one per call), which gives the mean batch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/client/ratelimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "clientload:", err)
		os.Exit(1)
	}
}

// spender makes one call and reports whether it was allowed.
type spender func(ctx context.Context, id string) (bool, error)

func run() error {
	url := flag.String("url", "", "ratelimitd's base URL")
	token := flag.String("token", "", "a bearer token of scope decide")
	mode := flag.String("mode", "package", "package (client/ratelimit) or rest (the generated client, POST /v1/spend)")
	limit := flag.String("limit", "bench_allowed_one", "the limit spent on, of id format reg_id")
	ids := flag.Int("ids", 10000, "bucket ids per limit")
	goroutines := flag.Int("goroutines", 64, "goroutines calling at once")
	duration := flag.Duration("duration", 10*time.Second, "measured time")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured load before")
	expect := flag.String("expect", "true", `what "allowed" must say: true, false or any`)
	inFlight := flag.Int("max-in-flight", 0, "the package's MaxInFlight; its default when 0")
	flag.Parse()
	if *url == "" || *token == "" || *ids < 1 || *goroutines < 1 || (*expect != "true" && *expect != "false" && *expect != "any") {
		flag.Usage()
		return errors.New("bad arguments")
	}

	var requests atomic.Int64
	var spend spender
	switch *mode {
	case "package":
		c, err := ratelimit.New(ratelimit.Config{URL: *url, Token: *token,
			// A bench's calls may queue behind a busy machine: the
			// default deadline of 50ms would make fail-mode answers of
			// them, and each is counted as an error.
			Timeout:     10 * time.Second,
			MaxInFlight: *inFlight,
			// Every call must reach ratelimitd, as every REST call does.
			NoLocalDenials: true,
			Hooks:          ratelimit.Hooks{Request: func(int, time.Duration, error) { requests.Add(1) }}})
		if err != nil {
			return err
		}
		spend = func(ctx context.Context, id string) (bool, error) {
			r, err := c.Spend(ctx, ratelimit.Bucket{Limit: *limit, ID: id, Cost: 1})
			return r.Allowed, err
		}
	case "rest":
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = *goroutines
		auth := "Bearer " + *token
		c, err := client.NewClientWithResponses(*url, client.WithHTTPClient(&http.Client{Transport: t, Timeout: 10 * time.Second}),
			client.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
				r.Header.Set("Authorization", auth)
				return nil
			}))
		if err != nil {
			return err
		}
		spend = func(ctx context.Context, id string) (bool, error) {
			requests.Add(1)
			res, err := c.SpendWithResponse(ctx, client.DecisionRequest{Buckets: []client.BucketRequest{{Limit: *limit, BucketID: id}}})
			switch {
			case err != nil:
				return false, err
			case res.JSON200 == nil:
				return false, fmt.Errorf("answered %d", res.StatusCode())
			}
			return res.JSON200.Allowed, nil
		}
	default:
		return fmt.Errorf("unknown -mode %q", *mode)
	}

	// The warm-up, then the measured run, each with every goroutine
	// calling; the measured run's figures alone are kept.
	load(spend, *goroutines, *ids, *warmup, *expect)
	requests.Store(0)
	cpu0 := cpuTime()
	res := load(spend, *goroutines, *ids, *duration, *expect)
	cpu := cpuTime() - cpu0
	slices.Sort(res.latencies)
	fmt.Printf("result %d %.3f %d %d %d %d %d %d\n", len(res.latencies), res.elapsed.Seconds(),
		percentile(res.latencies, 50), percentile(res.latencies, 99), res.errors, res.wrong, cpu.Microseconds(), requests.Load())
	if res.firstErr != nil {
		fmt.Fprintln(os.Stderr, "clientload: first error:", res.firstErr)
	}
	return nil
}

// result is what a load measured: the latency of each answered call in
// µs, and the calls that failed or answered wrong.
type result struct {
	latencies     []int64
	errors, wrong int64
	firstErr      error
	elapsed       time.Duration
}

// load runs goroutines calling spend in a closed loop for d. Goroutine i
// of n starts at id i·ids/n + 1, so that they spread over the buckets.
func load(spend spender, goroutines, ids int, d time.Duration, expect string) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu  sync.Mutex
		all result
		wg  sync.WaitGroup
	)
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			var r result
			next := g * ids / goroutines
			for ctx.Err() == nil {
				id := strconv.Itoa(next%ids + 1)
				next++
				t0 := time.Now()
				allowed, err := spend(context.Background(), id)
				r.latencies = append(r.latencies, time.Since(t0).Microseconds())
				switch {
				case err != nil:
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
				case expect != "any" && strconv.FormatBool(allowed) != expect:
					r.wrong++
				}
			}
			mu.Lock()
			all.latencies = append(all.latencies, r.latencies...)
			all.errors += r.errors
			all.wrong += r.wrong
			if all.firstErr == nil {
				all.firstErr = r.firstErr
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// percentile of sorted values, 0 when there are none.
func percentile(sorted []int64, p int) int64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// cpuTime is the user and system time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
