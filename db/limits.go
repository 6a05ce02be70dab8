package db

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// limitRow is a row of the limits table.
type limitRow struct {
	Name        string
	Enum        int
	IDFormat    string
	Burst       int64
	Count       int64
	Period      int64
	Description string
	Shadow      bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

const limitColumns = `name, enum, id_format, burst, count, period, description, shadow, created_at, updated_at`

func (r *limitRow) dest() []any {
	return []any{&r.Name, &r.Enum, &r.IDFormat, &r.Burst, &r.Count, &r.Period, &r.Description, &r.Shadow, &r.CreatedAt, &r.UpdatedAt}
}

func (r *limitRow) limit() limiter.Limit {
	return limiter.Limit{
		Name: r.Name, Enum: r.Enum, IDFormat: limiter.IDFormat(r.IDFormat),
		Params:      limiter.Params{Burst: r.Burst, Count: r.Count, Period: time.Duration(r.Period)},
		Description: r.Description, Shadow: r.Shadow, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
}

func scanLimit(rows *sql.Rows) (limiter.Limit, error) {
	var r limitRow
	err := rows.Scan(r.dest()...)
	return r.limit(), err
}

// getLimit reads one limit; sql.ErrNoRows when there is none.
func getLimit(ctx context.Context, d *DB, q queryer, name string) (limiter.Limit, error) {
	var r limitRow
	err := q.QueryRowContext(ctx, `SELECT `+limitColumns+` FROM limits WHERE name = $1`, name).Scan(r.dest()...)
	if err != nil {
		return limiter.Limit{}, d.fail(ctx, err)
	}
	return r.limit(), nil
}

// GetLimit returns the limit called name, or an error wrapping
// limiter.ErrNotFound.
func (d *DB) GetLimit(ctx context.Context, name string) (limiter.Limit, error) {
	l, err := getLimit(ctx, d, d.reader, name)
	if errors.Is(err, sql.ErrNoRows) {
		return limiter.Limit{}, notFoundf("limit %q not found", name)
	}
	return l, err
}

// ListLimits returns every limit, sorted by name in byte order.
func (d *DB) ListLimits(ctx context.Context) ([]limiter.Limit, error) {
	return collect(ctx, d, d.reader, scanLimit, `SELECT `+limitColumns+` FROM limits ORDER BY name`)
}

// OverrideCounts returns the number of overrides of each limit that has any.
func (d *DB) OverrideCounts(ctx context.Context) (map[string]int, error) {
	counts := map[string]int{}
	err := each(ctx, d, d.reader, func(rows *sql.Rows) error {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			return d.fail(ctx, err)
		}
		counts[name] = n
		return nil
	}, `SELECT limit_name, COUNT(*) FROM overrides GROUP BY limit_name`)
	if err != nil {
		return nil, err
	}
	return counts, nil
}

// PutLimit creates the limit l.Name (reporting true) or updates it
// (reporting false), and returns it as stored. The caller has validated l.
//
// On creation an enum of 0 takes the next number after the highest one at or
// above limiter.FirstAssignedEnum; an enum another limit holds is a
// conflict. On update the enum never changes: 0 keeps it, another number is
// a conflict; so is a new id_format while overrides of the limit exist,
// because their canonical bucket ids would no longer name the same buckets.
// An update that changes nothing writes nothing, not even an audit entry.
func (d *DB) PutLimit(ctx context.Context, actor string, l limiter.Limit) (limiter.Limit, bool, error) {
	var got limiter.Limit
	var res outcome
	err := d.write(ctx, actor, func(w *writeTx) error {
		var err error
		got, res, err = w.putLimit(ctx, l)
		return err
	})
	if err != nil {
		return limiter.Limit{}, false, err
	}
	return got, res == created, nil
}

// outcome is what an upsert did.
type outcome int

const (
	unchanged outcome = iota
	created
	updated
)

func (w *writeTx) putLimit(ctx context.Context, l limiter.Limit) (limiter.Limit, outcome, error) {
	old, err := getLimit(ctx, w.d, w.tx, l.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return w.createLimit(ctx, l)
	}
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	if l.Enum != 0 && l.Enum != old.Enum {
		return limiter.Limit{}, unchanged, conflictf("limit %q has enum %d: an enum cannot change", l.Name, old.Enum)
	}
	l.Enum, l.CreatedAt, l.UpdatedAt = old.Enum, old.CreatedAt, old.UpdatedAt
	if l == old {
		return old, unchanged, nil
	}
	if l.IDFormat != old.IDFormat {
		var has bool
		err := w.queryRow(ctx, []any{&has}, `SELECT EXISTS (SELECT 1 FROM overrides WHERE limit_name = $1)`, l.Name)
		if err != nil {
			return limiter.Limit{}, unchanged, err
		}
		if has {
			return limiter.Limit{}, unchanged, conflictf("limit %q has overrides: its id_format cannot change while they exist", l.Name)
		}
	}
	l.UpdatedAt = w.now
	err = w.exec(ctx, `
		UPDATE limits SET id_format = $2, burst = $3, count = $4, period = $5, description = $6, shadow = $7, updated_at = $8
		WHERE name = $1`,
		l.Name, string(l.IDFormat), l.Burst, l.Count, int64(l.Period), l.Description, l.Shadow, l.UpdatedAt)
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	err = w.audit(ctx, auditEntry{entity: entityLimit, entityID: l.Name, action: limiter.ActionUpdate,
		limitName: l.Name, before: toLimitDoc(old), after: toLimitDoc(l)})
	return l, updated, err
}

func (w *writeTx) createLimit(ctx context.Context, l limiter.Limit) (limiter.Limit, outcome, error) {
	l.CreatedAt, l.UpdatedAt = w.now, w.now
	// A limit created without an enum gets its number in Let's Encrypt's
	// catalogue while that is free, as an import gives it, else the next
	// free number. Writers are serialised (see lockWrites), so no other
	// transaction can take the number between the subqueries and the
	// insert.
	catalogued, _, _ := limiter.Catalogued(l.Name)
	err := w.queryRow(ctx, []any{&l.Enum}, `
		INSERT INTO limits (`+limitColumns+`)
		VALUES ($1, CASE
				WHEN $2 > 0 THEN $2
				WHEN $11 > 0 AND NOT EXISTS (SELECT 1 FROM limits WHERE enum = $11) THEN $11
				ELSE (SELECT COALESCE(MAX(enum), $3 - 1) + 1 FROM limits WHERE enum >= $3) END,
			$4, $5, $6, $7, $8, $9, $10, $10)
		RETURNING enum`,
		l.Name, l.Enum, limiter.FirstAssignedEnum, string(l.IDFormat), l.Burst, l.Count, int64(l.Period), l.Description, l.Shadow, w.now,
		catalogued)
	switch violated(err) {
	case "":
	case limitsEnumKey:
		return limiter.Limit{}, unchanged, conflictf("enum %d is taken by another limit", l.Enum)
	case limitsPkey:
		return limiter.Limit{}, unchanged, conflictf("limit %q already exists", l.Name)
	}
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	err = w.audit(ctx, auditEntry{entity: entityLimit, entityID: l.Name, action: limiter.ActionCreate,
		limitName: l.Name, after: toLimitDoc(l)})
	return l, created, err
}

// DeleteLimit deletes the limit called name. While overrides or rules
// reference it, that is a conflict: they go first.
func (d *DB) DeleteLimit(ctx context.Context, actor, name string) error {
	return d.write(ctx, actor, func(w *writeTx) error {
		old, err := getLimit(ctx, d, w.tx, name)
		if errors.Is(err, sql.ErrNoRows) {
			return notFoundf("limit %q not found", name)
		}
		if err != nil {
			return err
		}
		if has, err := w.limitHasRules(ctx, name); err != nil || has {
			if err == nil {
				err = conflictf("rules use limit %q: delete them or point them at another limit first", name)
			}
			return err
		}
		err = w.exec(ctx, `DELETE FROM limits WHERE name = $1`, name)
		if violated(err) == overridesLimitFkey {
			return conflictf("limit %q still has overrides: delete them first", name)
		}
		if err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityLimit, entityID: name, action: limiter.ActionDelete,
			limitName: name, before: toLimitDoc(old)})
	})
}
