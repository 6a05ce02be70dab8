package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// TestLocalDenials: a spend ratelimitd denied is denied locally, without a
// request, at the same cost or more until its retry-after has passed; a
// smaller cost, another bucket, a refund through this client and the end
// of the retry-after each send the next spend to ratelimitd again.
func TestLocalDenials(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 2})
	clk := newClock()
	var hooked []string
	c := newClient(t, f, Config{Timeout: time.Minute, Hooks: Hooks{LocalDenial: func(limit string) { hooked = append(hooked, limit) }}})
	c.now = clk.Now
	ctx := context.Background()
	spend := func(id string, cost int64) Result {
		t.Helper()
		r, err := c.Spend(ctx, Bucket{Limit: "L", ID: id, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	requests := func() int { n, _ := f.Counts(); return n }

	spend("a", 2)
	if r := spend("a", 1); r.Allowed || r.Local || requests() != 2 {
		t.Fatalf("the denial by ratelimitd: %+v after %d requests", r, requests())
	}
	clk.Add(10 * time.Second)
	r := spend("a", 1)
	want := Decision{Limit: "L", BucketID: "a", Reason: "limited", Remaining: 0, RetryAfter: fakeratelimitd.Retry - 10*time.Second,
		ResetAfter: fakeratelimitd.Retry - 10*time.Second, Burst: 2, Count: 2, Period: time.Hour, Unit: "requests", Source: "default"}
	if r.Allowed || !r.Local || r.RetryAfter != want.RetryAfter || len(r.Decisions) != 1 || r.Decisions[0] != want || requests() != 2 {
		t.Errorf("the local denial: %+v after %d requests, want %+v", r, requests(), want)
	}
	if r := spend("a", 5); !r.Local || requests() != 2 {
		t.Errorf("a larger cost: %+v after %d requests", r, requests())
	}
	if r := spend("a", 0); r.Local || requests() != 3 {
		t.Errorf("a smaller cost: %+v after %d requests", r, requests())
	}
	if r := spend("b", 1); r.Local || !r.Allowed {
		t.Errorf("another bucket: %+v", r)
	}
	if len(hooked) != 2 || hooked[0] != "L" {
		t.Errorf("the local-denial hook heard %v", hooked)
	}

	// A refund through this client forgets the bucket.
	if _, err := c.Refund(ctx, Bucket{Limit: "L", ID: "a", Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if r := spend("a", 1); r.Local || !r.Allowed {
		t.Errorf("after a refund: %+v", r)
	}

	// The retry-after passes: the next spend asks ratelimitd.
	if r := spend("a", 1); r.Local || r.Allowed {
		t.Fatalf("denied again by ratelimitd: %+v", r)
	}
	clk.Add(fakeratelimitd.Retry)
	before := requests()
	if r := spend("a", 1); r.Local || requests() != before+1 {
		t.Errorf("after the retry-after: %+v", r)
	}
}

// TestNoLocalDenials sends every spend to ratelimitd.
func TestNoLocalDenials(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{NoLocalDenials: true})
	for range 4 {
		if r, err := c.Spend(context.Background(), Bucket{Limit: "L", ID: "a", Cost: 1}); err != nil || r.Local {
			t.Fatalf("%+v, %v", r, err)
		}
	}
	if n, _ := f.Counts(); n != 4 {
		t.Errorf("%d requests for 4 spends", n)
	}
}

// TestLocalDenialsBounded keeps no more buckets than its size.
func TestLocalDenialsBounded(t *testing.T) {
	ds := newDenials(3)
	now := time.Unix(0, 0)
	for i := range 10 {
		b := []Bucket{{Limit: "L", ID: string(rune('a' + i)), Cost: 1}}
		ds.learn(now, 0, b, []Decision{{Reason: "limited", RetryAfter: time.Second}})
	}
	if len(ds.m) != 3 || ds.n.Load() != 3 {
		t.Errorf("%d buckets kept (n %d), want 3", len(ds.m), ds.n.Load())
	}
}

// TestLocalDenialsRefundRace: a spend denied while a refund of its bucket
// was on its way is not remembered, since ratelimitd may have decided the
// spend before the refund: the next spend asks ratelimitd, and is allowed.
func TestLocalDenialsRefundRace(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	ctx := context.Background()
	if r, err := c.Spend(ctx, Bucket{Limit: "L", ID: "a", Cost: 1}); err != nil || !r.Allowed {
		t.Fatalf("the first spend: %+v, %v", r, err)
	}
	f.Gate = make(chan struct{})
	denied := make(chan Result, 1)
	go func() {
		r, _ := c.Spend(ctx, Bucket{Limit: "L", ID: "a", Cost: 1})
		denied <- r
	}()
	<-f.Arrived // the spend is out, held at the gate
	<-f.Arrived
	refunded := make(chan error, 1)
	go func() {
		_, err := c.Refund(ctx, Bucket{Limit: "L", ID: "a", Cost: 1})
		refunded <- err
	}()
	waitFor(t, "the refund queued behind the spend", func() bool { return queued(c) == 1 })
	close(f.Gate)
	if r := <-denied; r.Allowed || r.Local {
		t.Fatalf("the spend before the refund: %+v", r)
	}
	if err := <-refunded; err != nil {
		t.Fatal(err)
	}
	if r, err := c.Spend(ctx, Bucket{Limit: "L", ID: "a", Cost: 1}); err != nil || r.Local || !r.Allowed {
		t.Errorf("the spend after the refund: %+v, %v; want ratelimitd's allowed answer", r, err)
	}
}
