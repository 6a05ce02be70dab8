// Package gcfloor keeps Go's garbage collector from running after every
// few megabytes of allocation when the live heap is small.
//
// Go collects when the heap has grown by GOGC percent of what the last
// collection found live. A ratelimitd replica holds a few megabytes (its
// snapshot, its buckets, its buffers) while every decision allocates a
// little, so at GOGC=100 a busy replica collected dozens of times a
// second, and each collection scans every goroutine's stack; on the gRPC
// front, which keeps many goroutines, that was about 40% of the process's
// CPU per call (docs/performance.md). Go offers a percent (GOGC) and a
// ceiling (GOMEMLIMIT), but no floor: this package adds one, by setting
// the percent after each collection so that the next one comes no sooner
// than a fixed headroom of allocation later. A large heap keeps GOGC=100
// and so pays nothing; a small one uses at most the headroom more memory.
// GOMEMLIMIT still applies, and wins near the limit.
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
	t := &tuner{headroom: headroom, samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
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

// adjust sets the percent that the heap found live by the last
// collection needs to grow by headroom.
func (t *tuner) adjust() {
	metrics.Read(t.samples)
	if t.samples[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	p := Percent(t.samples[0].Value.Uint64(), t.headroom)
	if p != t.percent && !t.stopped.Load() {
		t.percent = p
		debug.SetGCPercent(p)
	}
}

// Percent is the GOGC at which a heap of live bytes grows by at least
// headroom before the next collection, and never below DefaultPercent.
// It is rounded up to two significant digits, so that a heap that moves a
// little does not change it after every collection.
func Percent(live, headroom uint64) int {
	live = max(live, 1<<20)
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
