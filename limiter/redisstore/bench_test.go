package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// roomy never runs out at benchmark speeds, so that every spend writes.
var roomy = limiter.Params{Burst: 1_000_000, Count: 1_000_000, Period: time.Second}

// benchOptions give a fresh prefix and a patient timeout: the benchmarks
// measure spends, not the fail mode.
func benchOptions() redisstore.Options {
	return redisstore.Options{Prefix: testenv.RandomName("rlbench:") + ":", Timeout: patient}
}

// BenchmarkSpend measures spends of one and of three buckets on the shared
// single node, from GOMAXPROCS goroutines, and reports the round trips per
// spend.
func BenchmarkSpend(b *testing.B) {
	client := testenv.Redis(b)
	var trips roundTrips
	client.AddHook(&trips)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			s := redisstore.New(client, benchOptions())
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("%d:bench", i+1)
			}
			benchSpends(b, s, &trips, keys)
		})
	}
}

// BenchmarkClusterSpend measures spends of one bucket, and of three
// buckets on three masters, on the test Cluster; roundtrips/op counts
// client calls, each a command or a pipeline sent to the nodes at once.
func BenchmarkClusterSpend(b *testing.B) {
	client := clusterClient(b)
	master := masters(b, client)
	var trips roundTrips
	client.AddHook(&trips)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			opts := benchOptions()
			s := redisstore.New(client, opts)
			var keys []string
			seen := map[string]bool{}
			for i := 1; len(keys) < n; i++ {
				k := fmt.Sprintf("%d:bench", i)
				if m := master(opts.Prefix + k); !seen[m] {
					seen[m] = true
					keys = append(keys, k)
				}
			}
			benchSpends(b, s, &trips, keys)
		})
	}
}

func benchSpends(b *testing.B, s *redisstore.Store, trips *roundTrips, keys []string) {
	ctx := context.Background()
	warm := make([]limiter.Bucket, len(keys))
	for i, k := range keys {
		warm[i] = limiter.Bucket{Key: []byte(k), Rate: roomy.Rate(), Cost: 1}
	}
	if err := s.Spend(ctx, time.Now(), warm); err != nil { // loads the script
		b.Fatal(err)
	}
	trips.n.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		batch := make([]limiter.Bucket, len(keys))
		for pb.Next() {
			for i, k := range keys {
				batch[i] = limiter.Bucket{Key: []byte(k), Rate: roomy.Rate(), Cost: 1}
			}
			if err := s.Spend(ctx, time.Now(), batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(trips.n.Load())/float64(b.N), "roundtrips/op")
}
