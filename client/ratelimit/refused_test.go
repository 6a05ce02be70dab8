package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// badKeys are bucket ids that ratelimitd refuses, each for the call that
// names it: too long for the id format, NUL, not UTF-8, longer than a
// whole body.
var badKeys = map[string]string{
	"too long for the format": strings.Repeat("k", 257),
	"NUL":                     "a\x00b",
	"not UTF-8":               "a\xffb",
	"longer than a body":      strings.Repeat("k", 2<<20),
}

// TestRefusedKey: a bucket id that ratelimitd refuses is the call's own
// error, a *Problem naming the bucket id, whatever the fail mode: never
// the fail mode's answer, never allowed, and no failure to the breaker,
// which one failure would open.
func TestRefusedKey(t *testing.T) {
	for name, id := range badKeys {
		t.Run(name, func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 10})
			var failModes atomic.Int32
			c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true, BreakerFailures: 1,
				Hooks: Hooks{FailMode: func(error) { failModes.Add(1) }}})
			ctx := context.Background()
			for op, call := range map[string]func() (Result, error){
				"spend":   func() (Result, error) { return c.Spend(ctx, Bucket{Limit: "L", ID: id, Cost: 1}) },
				"check":   func() (Result, error) { return c.Check(ctx, Bucket{Limit: "L", ID: id, Cost: 1}) },
				"refund":  func() (Result, error) { return c.Refund(ctx, Bucket{Limit: "L", ID: id, Cost: 1}) },
				"settle":  func() (Result, error) { return c.Settle(ctx, Settlement{Limit: "L", ID: id, Reserved: 1, Actual: 2}) },
				"acquire": func() (Result, error) { return c.Acquire(ctx, time.Minute, Bucket{Limit: "L", ID: id, Cost: 1}) },
			} {
				r, err := call()
				var p *Problem
				if !errors.As(err, &p) || p.Status < 400 || p.Status > 499 || !p.BadBucketID() || r.Allowed || r.Degraded || r.Lease != nil {
					t.Errorf("%s: %+v, %v; want a problem of the bucket id", op, r, err)
				}
			}
			if n := failModes.Load(); n != 0 {
				t.Errorf("the fail mode answered %d calls", n)
			}
			if r, err := c.Spend(ctx, Bucket{Limit: "L", ID: "good", Cost: 1}); err != nil || !r.Allowed || r.Degraded {
				t.Errorf("a good key after them: %+v, %v", r, err)
			}
		})
	}
}

// TestRefusedKeyAlone: a call that ratelimitd refuses leaves the calls
// that shared its request alone, even when its bucket ids, escaped,
// would make a body longer than ratelimitd takes.
func TestRefusedKeyAlone(t *testing.T) {
	for name, ids := range map[string][]string{
		"one too long":           {strings.Repeat("\x01", 200<<10)},
		"two long, escaped":      {strings.Repeat("\x01", 100<<10), strings.Repeat("\x02", 100<<10)},
		"a body's worth escaped": {strings.Repeat("\x01", 180<<10)},
	} {
		t.Run(name, func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 100})
			gate := make(chan struct{})
			f.Gate = gate
			c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true})
			ctx := context.Background()
			// The first call holds the only request in flight; the others
			// queue, and go together once it is back.
			first := make(chan error, 1)
			go func() { _, err := c.Spend(ctx, Bucket{Limit: "L", ID: "first", Cost: 1}); first <- err }()
			<-f.Arrived
			var wg sync.WaitGroup
			for i, id := range ids {
				wg.Go(func() {
					r, err := c.Spend(ctx, Bucket{Limit: "L", ID: id, Cost: 1})
					var p *Problem
					if !errors.As(err, &p) || !p.BadBucketID() || r.Allowed || r.Degraded {
						t.Errorf("bad key %d: %+v, %v", i, r, err)
					}
				})
			}
			for i := range 3 {
				wg.Go(func() {
					r, err := c.Spend(ctx, Bucket{Limit: "L", ID: "good" + strconv.Itoa(i), Cost: 1})
					if err != nil || !r.Allowed || r.Degraded {
						t.Errorf("good key %d: %+v, %v", i, r, err)
					}
				})
			}
			waitFor(t, "the calls queued", func() bool { return queued(c) >= 3 })
			close(gate)
			wg.Wait()
			if err := <-first; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestRefusedRequest: a 4xx of the whole request that says its body was
// refused (400, 413, 422) is no sign of a ratelimitd down: its calls get
// the problem, not the fail mode, and the breaker, which one failure
// would open, stays closed.
func TestRefusedRequest(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 10})
			var refuse atomic.Bool
			refuse.Store(true)
			f.Fault = func(w http.ResponseWriter, r *http.Request) bool {
				if !refuse.Load() {
					return false
				}
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(status)
				w.Write([]byte(`{"type":"about:blank","title":"` + http.StatusText(status) + `","status":` + strconv.Itoa(status) + `,"detail":"refused"}`))
				return true
			}
			var failModes atomic.Int32
			c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true, BreakerFailures: 1,
				Hooks: Hooks{FailMode: func(error) { failModes.Add(1) }}})
			r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: "k", Cost: 1})
			var p *Problem
			if !errors.As(err, &p) || p.Status != status || errors.Is(err, ErrUnavailable) || r.Allowed || r.Degraded {
				t.Errorf("%+v, %v; want the problem", r, err)
			}
			if failModes.Load() != 0 {
				t.Error("the fail mode answered")
			}
			refuse.Store(false)
			if r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: "k", Cost: 1}); err != nil || !r.Allowed || r.Degraded {
				t.Errorf("the next call: %+v, %v; the breaker opened", r, err)
			}
		})
	}
}
