package db

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// The contract suite: every test runs against both engines, each time on
// a database of its own.

// quiet is the logger of tests: migrations are not news there.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// env is one test's database.
type env struct {
	engine string
	url    string
	db     *DB
	clock  *testenv.Clock
}

// epoch is the test clock's first reading; its nanoseconds show that
// stored times are cut to microseconds.
func epoch() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC) }

func databaseURL(t testing.TB, engine string) string {
	if engine == "postgres" {
		return testenv.Postgres(t)
	}
	return "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
}

func openMigrated(t testing.TB, url string, now func() time.Time) *DB {
	t.Helper()
	d, err := Open(context.Background(), url, Options{Now: now, Logger: quiet()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return d
}

func newEnv(t testing.TB, engine string) *env {
	c := testenv.NewClock(epoch())
	url := databaseURL(t, engine)
	return &env{engine: engine, url: url, db: openMigrated(t, url, c.Now), clock: c}
}

// run runs test on each engine, in parallel.
func run(t *testing.T, test func(t *testing.T, e *env)) {
	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, engine))
		})
	}
}

func ctxT(t *testing.T) context.Context { return t.Context() }

func limitOf(name string, f limiter.IDFormat) limiter.Limit {
	return limiter.Limit{
		Name: name, IDFormat: f, Kind: limiter.KindRate,
		Params:      limiter.Params{Burst: 10, Count: 5, Period: time.Hour},
		Description: "test limit " + name,
		Unit:        limiter.DefaultUnit,
	}
}

func (e *env) putLimit(t *testing.T, l limiter.Limit) limiter.Limit {
	t.Helper()
	got, _, err := e.db.PutLimit(ctxT(t), "alice", l)
	if err != nil {
		t.Fatalf("PutLimit(%s): %v", l.Name, err)
	}
	return got
}

func overrideOf(limit, bucket string) limiter.Override {
	return limiter.Override{
		Limit: limit, BucketID: bucket,
		Params:  limiter.Params{Burst: 100, Count: 50, Period: time.Minute},
		Comment: "ticket " + bucket, Enabled: true,
	}
}

func (e *env) createOverride(t *testing.T, o limiter.Override) limiter.Override {
	t.Helper()
	got, err := e.db.CreateOverride(ctxT(t), "bob", o)
	if err != nil {
		t.Fatalf("CreateOverride(%s, %s): %v", o.Limit, o.BucketID, err)
	}
	return got
}

// rowCounts counts the rows of every table.
func (e *env) rowCounts(t *testing.T) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, table := range []string{"limits", "enums", "overrides", "audit", "tokens"} {
		var n int
		if err := e.db.reader.QueryRowContext(ctxT(t), "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("counting %s: %v", table, err)
		}
		counts[table] = n
	}
	return counts
}

// version returns the database's current change version.
func (e *env) version(t *testing.T) int64 {
	t.Helper()
	c, err := e.db.Since(ctxT(t), 0)
	if err != nil {
		t.Fatalf("Since(0): %v", err)
	}
	return c.Version
}

// wantError checks that err wraps kind and that its message, which API
// clients see, is the one expected and holds no SQL or driver text.
func wantError(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error = %v, want %v", err, want)
	}
	if w := leakedWord(err.Error()); w != "" {
		t.Errorf("message %q leaks %q", err.Error(), w)
	}
}

// driverWords are words of SQL and of the drivers' own messages, which
// db's errors must not pass on.
var driverWords = map[string]bool{
	"sqlstate": true, "constraint": true, "insert": true, "update": true, "select": true,
	"sqlite": true, "pgx": true, "pgconn": true, "violates": true, "violation": true,
}

// leakedWord returns the first driver word in msg, compared as a whole
// word: a random ULID or bucket id in the message may spell "PGX" inside
// itself, and that is no leak.
func leakedWord(msg string) string {
	for _, w := range strings.FieldsFunc(msg, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}) {
		if driverWords[strings.ToLower(w)] {
			return w
		}
	}
	return ""
}

func TestLeakedWord(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]string{
		`rule "01KQPGX3ZP0V1A2B3C4D5E6F7G" not found`:                                "",
		`override of "UpdatesPerAccount" for "7" exists`:                             "",
		`creating rule: ERROR: duplicate key value violates unique (SQLSTATE 23505)`: "violates",
		`pgx: conn closed`:            "pgx",
		`sqlite3: constraint failed`:  "sqlite",
		`UPDATE limits SET burst = 1`: "UPDATE",
	} {
		if got := leakedWord(msg); got != want {
			t.Errorf("leakedWord(%q) = %q, want %q", msg, got, want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	for _, url := range []string{"", "mysql://x", "sqlite:", "sqlite::memory:", "file:x.db"} {
		if d, err := Open(ctx, url, Options{}); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) succeeded", url)
		}
	}
	_, err := Open(ctx, "mysql://x", Options{})
	if err == nil || !strings.Contains(err.Error(), `"sqlite:PATH"`) || !strings.Contains(err.Error(), `"postgres://...`) {
		t.Errorf("error does not name the accepted forms: %v", err)
	}
	// Nothing listens on port 1.
	_, err = Open(ctx, "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=5", Options{})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Open of an unreachable server = %v, want ErrUnavailable", err)
	}
	_, err = Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "missing", "dir", "x.db"), Options{})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Open of a file that cannot be created = %v, want ErrUnavailable", err)
	}
	// SQLite ends a path at NUL: "x.db\x00y" would open, and create, x.db.
	dir := t.TempDir()
	if d, err := Open(ctx, "sqlite:"+filepath.Join(dir, "x.db\x00y"), Options{}); err == nil {
		_ = d.Close()
		t.Error("Open of a path with NUL succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("Open of a path with NUL created %v", entries)
	}
}

func TestUnavailableAndCanceled(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		d := openMigrated(t, e.url, nil)
		canceled, cancel := context.WithCancel(ctxT(t))
		cancel()
		_, err := d.GetLimit(canceled, "L")
		if !errors.Is(err, context.Canceled) || errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("GetLimit with a canceled context = %v", err)
		}
		_, _, err = d.PutLimit(canceled, "alice", limitOf("L", limiter.RegID))
		if !errors.Is(err, context.Canceled) || errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("PutLimit with a canceled context = %v", err)
		}

		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"GetLimit": func() error { _, err := d.GetLimit(ctxT(t), "L"); return err }(),
			"PutLimit": func() error { _, _, err := d.PutLimit(ctxT(t), "a", limitOf("L", limiter.RegID)); return err }(),
			"Ping":     d.Ping(ctxT(t)),
		} {
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("%s after Close = %v, want ErrUnavailable", name, err)
			}
		}
	})
}

func TestUnavailableWhenConnectionsAreKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "postgres")
	ctx := ctxT(t)
	e.putLimit(t, limitOf("L", limiter.RegID))
	w := startWatch(ctx, t, e.db)

	// Terminate every other session of the database, as a restart of the
	// server would.
	admin := openMigrated(t, e.url, nil)
	if _, err := admin.writer.ExecContext(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.err:
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Watch on a killed connection = %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not notice its connection was killed")
	}
	// The pool may fail the first use of a dead connection and then
	// reconnect; a lost connection is never anything but unavailable.
	for range 3 {
		if _, err := e.db.GetLimit(ctx, "L"); err != nil && !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("GetLimit on a killed connection = %v, want success or ErrUnavailable", err)
		}
	}
}
