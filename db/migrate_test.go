package db

import (
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/migrations"
)

func TestMigrate(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		// The latest migration is the last file's number.
		files, err := fs.Glob(migrations.SQLite(), "*.sql")
		if err != nil || len(files) == 0 {
			t.Fatal(files, err)
		}
		want, err := strconv.ParseInt(strings.SplitN(files[len(files)-1], "_", 2)[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		cur, latest, err := e.db.MigrationVersion(ctx)
		if err != nil || cur != latest || latest != want {
			t.Fatalf("MigrationVersion = %d, %d, %v; want %d, %d", cur, latest, err, want, want)
		}
		e.putLimit(t, limitOf("L", limiter.RegID))
		if err := e.db.Migrate(ctx); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		if _, err := e.db.GetLimit(ctx, "L"); err != nil {
			t.Errorf("after a second Migrate: %v", err)
		}
		if e.db.Engine() != e.engine {
			t.Errorf("Engine = %q, want %q", e.db.Engine(), e.engine)
		}
		if err := e.db.Ping(ctx); err != nil {
			t.Errorf("Ping: %v", err)
		}
	})
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	var dbs []*DB
	for range 3 {
		d, err := Open(ctxT(t), url, Options{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		dbs = append(dbs, d)
	}
	errs := make(chan error, len(dbs))
	for _, d := range dbs {
		go func() { errs <- d.Migrate(ctxT(t)) }()
	}
	for range dbs {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	if cur, latest, err := dbs[0].MigrationVersion(ctxT(t)); err != nil || cur != latest {
		t.Errorf("MigrationVersion = %d, %d, %v", cur, latest, err)
	}
}

// TestMigrateRetiresEnums upgrades a database written before enums were
// recorded: the enums of its limits and of the limits it deleted are
// given, and its limits keep their bucket keys (generation 1).
func TestMigrateRetiresEnums(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			ctx := ctxT(t)
			url := databaseURL(t, engine)
			d, err := Open(ctx, url, Options{Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			p, err := d.provider()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, 4); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{
				`INSERT INTO limits (name, enum, id_format, burst, count, period, created_at, updated_at)
					VALUES ('Kept', 100, 'string', 1, 1, 1000, '2030-01-01 00:00:00', '2030-01-01 00:00:00')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Gone', 'create', 'Gone', '{"name":"Gone","enum":101}')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Kept', 'create', 'Kept', '{"name":"Kept","enum":100}')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Huge', 'create', 'Huge', '{"name":"Huge","enum":2147483648}')`,
			} {
				if _, err := d.writer.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if l, err := d.GetLimit(ctx, "Kept"); err != nil || l.Enum != 100 || l.Generation != 1 {
				t.Errorf("Kept = %+v, %v; want enum 100, generation 1", l, err)
			}
			l, _, err := d.PutLimit(ctx, "alice", limitOf("New", limiter.String))
			if err != nil || l.Enum != 102 {
				t.Errorf("New = %+v, %v; want enum 102, after 100 (Kept) and 101 (deleted)", l, err)
			}
		})
	}
}

// TestMigrateKinds upgrades a database written before limits had kinds
// (00010): its limits become rate limits with every row, override and
// rule kept, and the constraints, foreign keys and indexes of the
// rebuilt SQLite tables hold; the new checks refuse what no kind allows.
// Going down again drops the limits the older schema cannot hold.
func TestMigrateKinds(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			ctx := ctxT(t)
			d, err := Open(ctx, databaseURL(t, engine), Options{Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			p, err := d.provider()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, 9); err != nil {
				t.Fatal(err)
			}
			exec := func(q string) error {
				_, err := d.writer.ExecContext(ctx, q)
				return err
			}
			for _, q := range []string{
				`INSERT INTO enums (enum, name, generation) VALUES (100, 'Kept', 2)`,
				`INSERT INTO limits (name, enum, generation, id_format, burst, count, period, description, unit, shadow, created_at, updated_at)
					VALUES ('Kept', 100, 2, 'string', 4, 2, 1000000000, 'kept', 'bytes', TRUE, '2030-01-01 00:00:00', '2030-01-01 00:00:00')`,
				`INSERT INTO overrides (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, created_at, updated_at, updated_by, version)
					VALUES ('o1', 'Kept', 'a', 8, 4, 2000000000, FALSE, 'c', TRUE, '2030-01-01 00:00:00', '2030-01-01 00:00:00', 'x', 3)`,
				`INSERT INTO rules (id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by)
					VALUES ('r1', 'd', '[{"key":"k"}]', 'h', 'Kept', '["X"]', TRUE, '2030-01-01 00:00:00', '2030-01-01 00:00:00', 'x')`,
			} {
				if err := exec(q); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}

			l, err := d.GetLimit(ctx, "Kept")
			want := limiter.Limit{Name: "Kept", Enum: 100, Generation: 2, IDFormat: limiter.String, Kind: limiter.KindRate,
				Params: limiter.Params{Burst: 4, Count: 2, Period: time.Second}, Description: "kept", Unit: "bytes", Shadow: true,
				CreatedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), UpdatedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
			if err != nil || l != want {
				t.Errorf("Kept = %+v, %v\nwant %+v", l, err, want)
			}
			o, err := d.GetOverride(ctx, "o1")
			if err != nil || o.Params != (limiter.Params{Burst: 8, Count: 4, Period: 2 * time.Second}) || o.Version != 3 || o.Comment != "c" {
				t.Errorf("o1 = %+v, %v", o, err)
			}
			r, err := d.GetRule(ctx, "r1")
			if err != nil || r.Limit != "Kept" || !r.QuotaMode || len(r.Replaces) != 1 {
				t.Errorf("r1 = %+v, %v", r, err)
			}

			// The foreign keys and the uniqueness of the rebuilt tables.
			wantError(t, d.DeleteLimit(ctx, "alice", "Kept"), limiter.ErrHasRules)
			if err := d.DeleteRule(ctx, "alice", "r1"); err != nil {
				t.Fatal(err)
			}
			wantError(t, d.DeleteLimit(ctx, "alice", "Kept"), limiter.ErrHasOverrides)
			_, err = d.CreateOverride(ctx, "alice", limiter.Override{Limit: "Kept", BucketID: "a", Unlimited: true, Enabled: true})
			wantError(t, err, limiter.ErrOverrideExists)
			_, err = d.CreateOverride(ctx, "alice", limiter.Override{Limit: "Gone", BucketID: "a", Unlimited: true, Enabled: true})
			wantError(t, err, limiter.ErrUnknownLimit)

			// The new checks: what no kind allows is refused by the
			// database itself, and what the kinds need is accepted.
			insert := func(name, kind, calendar, zone string, burst, count, period int64) error {
				_, err := d.writer.ExecContext(ctx, `
					INSERT INTO limits (name, enum, id_format, kind, calendar, time_zone, burst, count, period, created_at, updated_at)
					VALUES ($1, (SELECT COALESCE(MAX(enum), 0) + 1 FROM limits), 'string', $2, $3, $4, $5, $6, $7, $8, $8)`,
					name, kind, calendar, zone, burst, count, period, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				return err
			}
			for _, bad := range []struct {
				name, kind, calendar, zone string
				burst, count, period       int64
			}{
				{"BadKind", "leaky", "", "", 1, 1, 1},
				{"BadCalendar", "rate", "fortnight", "UTC", 1, 1, 0},
				{"ZoneAlone", "rate", "", "UTC", 1, 1, 1},
				{"QuotaNoZone", "rate", "day", "", 1, 1, 0},
				{"ConcurrentQuota", "concurrency", "day", "UTC", 1, 1, 0},
				{"QuotaPeriod", "rate", "day", "UTC", 1, 1, 1},
				{"QuotaBurst", "rate", "day", "UTC", 2, 1, 0},
				{"LeaseCount", "concurrency", "", "", 2, 1, 1},
				{"RateNoPeriod", "rate", "", "", 1, 1, 0},
			} {
				if err := insert(bad.name, bad.kind, bad.calendar, bad.zone, bad.burst, bad.count, bad.period); violated(d.fail(ctx, err)) == "" {
					t.Errorf("%s: %v, want a constraint violation", bad.name, err)
				}
			}
			if err := insert("Quota", "rate", "day", "Europe/Paris", 5, 5, 0); err != nil {
				t.Fatalf("a quota: %v", err)
			}
			if err := insert("Leases", "concurrency", "", "", 5, 5, int64(time.Minute)); err != nil {
				t.Fatalf("a concurrency limit: %v", err)
			}
			if err := exec(`INSERT INTO overrides (id, limit_name, bucket_id, burst, count, period, created_at, updated_at, updated_by)
				VALUES ('o2', 'Quota', 'b', 0, 0, 0, '2030-01-01 00:00:00', '2030-01-01 00:00:00', 'x')`); err != nil {
				t.Fatalf("a quota's blocking override: %v", err)
			}
			var indexes int
			q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name IN ('overrides_limit_id_idx', 'rules_limit_idx')`
			if engine == "postgres" {
				q = `SELECT COUNT(*) FROM pg_indexes WHERE indexname IN ('overrides_limit_id_idx', 'rules_limit_idx')`
			}
			if err := d.reader.QueryRowContext(ctx, q).Scan(&indexes); err != nil || indexes != 2 {
				t.Errorf("%d of the 2 indexes, %v", indexes, err)
			}

			if _, err := p.DownTo(ctx, 9); err != nil {
				t.Fatal(err)
			}
			var names []string
			rows, err := d.reader.QueryContext(ctx, `SELECT name FROM limits ORDER BY name`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var n string
				if err := rows.Scan(&n); err != nil {
					t.Fatal(err)
				}
				names = append(names, n)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(names, []string{"Kept"}) {
				t.Errorf("after going down, limits %v; want [Kept]", names)
			}
			if err := d.Migrate(ctx); err != nil {
				t.Fatalf("up again: %v", err)
			}
		})
	}
}
