package main

import (
	"math"
	"math/bits"
	"time"
)

// A histogram counts latencies in nanoseconds in log-linear buckets: values
// below 2·subBuckets are exact, and above, each power of two is split into
// subBuckets equal parts, so a bucket is at most 1/subBuckets (0.8%) of its
// values wide. Recording is an index computation and an increment, cheap
// enough for every request, and the memory is fixed however long the run.
// Each connection records into its own histogram; merge adds them up.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	min    uint64
	max    uint64
}

const (
	subBits    = 7
	subBuckets = 1 << subBits
	// histBuckets covers every uint64: the largest shift is 64-(subBits+1).
	histBuckets = (64-subBits)*subBuckets + subBuckets
)

// bucketOf returns the index of the bucket that holds v.
func bucketOf(v uint64) int {
	if v < 2*subBuckets {
		return int(v)
	}
	// v>>shift is in [subBuckets, 2·subBuckets).
	shift := bits.Len64(v) - (subBits + 1)
	return (shift+1)*subBuckets + int(v>>shift) - subBuckets
}

// bucketBounds returns the smallest and largest value of bucket i.
func bucketBounds(i int) (lo, hi uint64) {
	if i < 2*subBuckets {
		return uint64(i), uint64(i)
	}
	shift := i/subBuckets - 1
	m := uint64(i%subBuckets + subBuckets)
	lo = m << shift
	return lo, lo + (1 << shift) - 1
}

// record counts one latency; a negative one counts as zero.
func (h *histogram) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.n++
	h.sum += v
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// quantile returns the latency that q (0 < q <= 1) of the recorded ones do
// not exceed, by the nearest-rank definition: the value of rank ⌈q·n⌉ in
// sorted order. It answers the largest value of that value's bucket,
// clamped to the recorded range, so it overstates by less than a bucket's
// width and never understates. Zero when nothing was recorded.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketBounds(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// mean returns the average latency, zero when nothing was recorded.
func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}
