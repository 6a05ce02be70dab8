package loader_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the benchmark fills Postgres directly

	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
	"github.com/ratelimitd/ratelimitd/loader"
)

// follower is a Limiter kept current by a Loader on a real database.
type follower struct {
	lim *limiter.Limiter
	ld  *loader.Loader
}

func follow(t testing.TB, d *db.DB) *follower {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &follower{lim: limiter.New(limiter.Config{Logger: quiet})}
	f.ld = loader.New(loader.Config{Source: d, Target: f.lim, SyncInterval: time.Hour, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.ld.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-f.ld.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatal("no snapshot after 30 s")
	}
	return f
}

// burst is the burst in force for a bucket, -1 when its limit is unknown.
func (f *follower) burst(limit, id string) int64 {
	r, err := f.lim.Snapshot().Resolve(limit, id, time.Now())
	if err != nil {
		return -1
	}
	return r.Params.Burst
}

func openDB(t testing.TB, url string) *db.DB {
	t.Helper()
	d, err := db.Open(context.Background(), url, db.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

var ordersLimit = limiter.Limit{Name: "NewOrdersPerAccount", Enum: 3, IDFormat: limiter.RegID,
	Params: limiter.Params{Burst: 300, Count: 300, Period: 3 * time.Hour}}

// TestChangesReachEveryReplica: a change committed through one process's
// database handle reaches the decisions of another without a restart.
func TestChangesReachEveryReplica(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			url := "sqlite:" + t.TempDir() + "/rl.db"
			if engine == "postgres" {
				url = testenv.Postgres(t)
			}
			writer := openDB(t, url)
			reader := writer
			if engine == "postgres" {
				reader = openDB(t, url) // another replica
			}
			f := follow(t, reader)
			ctx := context.Background()
			if _, _, err := writer.PutLimit(ctx, "test", ordersLimit); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the new limit", func() bool { return f.burst("NewOrdersPerAccount", "1") == 300 })
			o, err := writer.CreateOverride(ctx, "test", limiter.Override{Limit: "NewOrdersPerAccount", BucketID: "1", Enabled: true,
				Params: limiter.Params{Burst: 600, Count: 600, Period: 3 * time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the new override", func() bool { return f.burst("NewOrdersPerAccount", "1") == 600 })
			if err := writer.DeleteOverride(ctx, "test", o.ID); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the deletion", func() bool { return f.burst("NewOrdersPerAccount", "1") == 300 })
			r, err := writer.CreateRule(ctx, "test", limiter.Rule{Domain: "edge", Limit: "NewOrdersPerAccount",
				Descriptor: []limiter.DescriptorEntry{{Key: "account"}}})
			if err != nil {
				t.Fatal(err)
			}
			account := []limiter.DescriptorEntry{{Key: "account", Value: "7"}}
			eventually(t, "the new rule", func() bool {
				r, ok := f.lim.Snapshot().Match("edge", account)
				return ok && r.Limit == "NewOrdersPerAccount" && rules.BucketID(r, account) == "7"
			})
			// A replica that starts now reads the rule in its full load.
			if late := follow(t, openDB(t, url)); len(late.lim.Snapshot().Rules()) != 1 {
				t.Errorf("a full load has rules %v", late.lim.Snapshot().Rules())
			}
			if err := writer.DeleteRule(ctx, "test", r.ID); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the rule's deletion", func() bool {
				_, ok := f.lim.Snapshot().Match("edge", account)
				return !ok
			})
		})
	}
}

// BenchmarkChangeToDecision measures how long a committed override takes
// to reach the decisions of another replica on Postgres: commit, NOTIFY,
// incremental read, snapshot swap.
func BenchmarkChangeToDecision(b *testing.B) {
	url := testenv.Postgres(b)
	writer, reader := openDB(b, url), openDB(b, url)
	ctx := context.Background()
	if _, _, err := writer.PutLimit(ctx, "bench", ordersLimit); err != nil {
		b.Fatal(err)
	}
	f := follow(b, reader)
	var worst time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint(i + 1)
		start := time.Now()
		if _, err := writer.CreateOverride(ctx, "bench", limiter.Override{Limit: "NewOrdersPerAccount", BucketID: id, Enabled: true,
			Params: limiter.Params{Burst: 7, Count: 7, Period: time.Hour}}); err != nil {
			b.Fatal(err)
		}
		for f.burst("NewOrdersPerAccount", id) != 7 {
			time.Sleep(50 * time.Microsecond)
		}
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
}

// BenchmarkFullLoad loads 1,000,000 overrides from Postgres into a
// snapshot and reports the heap the snapshot adds.
func BenchmarkFullLoad(b *testing.B) {
	const n = 1_000_000
	url := testenv.Postgres(b)
	d := openDB(b, url)
	ctx := context.Background()
	if _, _, err := d.PutLimit(ctx, "bench", ordersLimit); err != nil {
		b.Fatal(err)
	}
	raw, err := sql.Open("pgx", url)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	_, err = raw.ExecContext(ctx, `
		INSERT INTO overrides (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, created_at, updated_at, updated_by, version)
		SELECT lpad(g::text, 26, '0'), 'NewOrdersPerAccount', (10000000 + g)::text, 600, 600, $2, false, 'bench', true, $3, $3, 'bench', 1
		FROM generate_series(1, $1::int) AS g`, n, int64(3*time.Hour), time.Now().UTC())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `VACUUM ANALYZE overrides`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f := follow(b, d)
		b.StopTimer()
		if got := f.ld.Status().Overrides; got != n {
			b.Fatalf("loaded %d overrides, want %d", got, n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "snapshot-MB")
		b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), "allocated-MB")
		b.StartTimer()
	}
}
