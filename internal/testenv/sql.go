package testenv

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	_ "modernc.org/sqlite"             // the "sqlite" driver
)

// Corruption is a stored row changed by Corrupt: its statement and
// arguments, and the audit entry's entity ("limit", "override", "rule"),
// id, and for an override its limit and bucket id.
type Corruption struct {
	SQL           string
	Args          []any
	Entity, ID    string
	Limit, Bucket string
}

// Corrupt changes stored rows of the database at url (postgres://... or
// sqlite:PATH, as the service takes it) with SQL, around every check of
// the service, as a newer version or a hand would, and records each
// change in the audit log, so that running replicas read it as a change.
// The check of limits' kinds is dropped first (on SQLite: checks are
// ignored), as a newer version's migration would.
func Corrupt(t testing.TB, url string, rows ...Corruption) {
	t.Helper()
	ctx := context.Background()
	driver, dsn, schema := "pgx", url, "ALTER TABLE limits DROP CONSTRAINT IF EXISTS limits_kind_check"
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		driver, dsn, schema = "sqlite", path, "PRAGMA ignore_check_constraints = ON"
	}
	raw, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	conn, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, schema); err != nil {
		t.Fatal(err)
	}
	null := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	for _, r := range rows {
		if _, err := conn.ExecContext(ctx, r.SQL, r.Args...); err != nil {
			t.Fatalf("%s: %v", r.SQL, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, bucket_id)
			VALUES ($1, 'newer', $2, $3, 'update', $4, $5)`, time.Now().UTC(), r.Entity, r.ID, null(r.Limit), null(r.Bucket)); err != nil {
			t.Fatal(err)
		}
	}
}
