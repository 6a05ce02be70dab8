package loader_test

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
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
	return followLogged(t, d, io.Discard)
}

// followLogged is follow with the loader's log going to w.
func followLogged(t testing.TB, d *db.DB, w io.Writer) *follower {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &follower{lim: limiter.New(limiter.Config{Logger: quiet})}
	f.ld = loader.New(loader.Config{Source: d, Target: f.lim, SyncInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(w, nil))})
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

// TestRowsLeftOut: rows this version cannot use, written around the
// service (a zone the binary lacks, an id format and a kind a newer
// version wrote, a period no decision can use, an override's parameters,
// a rule member a newer version wrote) and the overrides and rules of
// those limits, never stop a load, on both engines. A replica that starts
// loads everything else and reports each row left out with its reason,
// and logs it once; a replica already running applies the change, and
// every change after it.
func TestRowsLeftOut(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			url := "sqlite:" + t.TempDir() + "/rl.db"
			if engine == "postgres" {
				url = testenv.Postgres(t)
			}
			writer := openDB(t, url)
			ctx := context.Background()
			limit := func(name string, l limiter.Limit) {
				l.Name = name
				if l.IDFormat == "" {
					l.IDFormat = limiter.String
				}
				if _, _, err := writer.PutLimit(ctx, "test", l); err != nil {
					t.Fatal(err)
				}
			}
			rate := limiter.Limit{Params: limiter.Params{Burst: 10, Count: 10, Period: time.Minute}}
			for _, name := range []string{"Good", "BadFormat", "BadKind", "BadPeriod"} {
				limit(name, rate)
			}
			limit("BadZone", limiter.Limit{Calendar: limiter.CalendarDay, TimeZone: "Europe/Paris", Params: limiter.Params{Burst: 5, Count: 5}})
			override := func(l, bucket string, burst int64) limiter.Override {
				p := limiter.Params{Burst: burst, Count: burst, Period: time.Minute}
				if l == "BadZone" {
					p.Period = 0 // a quota's
				}
				o, err := writer.CreateOverride(ctx, "test", limiter.Override{Limit: l, BucketID: bucket, Enabled: true, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			kept, broken := override("Good", "a", 50), override("Good", "c", 60)
			ofZone := override("BadZone", "b", 7)
			rule := func(key, l string) limiter.Rule {
				r, err := writer.CreateRule(ctx, "test", limiter.Rule{Domain: "d", Limit: l, Descriptor: []limiter.DescriptorEntry{{Key: key}}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			goodRule, newerRule, ofFormat := rule("k", "Good"), rule("g", "Good"), rule("f", "BadFormat")

			var runningLog testenv.LockedBuffer
			running := followLogged(t, openDB(t, url), &runningLog)
			if burst := running.burst("Good", "c"); burst != 60 {
				t.Fatalf("before: the override's burst %d", burst)
			}
			testenv.Corrupt(t, url,
				testenv.Corruption{SQL: "UPDATE limits SET time_zone = 'localtime' WHERE name = 'BadZone'", Entity: "limit", ID: "BadZone"},
				testenv.Corruption{SQL: "UPDATE limits SET id_format = 'uuid' WHERE name = 'BadFormat'", Entity: "limit", ID: "BadFormat"},
				testenv.Corruption{SQL: "UPDATE limits SET kind = 'token_bucket' WHERE name = 'BadKind'", Entity: "limit", ID: "BadKind"},
				testenv.Corruption{SQL: "UPDATE limits SET count = 1000000000, period = 1 WHERE name = 'BadPeriod'", Entity: "limit", ID: "BadPeriod"},
				testenv.Corruption{SQL: "UPDATE overrides SET count = 1000000000, period = 1 WHERE id = $1", Args: []any{broken.ID},
					Entity: "override", ID: broken.ID, Limit: "Good", Bucket: "c"},
				testenv.Corruption{SQL: `UPDATE rules SET descriptor = '[{"key":"g","regex":"a.*"}]' WHERE id = $1`, Args: []any{newerRule.ID},
					Entity: "rule", ID: newerRule.ID},
			)
			want := []limiter.LeftOut{
				{Entity: "limit", ID: "BadFormat", Reason: "id_format: "},
				{Entity: "limit", ID: "BadKind", Reason: "kind: must be rate or concurrency"},
				{Entity: "limit", ID: "BadPeriod", Reason: "period: "},
				{Entity: "limit", ID: "BadZone", Reason: "time_zone: must be an IANA zone name"},
				{Entity: "override", ID: broken.ID, Limit: "Good", Reason: "period: "},
				{Entity: "override", ID: ofZone.ID, Limit: "BadZone", Reason: "its limit BadZone is left out"},
				{Entity: "rule", ID: newerRule.ID, Limit: "Good", Reason: `holds what this version cannot read: descriptor: json: unknown field "regex"`},
				{Entity: "rule", ID: ofFormat.ID, Limit: "BadFormat", Reason: "its limit BadFormat is left out"},
			}
			slices.SortFunc(want, func(a, b limiter.LeftOut) int {
				return cmp.Or(strings.Compare(a.Entity, b.Entity), strings.Compare(a.ID, b.ID))
			})

			// The running replica reads the change, and those after it.
			if err := running.ld.Sync(ctx); err != nil {
				t.Fatalf("the running replica's load: %v", err)
			}
			limit("Later", rate)
			if err := running.ld.Sync(ctx); err != nil {
				t.Fatalf("the running replica's load after a later change: %v", err)
			}
			// A replica that starts now loads everything else.
			var freshLog testenv.LockedBuffer
			fresh := followLogged(t, openDB(t, url), &freshLog)
			for name, f := range map[string]*follower{"running": running, "fresh": fresh} {
				wantLeftOut(t, name, f.ld.Status().LeftOut, want)
				s := f.lim.Snapshot()
				for _, c := range []struct {
					limit, id string
					burst     int64
				}{{"Good", "a", kept.Burst}, {"Good", "c", 10}, {"Later", "x", 10}, {"BadZone", "b", -1}, {"BadFormat", "x", -1}, {"BadKind", "x", -1}, {"BadPeriod", "x", -1}} {
					if got := f.burst(c.limit, c.id); got != c.burst {
						t.Errorf("%s: %s %s has burst %d, want %d", name, c.limit, c.id, got, c.burst)
					}
				}
				if r, ok := s.Match("d", []limiter.DescriptorEntry{{Key: "k", Value: "1"}}); !ok || r.ID != goodRule.ID {
					t.Errorf("%s: the good rule is not in force: %+v %v", name, r, ok)
				}
				for _, key := range []string{"g", "f"} {
					if r, ok := s.Match("d", []limiter.DescriptorEntry{{Key: key, Value: "1"}}); ok {
						t.Errorf("%s: a rule left out matches: %+v", name, r)
					}
				}
			}
			// Once per row and change: a full load finds the same rows, and
			// says nothing more.
			if err := fresh.ld.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(freshLog.String(), "left out of the snapshot"); n != len(want) {
				t.Errorf("%d log lines of rows left out, want %d:\n%s", n, len(want), freshLog.String())
			}

			// Fixed through the service, the limit is in force again with
			// its override, and its rows are no longer reported.
			fixed := limiter.Limit{Calendar: limiter.CalendarDay, TimeZone: "Europe/Paris", Params: limiter.Params{Burst: 5, Count: 5}}
			limit("BadZone", fixed)
			for name, f := range map[string]*follower{"running": running, "fresh": fresh} {
				if err := f.ld.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				if got := f.burst("BadZone", "b"); got != ofZone.Burst {
					t.Errorf("%s: after the fix, the override's burst is %d, want %d", name, got, ofZone.Burst)
				}
				if n := len(f.ld.Status().LeftOut); n != len(want)-2 {
					t.Errorf("%s: %d rows left out after the fix, want %d: %+v", name, n, len(want)-2, f.ld.Status().LeftOut)
				}
			}
			if !strings.Contains(freshLog.String(), "in force again") {
				t.Errorf("the fix is not logged:\n%s", freshLog.String())
			}
		})
	}
}

// wantLeftOut compares rows left out with want, whose reasons are
// prefixes.
func wantLeftOut(t *testing.T, name string, got, want []limiter.LeftOut) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: left out %+v, want %+v", name, got, want)
		return
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Entity != w.Entity || g.ID != w.ID || g.Limit != w.Limit || !strings.HasPrefix(g.Reason, w.Reason) {
			t.Errorf("%s: left out %+v, want %+v", name, g, w)
		}
	}
}
