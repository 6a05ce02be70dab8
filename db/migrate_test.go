package db

import (
	"io/fs"
	"strconv"
	"strings"
	"testing"

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
