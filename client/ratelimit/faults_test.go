package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// faults are the ways the fake fails a request.
var faults = map[string]func(w http.ResponseWriter, r *http.Request) bool{
	"5xx": func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(`{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"upstream"}`))
		return true
	},
	"garbage": func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[{"allowed":tru`))
		return true
	},
	"too few results": func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[]}`))
		return true
	},
	"slow": func(w http.ResponseWriter, r *http.Request) bool {
		// With the body read, the server notices the client going away.
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return true
	},
	"closed mid-answer": func(w http.ResponseWriter, r *http.Request) bool {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"results\":[{\"allowed\":true,")
		buf.Flush()
		conn.Close()
		return true
	},
	"unauthorized": func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"type":"urn:ratelimitd:problem:unauthorized","title":"Unauthorized","status":401,"detail":"unknown token"}`))
		return true
	},
	"store down, ratelimitd closed": func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[{"problem":{"type":"urn:ratelimitd:problem:unavailable","title":"Service Unavailable","status":503,"detail":"a backend this request needs is unavailable; retry later"}}]}`))
		return true
	},
}

// TestFaults: whatever way ratelimitd fails, every call ends by its
// deadline with the fail mode's answer, never allowed together with an
// error, and the fail-mode hook hears of it.
func TestFaults(t *testing.T) {
	names := []string{"down"}
	for name := range faults {
		names = append(names, name)
	}
	for _, name := range names {
		for _, open := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/open=%v", name, open), func(t *testing.T) {
				t.Parallel()
				f := fakeratelimitd.New(t, map[string]int64{"L": 10})
				if name == "down" {
					f.Close()
				} else {
					f.Fault = faults[name]
				}
				var failModes atomic.Int32
				c := newClient(t, f, Config{Timeout: 50 * time.Millisecond, FailOpen: open, BreakerFailures: 1000,
					Hooks: Hooks{FailMode: func(err error) {
						if !errors.Is(err, ErrUnavailable) {
							t.Errorf("the fail-mode hook got %v, not ErrUnavailable", err)
						}
						failModes.Add(1)
					}}})
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Go(func() {
						start := time.Now()
						r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: fmt.Sprint(i), Cost: 1})
						// A generous bound: only a call that waited on
						// something other than its deadline exceeds it.
						if took := time.Since(start); took > 5*time.Second {
							t.Errorf("call %d took %v with a deadline of 50ms", i, took)
						}
						checkFailMode(t, open, r, err)
					})
				}
				wg.Wait()
				if failModes.Load() != 8 {
					t.Errorf("the fail-mode hook was called %d times for 8 calls", failModes.Load())
				}
			})
		}
	}
}

// checkFailMode fails the test unless r, err is the fail mode's answer.
func checkFailMode(t *testing.T, open bool, r Result, err error) {
	t.Helper()
	if r.Allowed && err != nil {
		t.Errorf("allowed together with an error: %+v, %v", r, err)
	}
	switch {
	case open && (err != nil || !r.Allowed || !r.Degraded):
		t.Errorf("failing open: %+v, %v; want allowed, degraded", r, err)
	case !open && (!errors.Is(err, ErrUnavailable) || r.Allowed):
		t.Errorf("failing closed: %+v, %v; want ErrUnavailable", r, err)
	}
}

// TestBreaker fails requests until the breaker opens, checks that calls
// then get the fail mode at once without a request, and that after the
// cooldown one probe goes, whose success closes it.
func TestBreaker(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1000})
	var broken atomic.Bool
	broken.Store(true)
	f.Fault = func(w http.ResponseWriter, r *http.Request) bool {
		if broken.Load() {
			return faults["5xx"](w, r)
		}
		return false
	}
	clk := newClock()
	var mu sync.Mutex
	var changes []bool
	c := newClient(t, f, Config{BreakerFailures: 3, BreakerCooldown: 10 * time.Second, Timeout: time.Minute,
		Hooks: Hooks{Breaker: func(open bool) { mu.Lock(); changes = append(changes, open); mu.Unlock() }}})
	c.now = clk.Now
	spend := func() (Result, error) {
		return c.Spend(context.Background(), Bucket{Limit: "L", ID: "x", Cost: 1})
	}

	for i := range 3 {
		if _, err := spend(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	arrived := len(f.Arrived)
	if arrived != 3 {
		t.Fatalf("%d requests for 3 calls", arrived)
	}
	for range 10 {
		_, err := spend()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("while open: %v", err)
		}
	}
	if len(f.Arrived) != arrived {
		t.Errorf("%d requests made while the breaker was open", len(f.Arrived)-arrived)
	}

	// The cooldown passes; the probe fails, and the breaker opens again
	// for another cooldown.
	clk.Add(10 * time.Second)
	if _, err := spend(); !errors.Is(err, ErrUnavailable) || len(f.Arrived) != arrived+1 {
		t.Fatalf("the first probe: %v, %d requests", err, len(f.Arrived)-arrived)
	}
	if _, err := spend(); !errors.Is(err, ErrUnavailable) || len(f.Arrived) != arrived+1 {
		t.Fatalf("after a failed probe: %v, %d requests", err, len(f.Arrived)-arrived)
	}

	// ratelimitd is back: after the cooldown the probe succeeds and the
	// breaker closes.
	broken.Store(false)
	clk.Add(10 * time.Second)
	if r, err := spend(); err != nil || !r.Allowed {
		t.Fatalf("the second probe: %+v, %v", r, err)
	}
	for range 3 {
		if r, err := spend(); err != nil || !r.Allowed {
			t.Fatalf("after the breaker closed: %+v, %v", r, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(changes) != "[true false]" {
		t.Errorf("the breaker hook heard %v, want [true false]", changes)
	}
}

// TestBreakerProbeAlone: while the probe's request is out, other calls
// get the fail mode at once, failing open too.
func TestBreakerProbeAlone(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1000})
	var mode atomic.Int32 // 0 fail, 1 hold at the gate
	gate := make(chan struct{})
	f.Fault = func(w http.ResponseWriter, r *http.Request) bool {
		if mode.Load() == 0 {
			return faults["5xx"](w, r)
		}
		<-gate
		return false
	}
	clk := newClock()
	c := newClient(t, f, Config{BreakerFailures: 1, BreakerCooldown: time.Second, Timeout: time.Minute, FailOpen: true})
	c.now = clk.Now
	spend := func() (Result, error) { return c.Spend(context.Background(), Bucket{Limit: "L", ID: "x", Cost: 1}) }
	if r, err := spend(); err != nil || !r.Degraded {
		t.Fatalf("the failure: %+v, %v", r, err)
	}
	mode.Store(1)
	clk.Add(time.Second)
	probe := make(chan Result, 1)
	go func() { r, _ := spend(); probe <- r }()
	waitFor(t, "the probe's request", func() bool { return len(f.Arrived) == 2 })
	for range 5 {
		if r, err := spend(); err != nil || !r.Allowed || !r.Degraded {
			t.Fatalf("beside the probe: %+v, %v", r, err)
		}
	}
	close(gate)
	if r := <-probe; !r.Allowed || r.Degraded {
		t.Errorf("the probe: %+v", r)
	}
	if len(f.Arrived) != 2 {
		t.Errorf("%d requests, want the failure and the probe", len(f.Arrived))
	}
}
