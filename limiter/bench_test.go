package limiter_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// BenchmarkDecide is one in-process decision: snapshot lookup, GCRA and
// memstore, on a limit large enough that every spend is allowed. Parallel
// goroutines spread over 1024 buckets, as a service's clients would.
// cpu-ns/op is the CPU time per decision, which a hypervisor taking its
// share of the machine does not inflate as it does ns/op.
func BenchmarkDecide(b *testing.B) {
	big := limiter.Limit{Name: "Big", Enum: 1, IDFormat: limiter.RegID,
		Params: limiter.Params{Burst: 1 << 30, Count: 1 << 30, Period: time.Hour}}
	bl := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	if err := bl.PutLimit(big); err != nil {
		b.Fatal(err)
	}
	store := memstore.New(memstore.Options{})
	defer store.Close()
	l := limiter.New(limiter.Config{Store: store, DeniedCacheSize: 1 << 16})
	l.SetSnapshot(bl.Snapshot(1))
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = strconv.Itoa(10_000_000 + i)
	}
	var worker atomic.Int64
	b.ReportAllocs()
	cpu := testenv.CPUTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		reqs := []limiter.Request{{Limit: "Big", Cost: 1}}
		var dst []limiter.Decision
		i := int(worker.Add(1)) * 7919
		for pb.Next() {
			reqs[0].BucketID = ids[i%len(ids)]
			i++
			res, err := l.Decide(context.Background(), limiter.Spend, reqs, dst)
			if err != nil {
				b.Fatal(err)
			}
			dst = res.Decisions
		}
	})
	b.StopTimer()
	testenv.ReportCPU(b, cpu)
}

// BenchmarkSnapshotBuild builds a snapshot of 1,000,000 overrides and
// reports the heap it holds.
func BenchmarkSnapshotBuild(b *testing.B) {
	const n = 1_000_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(1_000_000_000 + i)
	}
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		bl := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
		if err := bl.PutLimit(orders()); err != nil {
			b.Fatal(err)
		}
		for _, id := range ids {
			o := limiter.Override{Limit: "NewOrdersPerAccount", BucketID: id, Enabled: true,
				Params: limiter.Params{Burst: 600, Count: 600, Period: 3 * time.Hour}}
			if err := bl.PutOverride(o); err != nil {
				b.Fatal(err)
			}
		}
		s := bl.Snapshot(1)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MB")
		runtime.KeepAlive(s)
	}
}
