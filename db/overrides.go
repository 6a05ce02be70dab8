package db

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

// overrideRow is a row of the overrides table. Burst, count and period are
// NULL when the override is unlimited.
type overrideRow struct {
	ID        string
	Limit     string
	BucketID  string
	Burst     sql.NullInt64
	Count     sql.NullInt64
	Period    sql.NullInt64
	Unlimited bool
	Comment   string
	Enabled   bool
	ExpiresAt sql.NullTime
	CreatedAt time.Time
	UpdatedAt time.Time
	UpdatedBy string
	Version   int64
}

const overrideColumns = `id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, expires_at, created_at, updated_at, updated_by, version`

func (r *overrideRow) dest() []any {
	return []any{&r.ID, &r.Limit, &r.BucketID, &r.Burst, &r.Count, &r.Period, &r.Unlimited, &r.Comment,
		&r.Enabled, &r.ExpiresAt, &r.CreatedAt, &r.UpdatedAt, &r.UpdatedBy, &r.Version}
}

// args are the values of overrideColumns, in order.
func (r *overrideRow) args() []any {
	return []any{r.ID, r.Limit, r.BucketID, r.Burst, r.Count, r.Period, r.Unlimited, r.Comment,
		r.Enabled, r.ExpiresAt, r.CreatedAt, r.UpdatedAt, r.UpdatedBy, r.Version}
}

func (r *overrideRow) override() limiter.Override {
	return limiter.Override{
		ID: r.ID, Limit: r.Limit, BucketID: r.BucketID,
		Params:    limiter.Params{Burst: r.Burst.Int64, Count: r.Count.Int64, Period: time.Duration(r.Period.Int64)},
		Unlimited: r.Unlimited, Comment: r.Comment, Enabled: r.Enabled, ExpiresAt: timeOf(r.ExpiresAt),
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), UpdatedBy: r.UpdatedBy, Version: r.Version,
	}
}

// toOverrideRow converts o for storage: an unlimited override keeps no
// parameters, and times are cut to what the databases store.
func toOverrideRow(o limiter.Override) overrideRow {
	r := overrideRow{
		ID: o.ID, Limit: o.Limit, BucketID: o.BucketID, Unlimited: o.Unlimited, Comment: o.Comment,
		Enabled: o.Enabled, ExpiresAt: nullTime(o.ExpiresAt), CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
		UpdatedBy: o.UpdatedBy, Version: o.Version,
	}
	if !o.Unlimited {
		r.Burst = sql.NullInt64{Int64: o.Burst, Valid: true}
		r.Count = sql.NullInt64{Int64: o.Count, Valid: true}
		r.Period = sql.NullInt64{Int64: int64(o.Period), Valid: true}
	}
	return r
}

// stored returns o as it reads back after being written.
func stored(o limiter.Override) limiter.Override {
	r := toOverrideRow(o)
	return r.override()
}

func scanOverride(rows *sql.Rows) (limiter.Override, error) {
	var r overrideRow
	err := rows.Scan(r.dest()...)
	return r.override(), err
}

// getOverride reads one override; sql.ErrNoRows when there is none.
func getOverride(ctx context.Context, d *DB, q queryer, id string) (limiter.Override, error) {
	var r overrideRow
	err := q.QueryRowContext(ctx, `SELECT `+overrideColumns+` FROM overrides WHERE id = $1`, id).Scan(r.dest()...)
	if err != nil {
		return limiter.Override{}, d.fail(ctx, err)
	}
	return r.override(), nil
}

// CreateOverride stores a new override of o.Limit for o.BucketID, which
// it canonicalises by the limit's id format, and returns it with its ID,
// Version 1, timestamps and UpdatedBy set. The limit is read in the
// transaction that writes the override, under the write lock, so that no
// change of its id format or calendar can come between: an id the format
// refuses, or parameters that do not fit the limit's kind
// (Limit.ParamsProblems), are a *limiter.ValidationError naming the
// fields. An override of the same bucket is limiter.ErrOverrideExists, an
// unknown limit limiter.ErrUnknownLimit. An unlimited override keeps no
// parameters. The comment is the caller's to have checked, once, as the
// API's converter does.
func (d *DB) CreateOverride(ctx context.Context, actor string, o limiter.Override) (limiter.Override, error) {
	err := d.write(ctx, actor, func(w *writeTx) error {
		l, err := getLimit(ctx, d, w.tx, o.Limit)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("override of limit %q: %w", o.Limit, limiter.ErrUnknownLimit)
		}
		if err != nil {
			return err
		}
		if fe := fitOverride(&o, l); len(fe) > 0 {
			return &limiter.ValidationError{Fields: fe}
		}
		o.ID = d.ids.next(w.now)
		o.Version, o.CreatedAt, o.UpdatedAt, o.UpdatedBy = 1, w.now, w.now, actor
		o = stored(o)
		r := toOverrideRow(o)
		err = w.exec(ctx, `INSERT INTO overrides (`+overrideColumns+`) VALUES (`+placeholders(1, 14)+`)`, r.args()...)
		switch violated(err) {
		case overridesLimitBucketKey:
			return fmt.Errorf("override of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrOverrideExists)
		case overridesLimitFkey:
			return fmt.Errorf("override of limit %q: %w", o.Limit, limiter.ErrUnknownLimit)
		}
		if err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityOverride, entityID: o.ID, action: limiter.ActionCreate,
			limitName: o.Limit, bucketID: o.BucketID, after: toOverrideDoc(o)})
	})
	if err != nil {
		return limiter.Override{}, err
	}
	return o, nil
}

// fitOverride canonicalises o's bucket id by limit l and returns the field
// errors of what depends on l: the bucket id, and the parameters, which
// must suit l's kind.
func fitOverride(o *limiter.Override, l limiter.Limit) []limiter.FieldError {
	fe := bucketid.NormalizeOverride(o, l)
	if !o.Unlimited {
		fe = append(fe, l.ParamsProblems(o.Params, true)...)
	}
	return fe
}

// GetOverride returns the override with the id, or an error wrapping
// limiter.ErrOverrideNotFound.
func (d *DB) GetOverride(ctx context.Context, id string) (limiter.Override, error) {
	o, err := getOverride(ctx, d, d.reader, id)
	if errors.Is(err, sql.ErrNoRows) {
		return limiter.Override{}, fmt.Errorf("override %q: %w", id, limiter.ErrOverrideNotFound)
	}
	return o, err
}

// defaultPageSize is the page size of a listing that asks for none.
const defaultPageSize = 50

// ListOverrides returns a page of the overrides f selects, newest first,
// and the token of the next page, "" after the last. Pages are cut by id
// (keyset pagination), so that overrides created while a client pages
// through, which sort before its position, neither repeat nor push older
// ones out of the pages still to come. A token that is not one of ours is
// limiter.ErrPageToken.
func (d *DB) ListOverrides(ctx context.Context, f limiter.OverrideFilter) ([]limiter.Override, string, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.PageToken != "" {
		after, ok := pageAfter(f.PageToken)
		if !ok {
			return nil, "", fmt.Errorf("page token %q: %w", f.PageToken, limiter.ErrPageToken)
		}
		where = append(where, "id < "+arg(after))
	}
	if f.Limit != "" {
		where = append(where, "limit_name = "+arg(f.Limit))
	}
	if len(f.BucketIDs) > 0 {
		in := make([]string, len(f.BucketIDs))
		for i, id := range f.BucketIDs {
			in[i] = arg(id)
		}
		where = append(where, "bucket_id IN ("+strings.Join(in, ", ")+")")
	}
	if f.Enabled != nil {
		where = append(where, "enabled = "+arg(*f.Enabled))
	}
	if f.Query != "" {
		// Lower-casing both sides works on both engines; SQLite's lower()
		// folds ASCII only, so there the match ignores the case of ASCII
		// letters only.
		p := arg("%" + escapeLike(strings.ToLower(f.Query)) + "%")
		where = append(where, `(lower(bucket_id) LIKE `+p+` ESCAPE '\' OR lower(comment) LIKE `+p+` ESCAPE '\')`)
	}
	size := f.PageSize
	if size <= 0 {
		size = defaultPageSize
	}
	query := `SELECT ` + overrideColumns + ` FROM overrides`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	// One row more than the page tells whether another page follows.
	query += ` ORDER BY id DESC LIMIT ` + arg(size+1)
	page, err := collect(ctx, d, d.reader, scanOverride, query, args...)
	if err != nil {
		return nil, "", err
	}
	if len(page) <= size {
		return page, "", nil
	}
	page = page[:size]
	return page, pageToken(page[size-1].ID), nil
}

// escapeLike makes s match itself in a LIKE pattern with ESCAPE '\'.
func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// UpdateOverride changes the override with the id in one transaction: it
// reads the override and its limit, lets change modify a copy of the
// override (a caller's If-Match is checked there, against the version
// read under the lock; the limit tells the defaults of its kind), and
// writes the result with Version+1, UpdatedAt and UpdatedBy=actor. An
// error from change rolls back and is returned unchanged; parameters that
// do not fit the limit (Limit.ParamsProblems) are a
// *limiter.ValidationError naming the fields. change cannot move the
// override to another limit or bucket, nor rewrite its ID or CreatedAt:
// those are restored.
//
// Every write transaction holds the write lock (see lockWrites), which is a
// stronger lock than one on the row: no other change can come between the
// read and the write.
func (d *DB) UpdateOverride(ctx context.Context, actor, id string, change func(*limiter.Override, limiter.Limit) error) (limiter.Override, error) {
	var o limiter.Override
	err := d.write(ctx, actor, func(w *writeTx) error {
		old, err := getOverride(ctx, d, w.tx, id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("override %q: %w", id, limiter.ErrOverrideNotFound)
		}
		if err != nil {
			return err
		}
		// The foreign key keeps the limit while the override exists.
		l, err := getLimit(ctx, d, w.tx, old.Limit)
		if err != nil {
			return err
		}
		o = old
		if err := change(&o, l); err != nil {
			return err
		}
		if !o.Unlimited {
			if fe := l.ParamsProblems(o.Params, true); len(fe) > 0 {
				return &limiter.ValidationError{Fields: fe}
			}
		}
		o.ID, o.Limit, o.BucketID, o.CreatedAt = old.ID, old.Limit, old.BucketID, old.CreatedAt
		o.Version, o.UpdatedAt, o.UpdatedBy = old.Version+1, w.now, actor
		o = stored(o)
		r := toOverrideRow(o)
		err = w.exec(ctx, `
			UPDATE overrides SET burst = $2, count = $3, period = $4, unlimited = $5, comment = $6, enabled = $7,
				expires_at = $8, updated_at = $9, updated_by = $10, version = $11
			WHERE id = $1`,
			r.ID, r.Burst, r.Count, r.Period, r.Unlimited, r.Comment, r.Enabled, r.ExpiresAt, r.UpdatedAt, r.UpdatedBy, r.Version)
		if err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityOverride, entityID: id, action: limiter.ActionUpdate,
			limitName: o.Limit, bucketID: o.BucketID, before: toOverrideDoc(old), after: toOverrideDoc(o)})
	})
	if err != nil {
		return limiter.Override{}, err
	}
	return o, nil
}

// DeleteOverride deletes the override with the id. Its history stays.
func (d *DB) DeleteOverride(ctx context.Context, actor, id string) error {
	return d.write(ctx, actor, func(w *writeTx) error {
		old, err := getOverride(ctx, d, w.tx, id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("override %q: %w", id, limiter.ErrOverrideNotFound)
		}
		if err != nil {
			return err
		}
		if err := w.exec(ctx, `DELETE FROM overrides WHERE id = $1`, id); err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityOverride, entityID: id, action: limiter.ActionDelete,
			limitName: old.Limit, bucketID: old.BucketID, before: toOverrideDoc(old)})
	})
}

// OverrideHistory returns the changes of the override with the id, oldest
// first; they outlive the override. An id with no history at all is not
// found.
func (d *DB) OverrideHistory(ctx context.Context, id string) ([]limiter.HistoryEntry, error) {
	entries, err := collect(ctx, d, d.reader, scanHistory, `
		SELECT at, actor, action, before, after FROM audit
		WHERE entity = 'override' AND entity_id = $1
		ORDER BY seq`, id)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("override %q: %w", id, limiter.ErrOverrideNotFound)
	}
	return entries, nil
}

func scanHistory(rows *sql.Rows) (limiter.HistoryEntry, error) {
	var e limiter.HistoryEntry
	var before, after sql.NullString
	if err := rows.Scan(&e.At, &e.Actor, &e.Action, &before, &after); err != nil {
		return e, err
	}
	e.At = e.At.UTC()
	var err error
	if before.Valid {
		if e.Before, err = decodeOverride(before.String); err != nil {
			return e, err
		}
	}
	if after.Valid {
		e.After, err = decodeOverride(after.String)
	}
	return e, err
}

func decodeOverride(doc string) (*limiter.Override, error) {
	var od overrideDoc
	if err := json.Unmarshal([]byte(doc), &od); err != nil {
		return nil, fmt.Errorf("database: decoding an audit document: %w", err)
	}
	return od.override()
}
