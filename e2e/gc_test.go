package e2e

import (
	"testing"
	"time"
)

// TestCollectorFloor: a process started without GOGC lets its heap grow
// by the floor's 64 MiB between collections, however small the heap, and
// one started with GOGC collects as Go's rules say.
func TestCollectorFloor(t *testing.T) {
	t.Parallel()
	const floor = 64 << 20
	def := newService(t, "ratelimitd", options{})
	set := newService(t, "ratelimitd GOGC=100", options{gogc: "100"})
	// A few requests, so that the processes have collected at least once
	// since they started.
	for range 20 {
		for _, s := range []*service{def, set} {
			_, _ = s.admin().ListLimitsWithResponse(bg)
		}
	}
	waitFor(t, 10*time.Second, "the floor's percent", func() bool {
		m := def.metrics("go_gc_gogc_percent", "go_memstats_next_gc_bytes")
		return m["go_gc_gogc_percent"] > 100 && m["go_memstats_next_gc_bytes"] >= floor
	})
	if m := set.metrics("go_gc_gogc_percent"); m["go_gc_gogc_percent"] != 100 {
		t.Errorf("with GOGC=100 the percent is %v", m["go_gc_gogc_percent"])
	}
}
