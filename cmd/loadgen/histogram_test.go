package main

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestBucketsCoverEveryValue: bucket bounds are contiguous and each value
// falls in the bucket whose bounds hold it, at the edges of every bucket.
func TestBucketsCoverEveryValue(t *testing.T) {
	next := uint64(0)
	for i := range histBuckets {
		lo, hi := bucketBounds(i)
		if lo != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, next)
		}
		if hi < lo {
			t.Fatalf("bucket %d: [%d, %d]", i, lo, hi)
		}
		for _, v := range []uint64{lo, hi, lo + (hi-lo)/2} {
			if got := bucketOf(v); got != i {
				t.Fatalf("bucketOf(%d) = %d, want %d [%d, %d]", v, got, i, lo, hi)
			}
		}
		// Below 2·subBuckets a bucket holds one value; above, it is at most
		// 1/subBuckets of its values wide.
		if lo >= 2*subBuckets && float64(hi-lo+1)/float64(lo) > 1.0/subBuckets {
			t.Fatalf("bucket %d [%d, %d] is too wide", i, lo, hi)
		}
		if hi == math.MaxUint64 {
			if i != histBuckets-1 {
				t.Fatalf("the last value is in bucket %d of %d", i, histBuckets)
			}
			return
		}
		next = hi + 1
	}
	t.Fatalf("the buckets end at %d", next)
}

// TestQuantileNearestRank: small values are exact, so quantiles follow the
// nearest-rank definition exactly.
func TestQuantileNearestRank(t *testing.T) {
	var h histogram
	for v := 1; v <= 100; v++ {
		h.record(time.Duration(v))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.01, 1}, {0.5, 50}, {0.505, 51}, {0.9, 90}, {0.99, 99}, {0.999, 100}, {1, 100},
	} {
		if got := h.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if h.mean() != 50 { // 5050/100, truncated
		t.Errorf("mean %d, want 50", h.mean())
	}
}

// TestQuantileError: on realistic latencies a quantile is within a bucket
// of the exact one and never below it; min and max are exact.
func TestQuantileError(t *testing.T) {
	var h histogram
	var all []time.Duration
	// A deterministic spread from 20 µs to about 200 ms.
	x := uint64(88172645463325252)
	for range 100_000 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		d := 20*time.Microsecond + time.Duration(math.Pow(10, float64(x%4000)/1000))*time.Microsecond
		h.record(d)
		all = append(all, d)
	}
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := all[int(math.Ceil(q*float64(len(all))))-1]
		got := h.quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/subBuckets {
			t.Errorf("quantile(%v) = %v, exact %v", q, got, exact)
		}
	}
	if h.quantile(1) != all[len(all)-1] || time.Duration(h.max) != all[len(all)-1] || time.Duration(h.min) != all[0] {
		t.Errorf("max %v min %v, want %v and %v", time.Duration(h.max), time.Duration(h.min), all[len(all)-1], all[0])
	}
}

// TestMerge: merged histograms answer as one that recorded everything.
func TestMerge(t *testing.T) {
	var a, b, both histogram
	for v := range 1000 {
		d := time.Duration(v*v) * time.Nanosecond
		both.record(d)
		if v%3 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	var m histogram
	m.merge(&a)
	m.merge(&b)
	m.merge(&histogram{})
	if m != both {
		t.Fatal("merging differs from recording into one histogram")
	}
}

// TestEmptyAndNegative: an empty histogram answers zeros; a negative
// latency (a clock step) counts as zero.
func TestEmptyAndNegative(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 || h.mean() != 0 {
		t.Fatal("an empty histogram answers non-zero")
	}
	h.record(-time.Second)
	if h.n != 1 || h.quantile(1) != 0 {
		t.Fatalf("a negative latency: n %d, max %v", h.n, h.quantile(1))
	}
}

func BenchmarkRecord(b *testing.B) {
	var h histogram
	d := 1234567 * time.Nanosecond
	for b.Loop() {
		h.record(d)
		d += 7919
	}
}
