package memstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := memstore.New(memstore.Options{})
		t.Cleanup(s.Close)
		return storetest.Harness{
			Store:        s,
			Expiry:       func(t *testing.T, key string) (time.Time, bool) { return s.Expiry(key) },
			RecordExpiry: func(t *testing.T, id string) (time.Time, bool) { return s.RecordExpiry(id) },
			ExactBatches: true,
		}
	})
}

// TestSweepEvictsFullBuckets: memory follows the live buckets, not history.
func TestSweepEvictsFullBuckets(t *testing.T) {
	s := memstore.New(memstore.Options{})
	defer s.Close()
	start := time.Now()
	p := limiter.Params{Burst: 10, Count: 10, Period: time.Second}
	for i := range 1000 {
		b := []limiter.Bucket{{Key: fmt.Appendf(nil, "1:%d", i), Rate: p.Rate(), Cost: 1 + int64(i%2)}}
		if _, err := s.Apply(context.Background(), limiter.Spend, start, b); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n != 1000 {
		t.Fatalf("holds %d buckets, want 1000", n)
	}
	// At 150 ms the cost-1 buckets (full after 100 ms) go, the cost-2
	// buckets (full after 200 ms) stay.
	s.Sweep(start.Add(150 * time.Millisecond))
	if n := s.Len(); n != 500 {
		t.Fatalf("after a sweep at 150 ms it holds %d buckets, want 500", n)
	}
	s.Sweep(start.Add(200 * time.Millisecond))
	if n := s.Len(); n != 0 {
		t.Fatalf("after every bucket is full it holds %d, want 0", n)
	}
}

// TestSweeperRuns: the background sweeper evicts without any call.
func TestSweeperRuns(t *testing.T) {
	s := memstore.New(memstore.Options{SweepInterval: time.Millisecond})
	defer s.Close()
	p := limiter.Params{Burst: 1, Count: 1, Period: 10 * time.Millisecond}
	b := []limiter.Bucket{{Key: []byte("1:a"), Rate: p.Rate(), Cost: 1}}
	if _, err := s.Apply(context.Background(), limiter.Spend, time.Now(), b); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 1 {
		t.Fatal("the spent bucket is not held")
	}
	for deadline := time.Now().Add(10 * time.Second); s.Len() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not evict a full bucket within 10 s")
		}
	}
}

// BenchmarkApply measures spends, and settles beside them, of one bucket
// from GOMAXPROCS goroutines spread over 1024 buckets. A settle uses one
// token more than it reserved, so that it writes as a spend does.
func BenchmarkApply(b *testing.B) {
	roomy := limiter.Params{Burst: 1 << 30, Count: 1 << 30, Period: time.Second}.Rate()
	for _, op := range []limiter.Op{limiter.Spend, limiter.Settle} {
		b.Run("op="+op.String(), func(b *testing.B) {
			s := memstore.New(memstore.Options{})
			defer s.Close()
			keys := make([][]byte, 1024)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "1:%d", i)
			}
			var worker atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				batch := make([]limiter.Bucket, 1)
				for i := int(worker.Add(1)); pb.Next(); i++ {
					batch[0] = limiter.Bucket{Key: keys[i%len(keys)], Rate: roomy, Cost: 2, Reserved: 1}
					if _, err := s.Apply(context.Background(), op, time.Now(), batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
