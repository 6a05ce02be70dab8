package gcfloor_test

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/gcfloor"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{4 * mib, 64 * mib, 1600},
		{5 * mib, 64 * mib, 1300}, // 1280, rounded up
		{64 * mib, 64 * mib, 100},
		{1 << 30, 64 * mib, 100},
		{0, 64 * mib, 1600}, // as a base of 4 MiB, Go's minimum heap
		{3 * mib, 64 * mib, 1600},
		{3 * mib, 1 * mib, 100},
		{1 * mib, 1000 * mib, 25000},
	} {
		if got := gcfloor.Percent(c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

// read reads runtime metrics by name.
func read(names ...string) []uint64 {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	out := make([]uint64, len(s))
	for i := range s {
		out[i] = s[i].Value.Uint64()
	}
	return out
}

// gogc reads the percent the runtime uses now.
func gogc() int { return int(read("/gc/gogc:percent")[0]) }

// TestKeepLeavesHeadroomAfterEachCollection: after a collection, the heap
// may grow by the headroom, and by not much more, before the next. Go's
// minimum heap grows with the percent (4 MiB at GOGC=100), so a small
// heap's percent computed from the heap alone once set the goal at four
// times the headroom.
func TestKeepLeavesHeadroomAfterEachCollection(t *testing.T) {
	const headroom = 64 << 20
	stop := gcfloor.Keep(func(string) string { return "" }, headroom)
	// The finalizer runs on its own goroutine after the collection.
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		m := read("/gc/heap/live:bytes", "/gc/heap/goal:bytes")
		live, goal := m[0], m[1]
		if goal >= live+headroom-4<<20 && goal <= live+headroom*11/10+4<<20 && gogc() > gcfloor.DefaultPercent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after collections, GOGC %d: heap goal %d MiB for %d MiB live, want it about %d MiB more", gogc(), goal>>20, live>>20, headroom>>20)
		}
	}
	stop()
	if got := gogc(); got != gcfloor.DefaultPercent {
		t.Fatalf("GOGC is %d after stop, want %d", got, gcfloor.DefaultPercent)
	}
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if got := gogc(); got != gcfloor.DefaultPercent {
		t.Fatalf("GOGC is %d after a collection that followed stop, want %d", got, gcfloor.DefaultPercent)
	}
}

func TestKeepLeavesAnOperatorsGOGC(t *testing.T) {
	before := gogc()
	stop := gcfloor.Keep(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}, 256<<20)
	defer stop()
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if got := gogc(); got != before {
		t.Fatalf("GOGC is %d with GOGC set in the environment, want it left at %d", got, before)
	}
}
