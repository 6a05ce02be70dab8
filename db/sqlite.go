package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/pressly/goose/v3"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/ratelimitd/ratelimitd/migrations"
)

// sqliteBackend is the SQLite backend: one file, one process.
//
// Writes go through a pool of exactly one connection whose transactions
// begin IMMEDIATE, taking SQLite's write lock at once: writers queue in Go
// rather than fail with SQLITE_BUSY, and the read-check-write steps of
// PutLimit and UpdateOverride cannot interleave. Reads go through a pool of
// read-only connections which, in WAL mode, run beside the writer.
type sqliteBackend struct {
	writer *sql.DB
	reader *sql.DB

	mu sync.Mutex
	// watchers are the channels of running Watch calls; a pending signal
	// in one (capacity 1) stands for any number of commits.
	watchers map[chan struct{}]struct{}
}

// sqliteBusyTimeoutMS is how long a statement waits for a lock another
// process holds (the CLI importing while the server runs) before failing.
const sqliteBusyTimeoutMS = "5000"

func openSQLite(ctx context.Context, d *DB, path string) error {
	switch {
	case path == "":
		return errors.New(`database: "sqlite:" needs a file path, as in "sqlite:ratelimitd.db"`)
	case strings.ContainsRune(path, '?'):
		return errors.New(`database: a SQLite file path cannot contain "?"`)
	case strings.ContainsRune(path, 0):
		// SQLite would end the path there and open another file.
		return errors.New("database: a SQLite file path cannot contain NUL")
	case strings.Contains(path, ":memory:"):
		// Each connection would have a database of its own.
		return errors.New("database: an in-memory SQLite database is not supported; give a file path")
	}
	common := path + "?_busy_timeout=" + sqliteBusyTimeoutMS +
		"&_foreign_keys=1&_journal_mode=WAL&_time_format=sqlite"
	writer, err := sql.Open("sqlite", common+"&_txlock=immediate")
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	reader, err := sql.Open("sqlite", common+"&_query_only=1")
	if err != nil {
		_ = writer.Close()
		return fmt.Errorf("database: %w", err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	reader.SetMaxOpenConns(n)
	reader.SetMaxIdleConns(n)
	s := &sqliteBackend{writer: writer, reader: reader, watchers: map[chan struct{}]struct{}{}}
	d.be, d.writer, d.reader = s, writer, reader
	// The writer connects first: it creates the file and switches it to
	// WAL, which a read-only connection could not.
	for _, db := range []*sql.DB{writer, reader} {
		if err := db.PingContext(ctx); err != nil {
			_ = s.close()
			return d.fail(ctx, err)
		}
	}
	return nil
}

func (s *sqliteBackend) engine() string { return "sqlite" }

// lockWrites has nothing to do: BEGIN IMMEDIATE took the write lock, and
// SQLite commits transactions in the order they took it.
func (s *sqliteBackend) lockWrites(context.Context, *sql.Tx) error { return nil }

func (s *sqliteBackend) announce(context.Context, *sql.Tx, int64) error { return nil }

// committed wakes every Watch without ever blocking the writer.
func (s *sqliteBackend) committed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (s *sqliteBackend) watch(ctx context.Context, changed func()) error {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.watchers[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, ch)
		s.mu.Unlock()
	}()
	last, err := s.lastSeq(ctx)
	if err != nil {
		return err
	}
	changed()
	poll := time.NewTicker(sqlitePoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-poll.C:
		}
		seq, err := s.lastSeq(ctx)
		if err != nil {
			return err
		}
		if seq != last {
			last = seq
			changed()
		}
	}
}

// lastSeq returns the highest sequence number of the change log.
func (s *sqliteBackend) lastSeq(ctx context.Context) (int64, error) {
	var seq int64
	if err := s.reader.QueryRowContext(ctx, lastSeqQuery).Scan(&seq); err != nil {
		return 0, unavailable(err)
	}
	return seq, nil
}

// sqlitePoll is how often a watch on SQLite reads the change log's last
// sequence number, besides after this process's own commits: other
// processes on the same file (ratelimitd import, token) commit without
// telling this one. A read costs one lookup in the log's primary key.
const sqlitePoll = time.Second

func (s *sqliteBackend) translate(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT:
		return &violation{constraint: sqliteConstraint(se.Error()), err: err}
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL:
		return unavailable(err)
	}
	return err
}

// sqliteConstraint names the constraint a SQLite error message reports, as
// the Postgres schema names it. SQLite names CHECK constraints, but reports
// a unique violation by its columns and a foreign key violation by nothing
// at all; the schema has one foreign key.
func sqliteConstraint(msg string) string {
	if strings.Contains(msg, "FOREIGN KEY constraint failed") {
		return overridesLimitFkey
	}
	const marker = "constraint failed: "
	i := strings.LastIndex(msg, marker)
	if i < 0 {
		return ""
	}
	detail := msg[i+len(marker):]
	if j := strings.LastIndex(detail, " ("); j >= 0 {
		detail = detail[:j] // the result code
	}
	switch detail {
	case "limits.name":
		return limitsPkey
	case "limits.enum":
		return limitsEnumKey
	case "overrides.limit_name, overrides.bucket_id":
		return overridesLimitBucketKey
	case "tokens.hash":
		return tokensHashKey
	case "tokens.name":
		return tokensLiveNameKey
	}
	return detail
}

func (s *sqliteBackend) migrations() (migrationSet, error) {
	return migrationSet{dialect: goose.DialectSQLite3, files: migrations.SQLite()}, nil
}

// batchRows is small because SQLite has no round trips to save, and binding
// a statement's parameters costs time quadratic in their number (each is
// looked up by its name, "$n"): 20 rows per statement measured fastest,
// 500 three times slower.
func (s *sqliteBackend) batchRows() int { return 20 }

func (s *sqliteBackend) close() error {
	return errors.Join(s.reader.Close(), s.writer.Close())
}
