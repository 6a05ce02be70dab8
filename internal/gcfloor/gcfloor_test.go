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
		{0, 64 * mib, 6400}, // as a heap of 1 MiB
		{3 * mib, 1 * mib, 100},
		{1 * mib, 1000 * mib, 100000},
	} {
		if got := gcfloor.Percent(c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

// gogc reads the percent the runtime uses now.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

func TestKeepSetsThePercentAfterEachCollection(t *testing.T) {
	stop := gcfloor.Keep(func(string) string { return "" }, 256<<20)
	want := func() int {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return gcfloor.Percent(s[0].Value.Uint64(), 256<<20)
	}
	// The finalizer runs on its own goroutine after the collection.
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		if got := gogc(); got == want() && got > gcfloor.DefaultPercent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GOGC is %d after collections, want %d", gogc(), want())
		}
		time.Sleep(10 * time.Millisecond)
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
