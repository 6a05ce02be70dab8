package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// testManyInOrder: random calls of ApplyMany, each of batches of every
// operation on a few buckets, decide and write exactly what the batches
// would one after the other, as a model that applies limiter.StepBatch in
// turn computes: a batch sees what the batches before it in the same call
// wrote, a denied spend writes nothing and leaves the batches after it
// alone.
func testManyInOrder(t *testing.T, h Harness) {
	c := newChecker(t, h)
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 1))
	p := limiter.Params{Burst: 3, Count: 1, Period: time.Second}
	keys := []string{"1:a", "1:b", "2:a", "3:c"}
	// model holds the TAT of each key, as the batches in turn leave it.
	model := map[string]int64{}
	ops := []limiter.Op{limiter.Check, limiter.Spend, limiter.Spend, limiter.Refund, limiter.Settle}
	for call := range 40 {
		batches := make([]limiter.Batch, 1+r.IntN(8))
		for i := range batches {
			op := ops[r.IntN(len(ops))]
			var buckets []limiter.Bucket
			for _, k := range r.Perm(len(keys))[:r.IntN(3)] {
				b := bucket(keys[k], p, int64(r.IntN(3)))
				if op == limiter.Settle {
					b.Reserved = int64(r.IntN(3))
				}
				buckets = append(buckets, b)
			}
			batches[i] = limiter.Batch{Op: op, Buckets: buckets}
		}
		// The model's answers, batch after batch.
		nowUS := c.now.UnixMicro()
		want := make([]limiter.Batch, len(batches))
		for i, b := range batches {
			want[i] = limiter.Batch{Op: b.Op, Buckets: append([]limiter.Bucket(nil), b.Buckets...)}
			for j := range want[i].Buckets {
				want[i].Buckets[j].TAT = model[string(want[i].Buckets[j].Key)]
			}
			want[i].Written = limiter.StepBatch(b.Op, nowUS, want[i].Buckets)
			if want[i].Written {
				for _, x := range want[i].Buckets {
					model[string(x.Key)] = x.Next
				}
			}
		}
		h.Store.ApplyMany(context.Background(), c.now, batches)
		for i, b := range batches {
			if b.Err != nil {
				t.Fatalf("seed %d, call %d, batch %d (%s): %v", seed, call, i, b.Op, b.Err)
			}
			if b.Written != want[i].Written {
				t.Fatalf("seed %d, call %d, batch %d (%s): written %v, in turn %v", seed, call, i, b.Op, b.Written, want[i].Written)
			}
			for j, x := range b.Buckets {
				w := want[i].Buckets[j]
				if c.full(x.TAT) != c.full(w.TAT) || c.full(x.Next) != c.full(w.Next) || x.Outcome != w.Outcome {
					t.Fatalf("seed %d, call %d, batch %d (%s) on %s: TAT %d, next %d, %+v; in turn TAT %d, next %d, %+v",
						seed, call, i, b.Op, x.Key, x.TAT, x.Next, x.Outcome, w.TAT, w.Next, w.Outcome)
				}
			}
		}
		for k, tat := range model {
			if got := c.tats(bucket(k, p, 0))[0]; got != c.full(tat) {
				t.Fatalf("seed %d, after call %d: %s holds TAT %d, the batches in turn leave %d", seed, call, k, got, tat)
			}
		}
		c.advance(time.Duration(r.IntN(700)) * ms)
	}
}

// testManyConcurrent: calls of ApplyMany racing each other, each of
// single spends of one bucket and of batches that hold it beside an empty
// bucket, admit exactly the burst (at most, where batches are not exact),
// and the denied batches write nothing.
func testManyConcurrent(t *testing.T, h Harness) {
	p := limiter.Params{Burst: 100, Count: 1, Period: time.Hour}
	empty := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	if _, err := h.Store.Apply(context.Background(), limiter.Spend, time.Now(), []limiter.Bucket{bucket("1:empty", empty, 1)}); err != nil {
		t.Fatal(err)
	}
	var allowed atomic.Int64
	run(t, 32, 10, func() error {
		batches := make([]limiter.Batch, 8)
		for i := range batches {
			batches[i] = limiter.Batch{Op: limiter.Spend, Buckets: []limiter.Bucket{bucket("2:shared", p, 1)}}
			if i%3 == 2 {
				batches[i].Buckets = append(batches[i].Buckets, bucket("1:empty", empty, 1))
			}
		}
		h.Store.ApplyMany(context.Background(), time.Now(), batches)
		for i, b := range batches {
			switch {
			case b.Err != nil:
				return b.Err
			case i%3 == 2 && b.Written:
				return fmt.Errorf("a batch with an empty bucket was written: %+v", b.Buckets)
			case b.Written != b.Buckets[0].Outcome.Allowed && i%3 != 2:
				return fmt.Errorf("a spend reported written %v and %+v", b.Written, b.Buckets[0].Outcome)
			case b.Written:
				allowed.Add(1)
			}
		}
		return nil
	})
	got := allowed.Load()
	if got > p.Burst || h.ExactBatches && got != p.Burst {
		t.Fatalf("32x10 calls of 8 batches against a burst of %d admitted %d (exact: %v)", p.Burst, got, h.ExactBatches)
	}
	b := []limiter.Bucket{bucket("2:shared", p, 0)}
	if _, err := h.Store.Apply(context.Background(), limiter.Check, time.Now(), b); err != nil {
		t.Fatal(err)
	}
	if held := (b[0].TAT - time.Now().UnixMicro() + p.Rate().Interval - 1) / p.Rate().Interval; held != got {
		t.Fatalf("2:shared holds %d tokens after %d admitted spends", held, got)
	}
}
