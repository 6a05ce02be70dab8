package db

import (
	"context"
	"database/sql"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Full reads every limit, then every enabled override, in one snapshot of
// the database, and returns the highest audit sequence number that
// snapshot includes (0 for an empty database): the version Since continues
// from. Overrides are streamed to onOverride row by row, so that a million
// of them never sit in memory twice. An error from a callback stops the
// read and is returned unchanged.
func (d *DB) Full(ctx context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error) {
	var version int64
	err := d.readTx(ctx, func(tx *sql.Tx) error {
		var err error
		if version, err = lastSeq(ctx, d, tx); err != nil {
			return err
		}
		err = each(ctx, d, tx, func(rows *sql.Rows) error {
			l, err := scanLimit(rows)
			if err != nil {
				return d.fail(ctx, err)
			}
			return onLimit(l)
		}, `SELECT `+limitColumns+` FROM limits ORDER BY name`)
		if err != nil {
			return err
		}
		var r overrideRow
		dest := r.dest()
		return each(ctx, d, tx, func(rows *sql.Rows) error {
			if err := rows.Scan(dest...); err != nil {
				return d.fail(ctx, err)
			}
			return onOverride(r.override())
		}, `SELECT `+overrideColumns+` FROM overrides WHERE enabled`)
	})
	if err != nil {
		return 0, err
	}
	return version, nil
}

// lastSeqQuery reads the highest audit sequence number, 0 when there is
// none.
const lastSeqQuery = `SELECT COALESCE(MAX(seq), 0) FROM audit`

// lastSeq returns the highest audit sequence number, 0 when there is none.
func lastSeq(ctx context.Context, d *DB, q queryer) (int64, error) {
	var seq int64
	err := q.QueryRowContext(ctx, lastSeqQuery).Scan(&seq)
	return seq, d.fail(ctx, err)
}

// Since returns, from one snapshot of the database, what changed after
// version: the current state of every limit and override written since
// (an override now disabled included as it is), the limits and overrides
// deleted since, each entity once, and the version the changes bring a
// snapshot to. An entity is reported by its state now, not by its history:
// an override deleted and created again for the same bucket comes out as
// the deleted one (its id) and the current one, which limiter.Builder.Apply
// handles by deleting first.
//
// Token changes are reported by Changes.Tokens alone. A version ahead of the database's (one restored from a backup) gives empty
// changes and the lower version; the caller should then load in full.
func (d *DB) Since(ctx context.Context, version int64) (limiter.Changes, error) {
	var c limiter.Changes
	err := d.readTx(ctx, func(tx *sql.Tx) error {
		var err error
		if c.Version, err = lastSeq(ctx, d, tx); err != nil || c.Version <= version {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM audit WHERE seq > $1 AND entity = '`+entityToken+`')`, version).Scan(&c.Tokens); err != nil {
			return d.fail(ctx, err)
		}
		c.Limits, err = collect(ctx, d, tx, scanLimit, `
			SELECT `+limitColumns+` FROM limits
			WHERE name IN (SELECT entity_id FROM audit WHERE seq > $1 AND entity = 'limit')
			ORDER BY name`, version)
		if err != nil {
			return err
		}
		c.DeletedLimits, err = collect(ctx, d, tx, func(rows *sql.Rows) (string, error) {
			var name string
			err := rows.Scan(&name)
			return name, err
		}, `
			SELECT DISTINCT a.entity_id FROM audit a
			WHERE a.seq > $1 AND a.entity = 'limit'
				AND NOT EXISTS (SELECT 1 FROM limits l WHERE l.name = a.entity_id)
			ORDER BY a.entity_id`, version)
		if err != nil {
			return err
		}
		c.Overrides, err = collect(ctx, d, tx, scanOverride, `
			SELECT `+overrideColumns+` FROM overrides
			WHERE id IN (SELECT entity_id FROM audit WHERE seq > $1 AND entity = 'override')
			ORDER BY id`, version)
		if err != nil {
			return err
		}
		c.DeletedOverrides, err = collect(ctx, d, tx, func(rows *sql.Rows) (limiter.Override, error) {
			var o limiter.Override
			err := rows.Scan(&o.ID, &o.Limit, &o.BucketID)
			return o, err
		}, `
			SELECT DISTINCT a.entity_id, a.limit_name, a.bucket_id FROM audit a
			WHERE a.seq > $1 AND a.entity = 'override'
				AND NOT EXISTS (SELECT 1 FROM overrides o WHERE o.id = a.entity_id)
			ORDER BY a.entity_id`, version)
		if err != nil {
			return err
		}
		return ruleChanges(ctx, d, tx, version, &c)
	})
	if err != nil {
		return limiter.Changes{}, err
	}
	return c, nil
}

// Watch calls changed whenever a change may have been committed, until ctx
// ends (it then returns ctx.Err()) or the notification channel fails (it
// then returns an error wrapping limiter.ErrUnavailable, and the caller
// watches again after a pause). changed is also called once as soon as the
// watch is in place, so that a change committed while nobody watched is not
// missed. It is called from Watch's goroutine, one call at a time;
// notifications that arrive meanwhile wait, and on SQLite coalesce.
//
// On Postgres Watch holds a connection of its own, outside the pool, that
// LISTENs for the notification every write transaction sends at commit,
// from any process. On SQLite, changed follows every write committed
// through this DB, and is called every second besides, for the writes of
// other processes on the same file (the command line's).
func (d *DB) Watch(ctx context.Context, changed func()) error {
	if d.closed.Load() {
		return errClosed()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Close ends the watch.
		select {
		case <-d.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	err := d.be.watch(wctx, changed)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case d.closed.Load():
		return errClosed()
	}
	return err
}
