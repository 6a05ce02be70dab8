// Package db persists limits, overrides, their audit history and API tokens
// in Postgres or in an embedded SQLite file.
//
// The SQL of every operation is written once and runs on both engines
// through database/sql; what differs (connecting, translating driver
// errors, serialising writers, telling replicas about changes) lives in
// postgres.go and sqlite.go.
//
// Every write inserts its audit entries in its own transaction. The audit
// table is the history shown to people and, through its sequence numbers,
// the change log that the loader follows: Full returns the highest sequence
// number a snapshot includes, Since returns what changed after one, and
// Watch says when to ask.
package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Options configures a DB.
type Options struct {
	// Now reads the clock; time.Now when nil. Every timestamp written comes
	// from it, in UTC and truncated to microseconds, which both engines store
	// exactly.
	Now func() time.Time
	// Logger receives the migrations applied; slog.Default() when nil.
	Logger *slog.Logger
}

// DB is a database of limits, overrides, audit entries and tokens. It is
// safe for concurrent use.
type DB struct {
	be backend
	// writer runs write transactions and migrations; reader runs reads.
	// They are the same pool on Postgres; SQLite has one connection that
	// writes and a pool of read-only ones.
	writer *sql.DB
	reader *sql.DB
	now    func() time.Time
	log    *slog.Logger
	ids    idSource
	// maxEnum bounds the enums given automatically: limiter.MaxEnum, lower
	// in tests, which cannot give two billion.
	maxEnum int
	closed  atomic.Bool
	// done is closed by Close, which ends every Watch.
	done chan struct{}
}

// backend is what differs between the engines.
type backend interface {
	engine() string
	// lockWrites runs first in every write transaction: afterwards no other
	// write transaction can run until this one ends.
	lockWrites(ctx context.Context, tx *sql.Tx) error
	// announce runs last in a write transaction that wrote audit entries up
	// to seq; what it announces must reach watchers only at commit.
	announce(ctx context.Context, tx *sql.Tx, seq int64) error
	// committed runs after a write transaction committed.
	committed()
	watch(ctx context.Context, changed func()) error
	// translate turns a driver error into a *violation, an error wrapping
	// limiter.ErrUnavailable, or returns it unchanged.
	translate(err error) error
	migrations() (migrationSet, error)
	// batchRows is the number of rows an import writes per statement.
	batchRows() int
	close() error
}

// Open connects to the database at url: "postgres://..." or
// "postgresql://..." for Postgres, "sqlite:PATH" for a SQLite file, created
// when missing. It connects once, so that a wrong URL or an unreachable
// server fails at start rather than at the first request. It does not
// migrate; call Migrate.
func Open(ctx context.Context, url string, opts Options) (*DB, error) {
	d := &DB{now: opts.Now, log: opts.Logger, maxEnum: limiter.MaxEnum, done: make(chan struct{})}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	var err error
	switch {
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		err = openPostgres(ctx, d, url)
	case strings.HasPrefix(url, "sqlite:"):
		err = openSQLite(ctx, d, strings.TrimPrefix(url, "sqlite:"))
	default:
		return nil, errors.New(`database: unsupported URL: want "postgres://...", "postgresql://..." or "sqlite:PATH"`)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Close closes the connections and ends every Watch. Operations after Close
// fail with limiter.ErrUnavailable.
func (d *DB) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	close(d.done)
	return d.be.close()
}

// Engine returns "postgres" or "sqlite".
func (d *DB) Engine() string { return d.be.engine() }

// Ping reports whether the database answers.
func (d *DB) Ping(ctx context.Context) error {
	return d.fail(ctx, d.reader.PingContext(ctx))
}

// clock returns the time every timestamp of one write is taken from.
func (d *DB) clock() time.Time {
	return d.now().UTC().Truncate(time.Microsecond)
}

// fail translates an error from database/sql or a driver at the boundary of
// the package. The caller's own cancellation stays a context error: it is
// neither a conflict nor an unavailable backend.
func (d *DB) fail(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w: %w", cerr, err)
	}
	if d.closed.Load() {
		return errClosed()
	}
	return d.be.translate(err)
}

func errClosed() error {
	return fmt.Errorf("%w: the database is closed", limiter.ErrUnavailable)
}

// unavailable wraps a connection-level failure.
func unavailable(err error) error {
	return fmt.Errorf("%w: database: %w", limiter.ErrUnavailable, err)
}

// violation is a constraint violation reported by the database, named by
// the constraint's name in the Postgres schema on both engines.
type violation struct {
	constraint string
	err        error
}

func (v *violation) Error() string { return v.err.Error() }
func (v *violation) Unwrap() error { return v.err }

// The constraints whose violations callers map to their own errors.
const (
	limitsPkey              = "limits_pkey"
	limitsEnumKey           = "limits_enum_key"
	overridesLimitBucketKey = "overrides_limit_bucket_key"
	overridesLimitFkey      = "overrides_limit_fkey"
	tokensHashKey           = "tokens_hash_key"
)

// violated returns the constraint err violates, or "".
func violated(err error) string {
	var v *violation
	if errors.As(err, &v) {
		return v.constraint
	}
	return ""
}

// writeTx is one write transaction: every change and its audit entries.
type writeTx struct {
	d     *DB
	tx    *sql.Tx
	now   time.Time
	actor string
	// seq is the highest audit sequence number written; 0 when nothing was.
	seq int64
	// dryRun rolls the transaction back when fn succeeds.
	dryRun bool
	// stmts are the statements prepared in the transaction, by query.
	stmts map[string]*sql.Stmt
}

// write runs fn in a write transaction and commits it when fn succeeds and
// wrote an audit entry. Errors from fn are returned unchanged, so fn
// translates its own; they roll everything back.
func (d *DB) write(ctx context.Context, actor string, fn func(w *writeTx) error) error {
	tx, err := d.writer.BeginTx(ctx, nil)
	if err != nil {
		return d.fail(ctx, err)
	}
	// After a commit Rollback does nothing.
	defer func() { _ = tx.Rollback() }()
	if err := d.be.lockWrites(ctx, tx); err != nil {
		return d.fail(ctx, err)
	}
	w := &writeTx{d: d, tx: tx, now: d.clock(), actor: actor}
	if err := fn(w); err != nil {
		return err
	}
	if w.seq == 0 || w.dryRun {
		return nil
	}
	if err := d.be.announce(ctx, tx, w.seq); err != nil {
		return d.fail(ctx, err)
	}
	if err := tx.Commit(); err != nil {
		return d.fail(ctx, err)
	}
	d.be.committed()
	return nil
}

func (w *writeTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := w.tx.ExecContext(ctx, query, args...)
	return w.d.fail(ctx, err)
}

// execCached runs a statement that the transaction runs many times,
// preparing it once; the statements end with the transaction.
func (w *writeTx) execCached(ctx context.Context, query string, args ...any) error {
	stmt, ok := w.stmts[query]
	if !ok {
		var err error
		if stmt, err = w.tx.PrepareContext(ctx, query); err != nil {
			return w.d.fail(ctx, err)
		}
		if w.stmts == nil {
			w.stmts = map[string]*sql.Stmt{}
		}
		w.stmts[query] = stmt
	}
	_, err := stmt.ExecContext(ctx, args...)
	return w.d.fail(ctx, err)
}

// queryRow runs a query that returns one row and scans it into dest; the
// error is translated, sql.ErrNoRows included as it is.
func (w *writeTx) queryRow(ctx context.Context, dest []any, query string, args ...any) error {
	return w.d.fail(ctx, w.tx.QueryRowContext(ctx, query, args...).Scan(dest...))
}

// queryer is what reads need of a *sql.DB or *sql.Tx, so that one function
// serves both a read and the read inside a write.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readTx runs fn in a read-only transaction that sees one snapshot of the
// database throughout: REPEATABLE READ on Postgres, a deferred transaction
// in WAL mode on SQLite.
func (d *DB) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := d.reader.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return d.fail(ctx, err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return d.fail(ctx, tx.Commit())
}

// collect runs a query and appends what scan makes of each row.
func collect[T any](ctx context.Context, d *DB, q queryer, scan func(*sql.Rows) (T, error), query string, args ...any) ([]T, error) {
	out := []T{}
	err := each(ctx, d, q, func(rows *sql.Rows) error {
		v, err := scan(rows)
		if err != nil {
			return d.fail(ctx, err)
		}
		out = append(out, v)
		return nil
	}, query, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// each runs a query and calls fn on each row, stopping at its first error,
// which is returned unchanged.
func each(ctx context.Context, d *DB, q queryer, fn func(*sql.Rows) error, query string, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return d.fail(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return d.fail(ctx, rows.Err())
}

// placeholders returns "$from, $from+1, ..." for n parameters.
func placeholders(from, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "$%d", from+i)
	}
	return b.String()
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

func nullTime(t time.Time) sql.NullTime {
	if t.IsZero() {
		return sql.NullTime{}
	}
	return sql.NullTime{Time: t.UTC().Truncate(time.Microsecond), Valid: true}
}

func timeOf(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}
