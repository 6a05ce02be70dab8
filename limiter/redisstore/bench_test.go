package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// BenchmarkSpend measures spends, and settles beside them, of one and of
// three buckets on the shared single node, from GOMAXPROCS goroutines, and
// reports the round trips per call.
func BenchmarkSpend(b *testing.B) {
	client := testenv.Redis(b)
	var trips roundTrips
	client.AddHook(&trips)
	for _, op := range []limiter.Op{limiter.Spend, limiter.Settle} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("op=%s/buckets=%d", op, n), func(b *testing.B) {
				s := redisstore.New(client, benchOptions())
				keys := make([]string, n)
				for i := range keys {
					keys[i] = fmt.Sprintf("%d:bench", i+1)
				}
				benchApply(b, s, op, &trips, keys)
			})
		}
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
			benchApply(b, s, limiter.Spend, &trips, keys)
		})
	}
}

// benchApply measures calls of op on keys; a settle uses one token more
// than it reserved, so that it writes as a spend does.
func benchApply(b *testing.B, s limiter.Store, op limiter.Op, trips *roundTrips, keys []string) {
	ctx := context.Background()
	warm := make([]limiter.Bucket, len(keys))
	for i, k := range keys {
		warm[i] = limiter.Bucket{Key: []byte(k), Rate: roomy.Rate(), Cost: 1}
	}
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), warm); err != nil { // loads the script
		b.Fatal(err)
	}
	trips.n.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		batch := make([]limiter.Bucket, len(keys))
		for pb.Next() {
			for i, k := range keys {
				batch[i] = limiter.Bucket{Key: []byte(k), Rate: roomy.Rate(), Cost: 2, Reserved: 1}
			}
			if _, err := s.Apply(ctx, op, time.Now(), batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(trips.n.Load())/float64(b.N), "roundtrips/op")
}

// BenchmarkSpendConcurrent measures spends of one bucket from many
// goroutines at once, as the service makes them under load, each on its
// own bucket, on a private server; cpu-ns/op is this process's CPU time
// per spend, redis-cpu-ns/op the server's (INFO cpu), and spends/script
// how many spends a script call carried.
func BenchmarkSpendConcurrent(b *testing.B) {
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) { benchConcurrent(b, n) })
	}
}

func benchConcurrent(b *testing.B, goroutines int) {
	opts, err := redisstore.ParseURL("redis://" + testenv.RedisServer(b).Addr())
	if err != nil {
		b.Fatal(err)
	}
	client := redis.NewUniversalClient(opts)
	b.Cleanup(func() { _ = client.Close() })
	s := redisstore.New(client, benchOptions())
	ctx := context.Background()
	var worker atomic.Int64
	warm := []limiter.Bucket{{Key: []byte("1:warm"), Rate: roomy.Rate(), Cost: 1}}
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), warm); err != nil { // loads the script
		b.Fatal(err)
	}
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	server := serverStats(b, client)
	cpu := testenv.CPUTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		batch := make([]limiter.Bucket, 1)
		key := []byte(fmt.Sprintf("1:bench%d", worker.Add(1)))
		for pb.Next() {
			batch[0] = limiter.Bucket{Key: key, Rate: roomy.Rate(), Cost: 1}
			if _, err := s.Apply(ctx, limiter.Spend, time.Now(), batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	testenv.ReportCPU(b, cpu)
	after := serverStats(b, client)
	b.ReportMetric(float64((after.cpu-server.cpu).Nanoseconds())/float64(b.N), "redis-cpu-ns/op")
	b.ReportMetric(float64(b.N)/float64(after.scripts-server.scripts), "spends/script")
}

// stats are a server's CPU time and script calls so far.
type stats struct {
	cpu     time.Duration
	scripts int64
	// inScripts is the time the server spent running scripts, by its own
	// clock (INFO commandstats): steadier than cpu, which also counts
	// reading and writing the connections.
	inScripts time.Duration
}

func serverStats(b *testing.B, client redis.UniversalClient) stats {
	info, err := client.InfoMap(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var st stats
	for _, name := range []string{"used_cpu_sys", "used_cpu_user"} {
		sec, err := strconv.ParseFloat(info["CPU"][name], 64)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		st.cpu += time.Duration(sec * float64(time.Second))
	}
	for _, name := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		// calls=N,usec=M,...
		calls, rest, _ := strings.Cut(strings.TrimPrefix(info["Commandstats"][name], "calls="), ",")
		if n, err := strconv.ParseInt(calls, 10, 64); err == nil {
			st.scripts += n
		}
		usec, _, _ := strings.Cut(strings.TrimPrefix(rest, "usec="), ",")
		if n, err := strconv.ParseInt(usec, 10, 64); err == nil {
			st.inScripts += time.Duration(n) * time.Microsecond
		}
	}
	return st
}

// BenchmarkLease measures an acquire of one bucket and its release, one
// after the other, on the shared single node and on the test Cluster, from
// GOMAXPROCS goroutines, each on its own bucket; roundtrips/op counts the
// client's calls per pair: on a single node one for the acquire and two
// for the release, which reads the record before its script; on a
// Cluster, where the record lives in another slot than the bucket, two
// for the acquire, which writes the record after the bucket, and three for
// the release, which changes the record before the bucket; under a
// hash-tag prefix, which puts the record in the bucket's slot, as on a
// single node.
func BenchmarkLease(b *testing.B) {
	for _, store := range []string{"node", "cluster", "cluster-hashtag"} {
		b.Run("store="+store, func(b *testing.B) {
			var client redis.UniversalClient
			opts := benchOptions()
			switch store {
			case "node":
				client = testenv.Redis(b)
			case "cluster-hashtag":
				opts.Prefix = "{" + opts.Prefix + "}"
				fallthrough
			default:
				client = clusterClient(b)
			}
			var trips roundTrips
			client.AddHook(&trips)
			s := redisstore.New(client, opts)
			ctx := context.Background()
			pair := func(key []byte) error {
				rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: time.Now().Add(time.Minute).UnixMicro(), MaxTTL: time.Minute}
				if ok, err := s.Acquire(ctx, time.Now(), &rec, []limiter.LeaseBucket{{Key: key, Burst: 1 << 20, Cost: 1}}); err != nil || !ok {
					return fmt.Errorf("acquire: %v %v", ok, err)
				}
				_, err := s.Release(ctx, time.Now(), rec.ID)
				return err
			}
			if err := pair([]byte("1:warm")); err != nil { // loads the script
				b.Fatal(err)
			}
			var worker atomic.Int64
			trips.n.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := []byte(fmt.Sprintf("1:lease%d", worker.Add(1)))
				for pb.Next() {
					if err := pair(key); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(trips.n.Load())/float64(b.N), "roundtrips/op")
		})
	}
}

// BenchmarkApplyMany measures calls of ApplyMany of 64 spends of one
// bucket each, as a request to /v1/decisions makes them, from a few
// goroutines on a private server, every spend on a new bucket; the
// figures are per decision: cpu-ns/decision this process's CPU time,
// redis-cpu-ns/decision the server's (INFO cpu), redis-script-ns/decision
// its time inside the script, and decisions/script how many spends a
// script call carried.
func BenchmarkApplyMany(b *testing.B) {
	const per = 64
	opts, err := redisstore.ParseURL("redis://" + testenv.RedisServer(b).Addr())
	if err != nil {
		b.Fatal(err)
	}
	client := redis.NewUniversalClient(opts)
	b.Cleanup(func() { _ = client.Close() })
	s := redisstore.New(client, benchOptions())
	ctx := context.Background()
	warm := []limiter.Bucket{{Key: []byte("1:warm"), Rate: roomy.Rate(), Cost: 1}}
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), warm); err != nil { // loads the script
		b.Fatal(err)
	}
	var worker atomic.Int64
	b.SetParallelism(2)
	b.ReportAllocs()
	server := serverStats(b, client)
	cpu := testenv.CPUTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		buckets := make([]limiter.Bucket, per)
		batches := make([]limiter.Batch, per)
		keys := make([][]byte, per)
		for n := 0; pb.Next(); n++ {
			for i := range batches {
				keys[i] = fmt.Appendf(keys[i][:0], "1:w%d-%d", w, (n*per+i)%10000)
				buckets[i] = limiter.Bucket{Key: keys[i], Rate: roomy.Rate(), Cost: 1}
				batches[i] = limiter.Batch{Op: limiter.Spend, Buckets: buckets[i : i+1]}
			}
			s.ApplyMany(ctx, time.Now(), batches)
			for _, bt := range batches {
				if bt.Err != nil || !bt.Written {
					b.Errorf("%v, written %v", bt.Err, bt.Written)
					return
				}
			}
		}
	})
	b.StopTimer()
	after := serverStats(b, client)
	decisions := float64(b.N * per)
	b.ReportMetric(float64(testenv.CPUTime()-cpu)/decisions, "cpu-ns/decision")
	b.ReportMetric(float64((after.cpu-server.cpu).Nanoseconds())/decisions, "redis-cpu-ns/decision")
	b.ReportMetric(float64((after.inScripts-server.inScripts).Nanoseconds())/decisions, "redis-script-ns/decision")
	b.ReportMetric(decisions/float64(after.scripts-server.scripts), "decisions/script")
}
