package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// limitRow is a row of the limits table.
type limitRow struct {
	Name        string
	Enum        int
	Generation  int
	IDFormat    string
	Kind        string
	Calendar    string
	TimeZone    string
	Burst       int64
	Count       int64
	Period      int64
	Description string
	Unit        string
	Shadow      bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

const limitColumns = `name, enum, generation, id_format, kind, calendar, time_zone, burst, count, period, description, unit, shadow, created_at, updated_at`

func (r *limitRow) dest() []any {
	return []any{&r.Name, &r.Enum, &r.Generation, &r.IDFormat, &r.Kind, &r.Calendar, &r.TimeZone, &r.Burst, &r.Count, &r.Period,
		&r.Description, &r.Unit, &r.Shadow, &r.CreatedAt, &r.UpdatedAt}
}

// limitArgs are the values of limitColumns for l, in order.
func limitArgs(l limiter.Limit) []any {
	return []any{l.Name, l.Enum, l.Generation, string(l.IDFormat), string(l.Kind), string(l.Calendar), l.TimeZone,
		l.Burst, l.Count, int64(l.Period), l.Description, l.Unit, l.Shadow, l.CreatedAt, l.UpdatedAt}
}

func (r *limitRow) limit() limiter.Limit {
	return limiter.Limit{
		Name: r.Name, Enum: r.Enum, Generation: r.Generation, IDFormat: limiter.IDFormat(r.IDFormat),
		Kind: limiter.Kind(r.Kind), Calendar: limiter.Calendar(r.Calendar), TimeZone: r.TimeZone,
		Params:      limiter.Params{Burst: r.Burst, Count: r.Count, Period: time.Duration(r.Period)},
		Description: r.Description, Unit: r.Unit, Shadow: r.Shadow, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
}

// storedLimit returns l as the database writes it: naming its unit and kind,
// so that a limit put without them equals the stored one that has the
// defaults.
func storedLimit(l limiter.Limit) limiter.Limit {
	l.Unit, l.Kind = l.Counts(), l.KindOf()
	return l
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
// limiter.ErrLimitNotFound.
func (d *DB) GetLimit(ctx context.Context, name string) (limiter.Limit, error) {
	l, err := getLimit(ctx, d, d.reader, name)
	if errors.Is(err, sql.ErrNoRows) {
		return limiter.Limit{}, fmt.Errorf("limit %q: %w", name, limiter.ErrLimitNotFound)
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
// On creation the enum is given for good (see giveEnum): an enum given
// before, to a limit deleted since, is refused unless it is the catalogue
// number of l.Name. On update the enum never changes: 0 keeps it, another
// number is a conflict; so is a new id_format while overrides of the limit
// exist, because their canonical bucket ids would no longer name the same
// buckets, and a new kind (see limitChange). A quota whose calendar or
// time zone changes gets a new generation (see limitChange). An update
// that changes nothing writes nothing, not even an audit entry.
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
	l = storedLimit(l)
	old, err := getLimit(ctx, w.d, w.tx, l.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return w.createLimit(ctx, l)
	}
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	if l.Enum != 0 && l.Enum != old.Enum {
		return limiter.Limit{}, unchanged, fmt.Errorf("limit %q has enum %d: %w", l.Name, old.Enum, limiter.ErrEnumFixed)
	}
	l.Enum, l.Generation, l.CreatedAt, l.UpdatedAt = old.Enum, old.Generation, old.CreatedAt, old.UpdatedAt
	if l == old {
		return old, unchanged, nil
	}
	renew, err := limitChange(old, l)
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	if l.IDFormat != old.IDFormat {
		var has bool
		err := w.queryRow(ctx, []any{&has}, `SELECT EXISTS (SELECT 1 FROM overrides WHERE limit_name = $1)`, l.Name)
		if err != nil {
			return limiter.Limit{}, unchanged, err
		}
		if has {
			return limiter.Limit{}, unchanged, fmt.Errorf("limit %q: %w", l.Name, limiter.ErrIDFormatFixed)
		}
	}
	if renew {
		if err := overridesFit(ctx, w.d, w.tx, l); err != nil {
			return limiter.Limit{}, unchanged, err
		}
		err := w.queryRow(ctx, []any{&l.Generation}, `
			UPDATE enums SET generation = generation + 1 WHERE enum = $1 RETURNING generation`, l.Enum)
		if err != nil {
			return limiter.Limit{}, unchanged, err
		}
	}
	l.UpdatedAt = w.now
	err = w.exec(ctx, `
		UPDATE limits SET generation = $2, id_format = $3, calendar = $4, time_zone = $5, burst = $6, count = $7, period = $8,
			description = $9, unit = $10, shadow = $11, updated_at = $12
		WHERE name = $1`,
		l.Name, l.Generation, string(l.IDFormat), string(l.Calendar), l.TimeZone, l.Burst, l.Count, int64(l.Period),
		l.Description, l.Unit, l.Shadow, l.UpdatedAt)
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	err = w.audit(ctx, auditEntry{entity: entityLimit, entityID: l.Name, action: limiter.ActionUpdate,
		limitName: l.Name, before: toLimitDoc(old), after: toLimitDoc(l)})
	return l, updated, err
}

// limitChange checks an update of the stored limit old into l, both as
// stored, and reports whether l needs a new generation. The kind is fixed
// (limiter.ErrKindFixed), and so is whether the limit is a calendar
// quota: a rate limit's stored TATs, a quota's usage and a concurrency
// limit's leases mean nothing to another kind. A quota may change its
// calendar or zone, but its usage, kept per window, would then be read
// against other windows: it starts again, under new bucket keys.
func limitChange(old, l limiter.Limit) (renew bool, err error) {
	if l.KindOf() != old.KindOf() || l.Quota() != old.Quota() {
		return false, fmt.Errorf("limit %q is %s, and its kind cannot change: %w", l.Name, kindWords(old), limiter.ErrKindFixed)
	}
	return l.Calendar != old.Calendar || l.TimeZone != old.TimeZone, nil
}

// kindWords names what sort of limit l is, in messages.
func kindWords(l limiter.Limit) string {
	switch {
	case l.Quota():
		return "a calendar quota"
	case l.KindOf() == limiter.KindConcurrency:
		return "a concurrency limit"
	}
	return "a rate limit"
}

// overridesFit checks, through q, that every override of l as stored is
// valid for l as it is about to be written: a quota's calendar bounds its
// count, and a snapshot refuses an override that does not fit its limit.
// The first that does not fit is a *limiter.ValidationError naming
// calendar, the field whose change made it so.
func overridesFit(ctx context.Context, d *DB, q queryer, l limiter.Limit) error {
	var r overrideRow
	dest := r.dest()
	return each(ctx, d, q, func(rows *sql.Rows) error {
		if err := rows.Scan(dest...); err != nil {
			return d.fail(ctx, err)
		}
		o := r.override()
		fe := l.ParamsProblems(o.Params, true)
		if len(fe) == 0 {
			return nil
		}
		ve := &limiter.ValidationError{}
		ve.Add("calendar", fmt.Sprintf("override %s would no longer fit the limit (%s: %s); change or delete it first", o.ID, fe[0].Field, fe[0].Message))
		return ve
	}, `SELECT `+overrideColumns+` FROM overrides WHERE limit_name = $1 AND NOT unlimited`, l.Name)
}

func (w *writeTx) createLimit(ctx context.Context, l limiter.Limit) (limiter.Limit, outcome, error) {
	l.CreatedAt, l.UpdatedAt = w.now, w.now
	var err error
	if l.Enum, l.Generation, err = w.giveEnum(ctx, l.Name, l.Enum); err != nil {
		return limiter.Limit{}, unchanged, err
	}
	err = w.exec(ctx, `INSERT INTO limits (`+limitColumns+`) VALUES (`+placeholders(1, 15)+`)`, limitArgs(l)...)
	switch violated(err) {
	case "":
	case limitsEnumKey:
		return limiter.Limit{}, unchanged, fmt.Errorf("enum %d: %w", l.Enum, limiter.ErrEnumTaken)
	case limitsPkey:
		return limiter.Limit{}, unchanged, fmt.Errorf("limit %q: %w", l.Name, limiter.ErrLimitExists)
	}
	if err != nil {
		return limiter.Limit{}, unchanged, err
	}
	err = w.audit(ctx, auditEntry{entity: entityLimit, entityID: l.Name, action: limiter.ActionCreate,
		limitName: l.Name, after: toLimitDoc(l)})
	return l, created, err
}

// giveEnum picks the enum of a new limit called name, records it in the
// enums table and returns it with its generation. enum is the one asked
// for, 0 for none: then a catalogue name gets its catalogue number, any
// other name the lowest number from limiter.FirstAssignedEnum up that was
// never given.
//
// An enum is given once: a deleted limit's enum stays retired, so that no
// other limit ever finds its buckets. The exception is a catalogue number,
// which only its own name may hold: that name gets it again, in a new
// generation, which keeps the old buckets out of reach all the same.
// Writers are serialised (see lockWrites), so nothing can give the number
// between the reads and the writes here.
func (w *writeTx) giveEnum(ctx context.Context, name string, enum int) (int, int, error) {
	if msg := limiter.CatalogueProblem(name, enum); msg != "" {
		return 0, 0, enumError(msg)
	}
	if enum == 0 {
		enum, _, _ = limiter.Catalogued(name)
	}
	if enum == 0 {
		// Computed in 64 bits, so that the number after the largest enum
		// does not overflow Postgres's integer.
		var next int64
		err := w.queryRow(ctx, []any{&next}, `
			SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM enums WHERE enum = $1) THEN $1
				ELSE (SELECT MIN(CAST(e.enum AS bigint)) + 1 FROM enums e
					WHERE e.enum >= $1 AND NOT EXISTS (SELECT 1 FROM enums n WHERE n.enum = CAST(e.enum AS bigint) + 1))
			END`, limiter.FirstAssignedEnum)
		if err != nil {
			return 0, 0, err
		}
		if next > int64(w.d.maxEnum) {
			return 0, 0, fmt.Errorf("every enum from %d to %d was given: %w", limiter.FirstAssignedEnum, w.d.maxEnum, limiter.ErrNoEnumLeft)
		}
		enum = int(next)
	}
	var owner string
	var generation int
	var live bool
	err := w.queryRow(ctx, []any{&owner, &generation, &live}, `
		SELECT name, generation, EXISTS (SELECT 1 FROM limits WHERE enum = $1) FROM enums WHERE enum = $1`, enum)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return enum, 1, w.exec(ctx, `INSERT INTO enums (enum, name, generation) VALUES ($1, $2, 1)`, enum, name)
	case err != nil:
		return 0, 0, err
	case live:
		return 0, 0, fmt.Errorf("enum %d is taken by limit %q: %w", enum, owner, limiter.ErrEnumTaken)
	case limiter.CatalogueName(enum) != name:
		return 0, 0, fmt.Errorf("enum %d of deleted limit %q: %w", enum, owner, limiter.ErrEnumRetired)
	}
	err = w.queryRow(ctx, []any{&generation}, `
		UPDATE enums SET name = $2, generation = generation + 1 WHERE enum = $1 RETURNING generation`, enum, name)
	return enum, generation, err
}

// enumError is a 422 naming the enum.
func enumError(msg string) error {
	ve := &limiter.ValidationError{}
	ve.Add("enum", msg)
	return ve
}

// DeleteLimit deletes the limit called name. While overrides or rules
// reference it, that is a conflict: they go first.
func (d *DB) DeleteLimit(ctx context.Context, actor, name string) error {
	return d.write(ctx, actor, func(w *writeTx) error {
		old, err := getLimit(ctx, d, w.tx, name)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("limit %q: %w", name, limiter.ErrLimitNotFound)
		}
		if err != nil {
			return err
		}
		if has, err := w.limitHasRules(ctx, name); err != nil || has {
			if err == nil {
				err = fmt.Errorf("limit %q: %w", name, limiter.ErrHasRules)
			}
			return err
		}
		err = w.exec(ctx, `DELETE FROM limits WHERE name = $1`, name)
		if violated(err) == overridesLimitFkey {
			return fmt.Errorf("limit %q: %w", name, limiter.ErrHasOverrides)
		}
		if err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityLimit, entityID: name, action: limiter.ActionDelete,
			limitName: name, before: toLimitDoc(old)})
	})
}
