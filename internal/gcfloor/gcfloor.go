// Package gcfloor keeps Go's garbage collector from running after every
// few megabytes of allocation when the live heap is small.
//
// Go collects when the heap has grown by GOGC percent of what the last
// collection found live. A ratelimitd replica holds a few megabytes (its
// snapshot, its buckets, its buffers) while every decision allocates a
// little, so at GOGC=100 a busy replica collected dozens of times a
// second, and each collection scans every goroutine's stack; on the gRPC
// front, which keeps many goroutines, collecting less often took about 40%
// off the process's CPU per call (docs/performance.md). Go offers a
// percent (GOGC) and a ceiling (GOMEMLIMIT), but no floor: this package
// adds one, by setting the percent after each collection so that the next
// one comes no sooner than a fixed headroom of allocation later. A large
// heap keeps GOGC=100 and so pays nothing; a small one uses at most the
// headroom more memory. GOMEMLIMIT still applies, and wins near the limit.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// DefaultPercent is Go's own GOGC, which the floor never goes below.
const DefaultPercent = 100

// Keep makes every collection leave the heap room to grow by at least
// headroom bytes before the next, until stop is called, which puts GOGC
// back to 100. An operator who sets GOGC has chosen: then Keep changes
// nothing. getenv reads the environment.
func Keep(getenv func(string) string, headroom uint64) (stop func()) {
	if getenv("GOGC") != "" || headroom == 0 {
		return func() {}
	}
	t := &tuner{headroom: headroom, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	t.adjust()
	t.arm()
	return func() {
		if !t.stopped.Swap(true) {
			debug.SetGCPercent(DefaultPercent)
		}
	}
}

// tuner sets the percent after every collection, from the finalizer of an
// object that each collection frees: the one hook Go gives into its
// cycles.
type tuner struct {
	headroom uint64
	stopped  atomic.Bool
	// samples and percent are touched only by adjust, which runs on
	// Keep's goroutine once and then on the finalizer goroutine alone.
	samples []metrics.Sample
	percent int
}

// sentinel is what the finalizer hangs on; it holds a pointer so that it
// is not a tiny object, which the allocator may pack with others and free
// late.
type sentinel struct{ _ *int }

func (t *tuner) arm() {
	runtime.SetFinalizer(new(sentinel), func(*sentinel) {
		if t.stopped.Load() {
			return
		}
		t.adjust()
		t.arm()
	})
}

// adjust sets the percent at which the heap grows by headroom after the
// last collection. Go applies the percent to what that collection found
// live plus what it scans besides, the goroutines' stacks and the globals,
// so that is the base: the heap live alone would be a fraction of it when
// many goroutines wait, and the heap would grow by a multiple of headroom.
func (t *tuner) adjust() {
	metrics.Read(t.samples)
	var base uint64
	for _, s := range t.samples {
		if s.Value.Kind() != metrics.KindUint64 {
			return
		}
		base += s.Value.Uint64()
	}
	p := Percent(base, t.headroom)
	if p != t.percent && !t.stopped.Load() {
		t.percent = p
		debug.SetGCPercent(p)
	}
}

// minBase is the base below which Go's minimum heap, 4 MiB at GOGC=100
// and that times GOGC/100 at any other, decides when it collects.
const minBase = 4 << 20

// Percent is the GOGC at which a heap grows by at least headroom before
// the next collection, when the collector's base (what it found live and
// scans besides) is live bytes, and never below DefaultPercent.
// It is rounded up to two significant digits, so that a heap that moves a
// little does not change it after every collection.
func Percent(live, headroom uint64) int {
	// Go never collects below 4 MiB times the percent over 100, however
	// small the heap: below that, the percent sets the heap's size alone.
	live = max(live, minBase)
	p := (headroom*100 + live - 1) / live
	if p <= DefaultPercent {
		return DefaultPercent
	}
	step := uint64(1)
	for step*100 <= p {
		step *= 10
	}
	return int((p + step - 1) / step * step)
}
