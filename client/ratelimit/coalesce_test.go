package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// TestCoalescing holds the first request at the fake's gate, queues 50
// calls behind it, and opens the gate: the first call went alone and at
// once, the 50 go together in the second request, and each caller gets
// the answer for its own bucket.
func TestCoalescing(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerUser": 3})
	f.Gate = make(chan struct{})
	c := newClient(t, f, Config{MaxInFlight: 1, Timeout: time.Minute})

	first := make(chan Result, 1)
	go func() {
		r, err := c.Spend(context.Background(), Bucket{Limit: "PerUser", ID: "u0", Cost: 1})
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	<-f.Arrived // the first call went without waiting for others

	const n = 50
	var wg sync.WaitGroup
	results := make([]Result, n)
	for i := range n {
		wg.Go(func() {
			// Bucket i spends i%5 tokens of 3: cost 4 is denied, the rest
			// allowed with what is left.
			r, err := c.Spend(context.Background(), Bucket{Limit: "PerUser", ID: fmt.Sprint("u", i+1), Cost: int64(i % 5)})
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		})
	}
	waitFor(t, "50 calls queued behind the first request", func() bool { return queued(c) == n })
	close(f.Gate)
	wg.Wait()
	if r := <-first; !r.Allowed || len(r.Decisions) != 1 || r.Decisions[0].BucketID != "u0" || r.Decisions[0].Remaining != 2 {
		t.Errorf("the first call: %+v", r)
	}
	requests, sizes := f.Counts()
	if requests != 2 || !slices.Equal(sizes, []int{1, n}) {
		t.Errorf("requests %d of sizes %v, want 2 of [1 %d]", requests, sizes, n)
	}
	for i, r := range results {
		cost := int64(i % 5)
		want := Decision{Limit: "PerUser", BucketID: fmt.Sprint("u", i+1), Allowed: true, Remaining: 3 - cost,
			Burst: 3, Count: 3, Period: time.Hour, Unit: "requests", Source: "default"}
		if cost > 3 {
			want.Allowed, want.Reason, want.Remaining, want.RetryAfter = false, "limited", 3, fakeratelimitd.Retry
		}
		if len(r.Decisions) != 1 || r.Decisions[0] != want || r.Allowed != want.Allowed {
			t.Errorf("call %d: %+v, want %+v", i, r, want)
		}
	}
}

// TestCoalescingBounds queues more calls than a request may carry and
// checks that no request carries more than MaxBatch and that no more than
// MaxInFlight are out at once; every call is answered.
func TestCoalescingBounds(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1 << 40})
	f.Gate = make(chan struct{})
	c := newClient(t, f, Config{MaxInFlight: 2, MaxBatch: 7, Timeout: time.Minute})
	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: fmt.Sprint(i), Cost: 1}); err != nil || !r.Allowed {
				t.Errorf("call %d: %+v, %v", i, r, err)
			}
		})
	}
	waitFor(t, "every call out or queued", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.inFlight == 2 && len(c.queue) >= n-2*7
	})
	close(f.Gate)
	wg.Wait()
	requests, sizes := f.Counts()
	total := 0
	for _, s := range sizes {
		total += s
		if s > 7 {
			t.Errorf("a request of %d calls, above MaxBatch 7", s)
		}
	}
	if total != n || f.MaxInFlight() > 2 {
		t.Errorf("%d calls in %d requests, at most %d in flight; want %d calls, at most 2 in flight", total, requests, f.MaxInFlight(), n)
	}
}

// TestCallContextEnds cancels one call, and lets another's deadline pass,
// while their request is held: each returns at once, while the request is
// still out, and a third call in the same request still gets its answer.
func TestCallContextEnds(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprint("open=", open), func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 10})
			f.Gate = make(chan struct{})
			c := newClient(t, f, Config{MaxInFlight: 1, Timeout: time.Minute, FailOpen: open})
			// A first call holds the only slot, so that the three below
			// go together in the next request.
			go c.Spend(context.Background(), Bucket{Limit: "L", ID: "first", Cost: 1})
			<-f.Arrived

			cancelled, cancel := context.WithCancel(context.Background())
			short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancelShort()
			type answer struct {
				r   Result
				err error
			}
			answers := make([]chan answer, 3)
			for i, ctx := range []context.Context{cancelled, short, context.Background()} {
				answers[i] = make(chan answer, 1)
				go func() {
					r, err := c.Spend(ctx, Bucket{Limit: "L", ID: fmt.Sprint(i), Cost: 1})
					answers[i] <- answer{r, err}
				}()
			}
			waitFor(t, "three calls queued", func() bool { return queued(c) == 3 })
			cancel()
			a := <-answers[0]
			if !errors.Is(a.err, context.Canceled) || a.r.Allowed {
				t.Errorf("the cancelled call: %+v, %v; want not allowed, context.Canceled", a.r, a.err)
			}
			a = <-answers[1]
			switch {
			case open && (a.err != nil || !a.r.Allowed || !a.r.Degraded):
				t.Errorf("the call past its deadline, failing open: %+v, %v; want allowed, degraded", a.r, a.err)
			case !open && (!errors.Is(a.err, ErrUnavailable) || !errors.Is(a.err, context.DeadlineExceeded) || a.r.Allowed):
				t.Errorf("the call past its deadline, failing closed: %+v, %v; want ErrUnavailable", a.r, a.err)
			}
			select {
			case a := <-answers[2]:
				t.Fatalf("the third call returned before its request was answered: %+v, %v", a.r, a.err)
			default:
			}
			close(f.Gate)
			a = <-answers[2]
			if a.err != nil || !a.r.Allowed || a.r.Degraded || a.r.Decisions[0].BucketID != "2" {
				t.Errorf("the third call: %+v, %v", a.r, a.err)
			}
			// The request went without the two calls nobody waited for.
			waitFor(t, "the second request answered", func() bool { n, _ := f.Counts(); return n == 2 })
			if _, sizes := f.Counts(); sizes[1] != 1 {
				t.Errorf("the second request carried %d calls, want the one still waited for", sizes[1])
			}
		})
	}
}

// TestProblemOfOneCall: ratelimitd refuses one call of a request (an
// unknown limit); that call alone gets the Problem, whatever the fail
// mode, and the others their decisions.
func TestProblemOfOneCall(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 10})
	f.Gate = make(chan struct{})
	c := newClient(t, f, Config{MaxInFlight: 1, Timeout: time.Minute, FailOpen: true})
	go c.Spend(context.Background(), Bucket{Limit: "L", ID: "first", Cost: 1})
	<-f.Arrived
	var wg sync.WaitGroup
	var bad, good Result
	var badErr, goodErr error
	wg.Go(func() { bad, badErr = c.Spend(context.Background(), Bucket{Limit: "Nope", ID: "x", Cost: 1}) })
	wg.Go(func() { good, goodErr = c.Spend(context.Background(), Bucket{Limit: "L", ID: "y", Cost: 1}) })
	waitFor(t, "two calls queued", func() bool { return queued(c) == 2 })
	close(f.Gate)
	wg.Wait()
	var p *Problem
	if !errors.As(badErr, &p) || p.Status != 422 || len(p.Errors) != 1 || p.Errors[0].Field != "buckets[0].limit" || bad.Allowed || bad.Degraded {
		t.Errorf("the unknown limit: %+v, %v", bad, badErr)
	}
	if goodErr != nil || !good.Allowed {
		t.Errorf("the other call: %+v, %v", good, goodErr)
	}
}

// TestInvalidUTF8 is refused before it is sent, as a bad value of the
// call alone: in a body it would make ratelimitd refuse every call of the
// request.
func TestInvalidUTF8(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 10})
	c := newClient(t, f, Config{})
	r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: "a\xffb", Cost: 1})
	var p *Problem
	if !errors.As(err, &p) || p.Status != 422 || p.Errors[0].Field != "buckets[0].bucket_id" || r.Allowed {
		t.Errorf("%+v, %v", r, err)
	}
	if n, _ := f.Counts(); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

// TestEveryOp sends each op through the fake, with the strings that must
// be escaped, and reads each answer.
func TestEveryOp(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 10, `Odd"\name`: 10})
	c := newClient(t, f, Config{Timeout: time.Minute})
	ctx := context.Background()
	id := "tab\there \"quoted\" back\\slash \x01 ünï"
	r, err := c.Spend(ctx, Bucket{Limit: `Odd"\name`, ID: id, Cost: 4})
	if err != nil || !r.Allowed || r.Decisions[0].BucketID != id || r.Decisions[0].Limit != `Odd"\name` || r.Decisions[0].Remaining != 6 {
		t.Fatalf("spend: %+v, %v", r, err)
	}
	if r, err := c.Check(ctx, Bucket{Limit: `Odd"\name`, ID: id, Cost: 0}); err != nil || !r.Allowed || r.Decisions[0].Remaining != 6 {
		t.Errorf("check: %+v, %v", r, err)
	}
	if r, err := c.Refund(ctx, Bucket{Limit: `Odd"\name`, ID: id, Cost: 3}); err != nil || r.Decisions[0].Remaining != 9 {
		t.Errorf("refund: %+v, %v", r, err)
	}
	if r, err := c.Settle(ctx, Settlement{Limit: `Odd"\name`, ID: id, Reserved: 1, Actual: 5}); err != nil || r.Decisions[0].Remaining != 5 {
		t.Errorf("settle: %+v, %v", r, err)
	}
	r, err = c.Acquire(ctx, 30*time.Second, Bucket{Limit: "L", ID: "job", Cost: 1})
	if err != nil || !r.Allowed || r.Lease == nil || r.Lease.ID() == "" || !r.Decisions[0].Concurrent {
		t.Fatalf("acquire: %+v, %v", r, err)
	}
	if err := r.Lease.Release(ctx); err != nil || r.Lease.Err() != nil {
		t.Errorf("release: %v, %v", err, r.Lease.Err())
	}
	for _, op := range []string{"spend", "check", "refund", "settle", "acquire", "release"} {
		if f.Op(op) != 1 {
			t.Errorf("the fake answered %d calls of %s, want 1", f.Op(op), op)
		}
	}
}
