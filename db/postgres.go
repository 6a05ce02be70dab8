package db

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/ratelimitd/ratelimitd/migrations"
)

// writeLockKey is the key of the transaction-level advisory lock that every
// write transaction takes first ("rlimitd" in ASCII). goose's migration
// lock uses another key.
const writeLockKey int64 = 0x726c696d697464

// Server-side bounds on what a stalled client can hold. A write
// transaction's statements follow each other without pause, so a session
// idle in one for idleInTransactionTimeout has lost its client; Postgres
// then ends it and frees the write lock. A writer waits lockTimeout at most
// for that lock.
const (
	idleInTransactionTimeout = "10s"
	lockTimeout              = "5s"
)

// notifyChannel is the LISTEN/NOTIFY channel of committed changes; the
// payload is the highest audit sequence number of the transaction.
const notifyChannel = "ratelimitd_changes"

// watchHealthInterval is how long Watch waits for a notification before it
// checks that its connection still answers: a connection lost without a
// word from the network would otherwise wait forever.
const watchHealthInterval = 30 * time.Second

// postgres is the Postgres backend: a pgx pool, shared with database/sql
// for the SQL both engines run.
type postgres struct {
	pool  *pgxpool.Pool
	sqlDB *sql.DB
	// healthInterval is watchHealthInterval; tests shorten it.
	healthInterval time.Duration
}

func openPostgres(ctx context.Context, d *DB, url string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgconn masks the password in its message.
		return fmt.Errorf("database: parsing the Postgres URL: %w", err)
	}
	// Server-side bounds that the URL may override; see lockWrites.
	params := cfg.ConnConfig.RuntimeParams
	if _, ok := params["idle_in_transaction_session_timeout"]; !ok {
		params["idle_in_transaction_session_timeout"] = idleInTransactionTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	p := &postgres{pool: pool, sqlDB: sqlDB, healthInterval: watchHealthInterval}
	d.be, d.writer, d.reader = p, sqlDB, sqlDB
	if err := pool.Ping(ctx); err != nil {
		_ = p.close()
		return d.fail(ctx, err)
	}
	return nil
}

func (p *postgres) engine() string { return "postgres" }

// lockWrites serialises write transactions on a transaction-level advisory
// lock, released at commit or rollback. The reason is the change log:
// audit sequence numbers are drawn from a sequence when each entry is
// inserted, and without the lock a transaction could draw seq 10, commit
// after another drew and committed seq 11, and a replica that had already
// read up to 11 would never see 10. With the lock, entries commit in
// sequence order, so "everything up to N" is a sound watermark. Write
// transactions run at READ COMMITTED, so each statement after the lock
// sees every write committed before it was granted. The lock also
// makes the read-check-write steps of PutLimit and UpdateOverride atomic.
//
// The cost is one more round trip per write transaction, and writes that
// no longer overlap or share a WAL flush (BenchmarkWriteLock measures it;
// docs/performance.md has the figures). Writes are administrative and rare
// next to decisions, which never touch SQL, so a sound change log is worth
// that.
//
// A writer whose connection stalls keeps the lock until Postgres ends its
// session: idle_in_transaction_session_timeout (set in openPostgres) ends
// it, and lock_timeout makes the writers queued behind it fail, as
// unavailable, instead of waiting without end.
func (p *postgres) lockWrites(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%s'; SELECT pg_advisory_xact_lock(%d)`, lockTimeout, writeLockKey))
	return err
}

// announce queues a notification that Postgres delivers at commit, to
// every session listening, in every process.
func (p *postgres) announce(ctx context.Context, tx *sql.Tx, seq int64) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, strconv.FormatInt(seq, 10))
	return err
}

func (p *postgres) committed() {}

func (p *postgres) watch(ctx context.Context, changed func()) error {
	conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
	if err != nil {
		return p.watchFailed(ctx, err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return p.watchFailed(ctx, err)
	}
	changed()
	for {
		waitCtx, cancel := context.WithTimeout(ctx, p.healthInterval)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			changed()
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// A timeout leaves the connection usable; see that it answers.
			if err := conn.Ping(ctx); err != nil {
				return p.watchFailed(ctx, err)
			}
		default:
			return p.watchFailed(ctx, err)
		}
	}
}

func (p *postgres) watchFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return unavailable(fmt.Errorf("watching for changes: %w", err))
}

func (p *postgres) translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "23505", code == "23503", code == "23514": // unique, foreign key, check
			return &violation{constraint: pgErr.ConstraintName, err: err}
		case strings.HasPrefix(code, "08"), // connection exception
			code == "57P01", code == "57P02", code == "57P03", // shutting down, starting up
			code == "53300",                  // too many connections
			code == "55P03",                  // lock_timeout: a stalled writer holds the write lock
			code == "25P03", code == "57014": // our session or statement timed out
			return unavailable(err)
		}
		return err
	}
	if pgConnectionFailed(err) {
		return unavailable(err)
	}
	return err
}

// pgConnectionFailed reports whether err says that no connection could be
// made or that the connection was lost, as opposed to an error the server
// reported about a statement.
func pgConnectionFailed(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) || pgconn.Timeout(err)
}

func (p *postgres) migrations() (migrationSet, error) {
	// goose polls for its session lock; every second rather than its
	// default five, for at most five minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return migrationSet{}, err
	}
	return migrationSet{
		dialect: goose.DialectPostgres,
		files:   migrations.Postgres(),
		opts:    []goose.ProviderOption{goose.WithSessionLocker(locker)},
	}, nil
}

// batchRows is large because every statement costs a round trip; 500 rows
// of an import take about 5,000 parameters, far below the 65,535 limit, and
// larger batches gain nothing measurable.
func (p *postgres) batchRows() int { return 500 }

func (p *postgres) close() error {
	err := p.sqlDB.Close()
	p.pool.Close()
	return err
}
