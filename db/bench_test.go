package db

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Benchmarks report figures; none of them decides whether anything passes.
// Run them with, for example:
//
//	CI=true go test -run '^$' -bench . -benchtime 1x ./db/

// parallel runs fn(i) for i in [0, b.N) on workers goroutines and reports
// the rate.
func parallel(b *testing.B, workers int, unit string, fn func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := fn(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
}

// BenchmarkCreateOverride measures CreateOverride, one transaction each,
// from one goroutine and from eight. Writers are serialised (lockWrites),
// so eight goroutines overlap only the work outside the write lock.
func BenchmarkCreateOverride(b *testing.B) {
	for _, engine := range []string{"postgres", "sqlite"} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", engine, workers), func(b *testing.B) {
				d := openMigrated(b, databaseURL(b, engine), nil)
				ctx := context.Background()
				if _, _, err := d.PutLimit(ctx, "bench", limitOf("L", limiter.RegID)); err != nil {
					b.Fatal(err)
				}
				parallel(b, workers, "creates/s", func(i int) error {
					_, err := d.CreateOverride(ctx, "bench", overrideOf("L", fmt.Sprint(i+1)))
					return err
				})
			})
		}
	}
}

// BenchmarkImport measures an Import of 100,000 overrides of a new limit
// (create) and of 100,000 existing overrides that all change (update).
func BenchmarkImport(b *testing.B) {
	const n = 100_000
	for _, engine := range []string{"postgres", "sqlite"} {
		for _, mode := range []string{"create", "update"} {
			b.Run(engine+"/"+mode, func(b *testing.B) {
				d := openMigrated(b, databaseURL(b, engine), nil)
				ctx := context.Background()
				overrides := make([]limiter.Override, n)
				for i := range overrides {
					overrides[i] = overrideOf("", fmt.Sprint(i+1))
				}
				limit := func(i int) string { return fmt.Sprintf("L%d", i) }
				if mode == "update" {
					for i := range overrides {
						overrides[i].Limit = limit(0)
					}
					if _, err := d.Import(ctx, "bench", []limiter.Limit{limitOf(limit(0), limiter.RegID)}, overrides, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for i := range b.N {
					name := limit(i + 1)
					if mode == "update" {
						name = limit(0)
					}
					for j := range overrides {
						overrides[j].Limit = name
						overrides[j].Count = int64(51 + i)
					}
					counts, err := d.Import(ctx, "bench", []limiter.Limit{limitOf(name, limiter.RegID)}, overrides, false)
					if err != nil {
						b.Fatal(err)
					}
					if counts.Created+counts.Updated < n {
						b.Fatalf("Import = %+v", counts)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "overrides/s")
			})
		}
	}
}

// BenchmarkFull measures Full over 1,000,000 enabled overrides on Postgres,
// with callbacks that only count. It reports what Full allocates in total
// and the largest heap seen while it streams, which stays small because no
// more than a row is held at a time.
func BenchmarkFull(b *testing.B) {
	const n = 1_000_000
	d := openMigrated(b, databaseURL(b, "postgres"), nil)
	ctx := context.Background()
	if _, _, err := d.PutLimit(ctx, "bench", limitOf("L", limiter.RegID)); err != nil {
		b.Fatal(err)
	}
	// Ids of 26 digits are valid ids, unique and in order.
	_, err := d.writer.ExecContext(ctx, `
		INSERT INTO overrides (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, created_at, updated_at, updated_by, version)
		SELECT lpad(g::text, 26, '0'), 'L', g::text, 100, 50, $2, false, 'bench', true, $3, $3, 'bench', 1
		FROM generate_series(1, $1::int) AS g`, n, int64(time.Minute), time.Now().UTC())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.writer.ExecContext(ctx, `VACUUM ANALYZE overrides`); err != nil {
		b.Fatal(err)
	}
	var before, after, during runtime.MemStats
	var heapMax uint64
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		limits, overrides := 0, 0
		_, err := d.Full(ctx,
			func(limiter.Limit) error { limits++; return nil },
			func(limiter.Override) error {
				overrides++
				if overrides%100_000 == 0 {
					runtime.ReadMemStats(&during)
					heapMax = max(heapMax, during.HeapAlloc)
				}
				return nil
			})
		if err != nil {
			b.Fatal(err)
		}
		if limits != 1 || overrides != n {
			b.Fatalf("Full read %d limits and %d overrides", limits, overrides)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/1e6, "MB-alloc/op")
	b.ReportMetric(float64(heapMax)/1e6, "MB-heap-max")
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "overrides/s")
}

// BenchmarkWriteLock measures what the write lock costs on Postgres: the
// same small write transaction (one audit insert) with and without
// pg_advisory_xact_lock, from one goroutine and from eight.
func BenchmarkWriteLock(b *testing.B) {
	for _, locked := range []bool{false, true} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("locked=%v/goroutines=%d", locked, workers), func(b *testing.B) {
				d := openMigrated(b, databaseURL(b, "postgres"), nil)
				pg := d.be.(*postgres)
				ctx := context.Background()
				parallel(b, workers, "tx/s", func(i int) error {
					tx, err := d.writer.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if locked {
						if err := pg.lockWrites(ctx, tx); err != nil {
							return err
						}
					}
					_, err = tx.ExecContext(ctx, `
						INSERT INTO audit (at, actor, entity, entity_id, action) VALUES ($1, 'bench', 'limit', $2, 'update')`,
						time.Now().UTC(), fmt.Sprint(i))
					if err != nil {
						return err
					}
					return tx.Commit()
				})
			})
		}
	}
}
