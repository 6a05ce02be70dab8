package testenv

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// defaultPostgresURL is the admin URL used when RATELIMIT_TEST_POSTGRES_URL
// is not set: a local server with trust authentication.
const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Postgres creates a fresh, empty database for the test through the admin
// URL in RATELIMIT_TEST_POSTGRES_URL, drops it when the test ends, and
// returns its URL. A test never sees another test's tables, so tests can
// run in parallel and a failed run leaves nothing behind that the next one
// trips on. Without a server it calls Unavailable: a skip on a developer's
// machine, a failure in CI.
func Postgres(t testing.TB) string {
	t.Helper()
	admin := Getenv("RATELIMIT_TEST_POSTGRES_URL", defaultPostgresURL)
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("RATELIMIT_TEST_POSTGRES_URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		Unavailable(t, "postgres", err)
	}
	defer conn.Close(ctx)

	name := RandomName("rltest_")
	// The name is ours (prefix and hex digits), so quoting it is enough.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
