package db

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Import writes limits, then overrides, in one transaction: all or nothing.
// With dryRun it writes nothing and still returns the counts.
//
// Limits are upserted by name as PutLimit does: an existing limit keeps its
// enum, and a different enum given is a conflict, as is a change of kind;
// a quota whose calendar or zone changes gets a new generation. Override
// bucket ids are canonicalised by the id formats the limits have after the
// limits are written. Overrides are upserted by limit and bucket id: an existing one
// takes the burst, count, period, unlimited and comment given and keeps its
// enabled and expires_at; a new one is created enabled and without expiry.
// Entries that would not change are counted Unchanged and not written. An
// override of a limit that exists neither before nor in limits is
// limiter.ErrUnknownLimit; two overrides of one bucket are
// limiter.ErrOverrideExists.
func (d *DB) Import(ctx context.Context, actor string, limits []limiter.Limit, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error) {
	return d.ImportRules(ctx, actor, "", limits, nil, overrides, false, dryRun)
}

// ImportRules is Import with the rules of one domain, written after the
// limits and before the overrides: a rule is upserted by descriptor,
// taking the limit, shared entries, replaces and quota mode given, and
// counted unchanged when it has them already. The rules of domain that the
// import does not name are deleted, so that the domain holds exactly the
// rules given, and each is returned in the counts' Removed; every rule
// given must be of domain. With merge, the domain's rules are kept and the
// rules given added to them: one whose descriptor the domain has already
// is limiter.ErrRuleExists.
//
// Everything an import reads, and every check, is done before the write
// transaction, so that a large import holds the write lock (and so every
// other admin write) only while its rows are written, in statements of
// many rows each: its cost is linear in the rows. The transaction first
// checks that nothing was written since those reads (the audit's last
// sequence number), and reads and checks again under the lock if
// something was.
func (d *DB) ImportRules(ctx context.Context, actor, domain string, limits []limiter.Limit, rules []limiter.Rule, overrides []limiter.Override, merge, dryRun bool) (limiter.ImportCounts, error) {
	in := importInput{actor: actor, domain: domain, limits: limits, rules: rules, overrides: overrides, merge: merge}
	p, err := d.planImport(ctx, d.reader, d.clock(), in)
	if err != nil {
		return limiter.ImportCounts{}, err
	}
	if dryRun {
		return p.counts, nil
	}
	// Logged before the write lock is taken: everything up to here left
	// other writers alone.
	d.log.InfoContext(ctx, "import planned", "domain", domain, "limits", len(p.limits), "rules", len(p.rules),
		"removed_rules", len(p.removed), "overrides", len(p.overrides))
	err = d.write(ctx, actor, func(w *writeTx) error {
		seq, err := lastSeq(ctx, d, w.tx)
		if err != nil {
			return err
		}
		if seq != p.version {
			if p, err = d.planImport(ctx, w.tx, w.now, in); err != nil {
				return err
			}
		}
		w.now = p.now
		return w.applyImport(ctx, p)
	})
	if err != nil {
		return limiter.ImportCounts{}, err
	}
	return p.counts, nil
}

// importInput is what an import is asked to write.
type importInput struct {
	actor, domain string
	limits        []limiter.Limit
	rules         []limiter.Rule
	overrides     []limiter.Override
	// merge keeps the domain's rules (see ImportRules).
	merge bool
}

// importPlan is what an import writes, worked out from what the database
// held at version: every row as it will be, with the stored row it
// replaces (nil for a new one).
type importPlan struct {
	version   int64
	now       time.Time
	enums     []enumWrite
	limits    []rowWrite[limiter.Limit]
	rules     []rowWrite[limiter.Rule]
	removed   []limiter.Rule
	overrides []overrideWrite
	counts    limiter.ImportCounts
}

// rowWrite is one row an import creates (before nil) or updates.
type rowWrite[T any] struct {
	before *T
	after  T
}

// enumWrite gives an enum to a name: a new row, or the next generation
// of a row whose limit was deleted.
type enumWrite struct {
	enum       int
	name       string
	generation int
	exists     bool
}

// enumRow is a row of the enums table, and the live limit holding it.
type enumRow struct {
	name       string
	generation int
	live       bool
}

// planImport reads, through q, what the import changes, and checks it as
// the writes one by one would.
func (d *DB) planImport(ctx context.Context, q queryer, now time.Time, in importInput) (importPlan, error) {
	p := importPlan{now: now}
	// The version is read first: a write committed after it makes the
	// transaction plan again, whatever the reads below saw of it.
	var err error
	if p.version, err = lastSeq(ctx, d, q); err != nil {
		return p, err
	}
	stored, err := collect(ctx, d, q, scanLimit, `SELECT `+limitColumns+` FROM limits`)
	if err != nil {
		return p, err
	}
	limits := make(map[string]limiter.Limit, len(stored)+len(in.limits))
	live := make(map[int]bool, len(stored))
	for _, l := range stored {
		limits[l.Name] = l
		live[l.Enum] = true
	}
	enums := map[int]*enumRow{}
	err = each(ctx, d, q, func(rows *sql.Rows) error {
		var e int
		var row enumRow
		if err := rows.Scan(&e, &row.name, &row.generation); err != nil {
			return d.fail(ctx, err)
		}
		row.live = live[e]
		enums[e] = &row
		return nil
	}, `SELECT enum, name, generation FROM enums`)
	if err != nil {
		return p, err
	}
	if err := d.planLimits(ctx, q, &p, in.limits, limits, enums); err != nil {
		return p, err
	}
	if err := d.planRules(ctx, q, &p, in, limits); err != nil {
		return p, err
	}
	return p, d.planOverrides(ctx, q, &p, in, limits)
}

// planLimits upserts limits as putLimit does, giving enums as giveEnum
// does from the enums read once: the next free number is looked for from
// where the last one was found.
func (d *DB) planLimits(ctx context.Context, q queryer, p *importPlan, in []limiter.Limit, limits map[string]limiter.Limit, enums map[int]*enumRow) error {
	next := limiter.FirstAssignedEnum
	for _, l := range in {
		l = storedLimit(l)
		old, ok := limits[l.Name]
		if ok {
			if l.Enum != 0 && l.Enum != old.Enum {
				return fmt.Errorf("limit %q has enum %d: %w", l.Name, old.Enum, limiter.ErrEnumFixed)
			}
			l.Enum, l.Generation, l.CreatedAt, l.UpdatedAt = old.Enum, old.Generation, old.CreatedAt, old.UpdatedAt
			if l == old {
				count(&p.counts, unchanged)
				continue
			}
			renew, err := limitChange(old, l)
			if err != nil {
				return err
			}
			if renew {
				// Rare: one read of the limit's overrides per quota whose
				// calendar or zone changes.
				if err := overridesFit(ctx, d, q, l); err != nil {
					return err
				}
				row := enums[l.Enum]
				row.generation++
				p.enums = append(p.enums, enumWrite{enum: l.Enum, name: l.Name, generation: row.generation, exists: true})
				l.Generation = row.generation
			}
			if l.IDFormat != old.IDFormat {
				// Rare: one look-up per limit whose format changes.
				var has bool
				err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM overrides WHERE limit_name = $1)`, l.Name).Scan(&has)
				if err != nil {
					return d.fail(ctx, err)
				}
				if has {
					return fmt.Errorf("limit %q: %w", l.Name, limiter.ErrIDFormatFixed)
				}
			}
			l.UpdatedAt = p.now
			p.limits = append(p.limits, rowWrite[limiter.Limit]{before: &old, after: l})
			limits[l.Name] = l
			count(&p.counts, updated)
			continue
		}
		if msg := limiter.CatalogueProblem(l.Name, l.Enum); msg != "" {
			return enumError(msg)
		}
		if l.Enum == 0 {
			l.Enum, _, _ = limiter.Catalogued(l.Name)
		}
		if l.Enum == 0 {
			for enums[next] != nil {
				next++
			}
			if next > d.maxEnum {
				return fmt.Errorf("every enum from %d to %d was given: %w", limiter.FirstAssignedEnum, d.maxEnum, limiter.ErrNoEnumLeft)
			}
			l.Enum = next
		}
		row := enums[l.Enum]
		switch {
		case row == nil:
			row = &enumRow{}
			enums[l.Enum] = row
		case row.live:
			return fmt.Errorf("enum %d is taken by limit %q: %w", l.Enum, row.name, limiter.ErrEnumTaken)
		case limiter.CatalogueName(l.Enum) != l.Name:
			return fmt.Errorf("enum %d of deleted limit %q: %w", l.Enum, row.name, limiter.ErrEnumRetired)
		}
		p.enums = append(p.enums, enumWrite{enum: l.Enum, name: l.Name, generation: row.generation + 1, exists: row.generation > 0})
		row.name, row.generation, row.live = l.Name, row.generation+1, true
		l.Generation, l.CreatedAt, l.UpdatedAt = row.generation, p.now, p.now
		p.limits = append(p.limits, rowWrite[limiter.Limit]{after: l})
		limits[l.Name] = l
		count(&p.counts, created)
	}
	return nil
}

// planRules makes the rules of the domain those given, or adds them to the
// domain's when the import merges. Without a domain there are none to
// import.
func (d *DB) planRules(ctx context.Context, q queryer, p *importPlan, in importInput, limits map[string]limiter.Limit) error {
	if in.domain == "" {
		return nil
	}
	stored, err := collect(ctx, d, q, scanRule, `SELECT `+ruleColumns+` FROM rules WHERE domain = $1 ORDER BY id`, in.domain)
	if err != nil {
		return err
	}
	old := make(map[string]limiter.Rule, len(stored))
	for _, r := range stored {
		old[descriptorHash(r.Descriptor)] = r
	}
	named := make(map[string]bool, len(in.rules))
	for _, r := range in.rules {
		if r.Domain != in.domain {
			return fmt.Errorf("import of domain %q holds a rule of domain %q", in.domain, r.Domain)
		}
		hash := descriptorHash(r.Descriptor)
		if named[hash] {
			return fmt.Errorf("domain %q, descriptor %s: %w", r.Domain, descriptorJSON(r.Descriptor), limiter.ErrRuleExists)
		}
		named[hash] = true
		l, ok := limits[r.Limit]
		if !ok {
			return fmt.Errorf("rule of limit %q: %w", r.Limit, limiter.ErrUnknownLimit)
		}
		if msg := rules.CheckLimit(r, l); msg != "" {
			return &limiter.ValidationError{Fields: []limiter.FieldError{{Field: "limit", Message: msg}}}
		}
		o, ok := old[hash]
		switch {
		case ok && in.merge:
			return fmt.Errorf("domain %q, descriptor %s: %w", r.Domain, descriptorJSON(r.Descriptor), limiter.ErrRuleExists)
		case !ok:
			r.ID = d.ids.next(p.now)
			r.CreatedAt, r.UpdatedAt = p.now, p.now
			p.rules = append(p.rules, rowWrite[limiter.Rule]{after: r})
			count(&p.counts, created)
			continue
		case o.Limit == r.Limit && slices.Equal(o.Descriptor, r.Descriptor) && slices.Equal(o.Replaces, r.Replaces) && o.QuotaMode == r.QuotaMode:
			count(&p.counts, unchanged)
			continue
		}
		n := o
		n.Descriptor, n.Limit, n.Replaces, n.QuotaMode, n.UpdatedAt = r.Descriptor, r.Limit, r.Replaces, r.QuotaMode, p.now
		p.rules = append(p.rules, rowWrite[limiter.Rule]{before: &o, after: n})
		count(&p.counts, updated)
	}
	for _, r := range stored {
		if in.merge || named[descriptorHash(r.Descriptor)] {
			continue
		}
		p.removed = append(p.removed, r)
		p.counts.Removed = append(p.counts.Removed, r)
	}
	return nil
}

func count(c *limiter.ImportCounts, res outcome) {
	switch res {
	case created:
		c.Created++
	case updated:
		c.Updated++
	default:
		c.Unchanged++
	}
}

// bucketKey names an override by what it is unique on.
type bucketKey struct{ limit, bucket string }

// overrideWrite is one override an import creates (before nil) or updates.
type overrideWrite struct {
	before *limiter.Override
	after  limiter.Override
}

// planOverrides canonicalises the bucket ids of the overrides by the id
// formats their limits will have, and upserts them against the stored
// overrides of those limits, read in a few statements. An unknown limit is
// limiter.ErrUnknownLimit; an id the format refuses, limiter.ErrIDRefused;
// parameters that do not fit the limit's kind, limiter.ErrParamsRefused.
func (d *DB) planOverrides(ctx context.Context, q queryer, p *importPlan, in importInput, limits map[string]limiter.Limit) error {
	var names []string
	seenLimit := map[string]bool{}
	for _, o := range in.overrides {
		if !seenLimit[o.Limit] {
			seenLimit[o.Limit] = true
			names = append(names, o.Limit)
		}
	}
	existing := map[bucketKey]limiter.Override{}
	size := d.be.batchRows()
	for start := 0; start < len(names); start += size {
		batch := names[start:min(start+size, len(names))]
		args := make([]any, len(batch))
		for i, n := range batch {
			args[i] = n
		}
		err := each(ctx, d, q, func(rows *sql.Rows) error {
			s, err := scanOverride(rows)
			if err != nil {
				return d.fail(ctx, err)
			}
			existing[bucketKey{s.Limit, s.BucketID}] = s
			return nil
		}, `SELECT `+overrideColumns+` FROM overrides WHERE limit_name IN (`+placeholders(1, len(batch))+`)`, args...)
		if err != nil {
			return err
		}
	}
	seen := make(map[bucketKey]bool, len(in.overrides))
	for _, o := range in.overrides {
		l, ok := limits[o.Limit]
		if !ok {
			return fmt.Errorf("override of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrUnknownLimit)
		}
		id, err := bucketid.CanonicalOverride(l.IDFormat, o.BucketID)
		if err != nil {
			return fmt.Errorf("override of limit %q for bucket %q, id format %s: %w", o.Limit, o.BucketID, l.IDFormat, limiter.ErrIDRefused)
		}
		if !o.Unlimited && len(l.ParamsProblems(o.Params, true)) > 0 {
			return fmt.Errorf("override of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrParamsRefused)
		}
		o.BucketID = id
		k := bucketKey{o.Limit, o.BucketID}
		if seen[k] {
			return fmt.Errorf("the import holds two overrides of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrOverrideExists)
		}
		seen[k] = true
		old, ok := existing[k]
		if !ok {
			o.ID = d.ids.next(p.now)
			o.Enabled, o.ExpiresAt = true, time.Time{}
			o.Version, o.CreatedAt, o.UpdatedAt, o.UpdatedBy = 1, p.now, p.now, in.actor
			p.overrides = append(p.overrides, overrideWrite{after: stored(o)})
			p.counts.Created++
			continue
		}
		n := old
		n.Params, n.Unlimited, n.Comment = o.Params, o.Unlimited, o.Comment
		n = stored(n)
		if n.Params == old.Params && n.Unlimited == old.Unlimited && n.Comment == old.Comment {
			p.counts.Unchanged++
			continue
		}
		n.Version, n.UpdatedAt, n.UpdatedBy = old.Version+1, p.now, in.actor
		p.overrides = append(p.overrides, overrideWrite{before: &old, after: n})
		p.counts.Updated++
	}
	return nil
}

// applyImport writes a plan: a few statements per batch of rows, and the
// audit entries likewise.
func (w *writeTx) applyImport(ctx context.Context, p importPlan) error {
	var audits []auditEntry
	for _, e := range p.enums {
		if !e.exists {
			continue
		}
		// A catalogue number given again: rare, one statement each.
		if err := w.exec(ctx, `UPDATE enums SET name = $2, generation = $3 WHERE enum = $1`, e.enum, e.name, e.generation); err != nil {
			return err
		}
	}
	var rows [][]any
	for _, e := range p.enums {
		if !e.exists {
			rows = append(rows, []any{e.enum, e.name, e.generation})
		}
	}
	if err := w.insertRows(ctx, `INSERT INTO enums (enum, name, generation)`, rows, ""); err != nil {
		return err
	}
	rows = rows[:0]
	for _, lw := range p.limits {
		l := lw.after
		rows = append(rows, limitArgs(l))
		e := auditEntry{entity: entityLimit, entityID: l.Name, action: limiter.ActionCreate, limitName: l.Name, after: toLimitDoc(l)}
		if lw.before != nil {
			e.action, e.before = limiter.ActionUpdate, toLimitDoc(*lw.before)
		}
		audits = append(audits, e)
	}
	err := w.insertRows(ctx, `INSERT INTO limits (`+limitColumns+`)`, rows, ` ON CONFLICT (name) DO UPDATE SET
		generation = excluded.generation, id_format = excluded.id_format, calendar = excluded.calendar, time_zone = excluded.time_zone,
		burst = excluded.burst, count = excluded.count, period = excluded.period,
		description = excluded.description, unit = excluded.unit, shadow = excluded.shadow, updated_at = excluded.updated_at`)
	if err != nil {
		return err
	}
	size := w.d.be.batchRows()
	for start := 0; start < len(p.removed); start += size {
		batch := p.removed[start:min(start+size, len(p.removed))]
		args := make([]any, len(batch))
		for i, r := range batch {
			args[i] = r.ID
			audits = append(audits, auditEntry{entity: entityRule, entityID: r.ID, action: limiter.ActionDelete, limitName: r.Limit, before: toRuleDoc(r)})
		}
		if err := w.execCached(ctx, `DELETE FROM rules WHERE id IN (`+placeholders(1, len(batch))+`)`, args...); err != nil {
			return err
		}
	}
	rows = rows[:0]
	for _, rw := range p.rules {
		r := rw.after
		rows = append(rows, []any{r.ID, r.Domain, descriptorJSON(r.Descriptor), descriptorHash(r.Descriptor), r.Limit,
			replacesJSON(r.Replaces), r.QuotaMode, r.CreatedAt, r.UpdatedAt, w.actor})
		e := auditEntry{entity: entityRule, entityID: r.ID, action: limiter.ActionCreate, limitName: r.Limit, after: toRuleDoc(r)}
		if rw.before != nil {
			e.action, e.before = limiter.ActionUpdate, toRuleDoc(*rw.before)
		}
		audits = append(audits, e)
	}
	err = w.insertRows(ctx, `INSERT INTO rules (id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by)`,
		rows, ` ON CONFLICT (id) DO UPDATE SET descriptor = excluded.descriptor, limit_name = excluded.limit_name,
		replaces = excluded.replaces, quota_mode = excluded.quota_mode, updated_at = excluded.updated_at, updated_by = excluded.updated_by`)
	if err != nil {
		return err
	}
	if err := w.auditRows(ctx, audits); err != nil {
		return err
	}
	for start := 0; start < len(p.overrides); start += size {
		batch := p.overrides[start:min(start+size, len(p.overrides))]
		if err := w.upsertOverrides(ctx, batch); err != nil {
			return err
		}
		if err := w.auditOverrides(ctx, batch); err != nil {
			return err
		}
	}
	if len(audits) > 0 || len(p.overrides) > 0 {
		seq, err := lastSeq(ctx, w.d, w.tx)
		if err != nil {
			return err
		}
		w.seq = seq
	}
	return nil
}

// insertRows runs head VALUES (rows...) tail in statements of at most the
// backend's batch of rows, each prepared once per transaction and size.
func (w *writeTx) insertRows(ctx context.Context, head string, rows [][]any, tail string) error {
	size := w.d.be.batchRows()
	for start := 0; start < len(rows); start += size {
		batch := rows[start:min(start+size, len(rows))]
		var q strings.Builder
		q.WriteString(head + " VALUES ")
		var args []any
		for i, row := range batch {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(" + placeholders(len(args)+1, len(row)) + ")")
			args = append(args, row...)
		}
		q.WriteString(tail)
		if err := w.execCached(ctx, q.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

// auditRows writes audit entries in statements of many rows, stamped
// with the transaction's time and actor; the caller reads the last
// sequence number after.
func (w *writeTx) auditRows(ctx context.Context, entries []auditEntry) error {
	rows := make([][]any, 0, len(entries))
	for _, e := range entries {
		before, err := jsonDoc(e.before)
		if err != nil {
			return err
		}
		after, err := jsonDoc(e.after)
		if err != nil {
			return err
		}
		rows = append(rows, []any{w.now, w.actor, e.entity, e.entityID, e.action, nullString(e.limitName), nullString(e.bucketID), before, after})
	}
	return w.insertRows(ctx, `INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, bucket_id, before, after)`, rows, "")
}

// upsertOverrides writes a batch in one statement, prepared once per
// transaction and batch size. Rows that exist (same
// limit and bucket id) take the new parameters, comment and version;
// their id, enabled, expires_at and created_at stay.
func (w *writeTx) upsertOverrides(ctx context.Context, batch []overrideWrite) error {
	const perRow = 10
	var q strings.Builder
	q.WriteString(`INSERT INTO overrides (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, version, created_at, updated_at, updated_by) VALUES `)
	args := make([]any, 2, 2+perRow*len(batch))
	args[0], args[1] = w.now, w.actor
	for i, ow := range batch {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(" + placeholders(len(args)+1, perRow) + ", $1, $1, $2)")
		r := toOverrideRow(ow.after)
		args = append(args, r.ID, r.Limit, r.BucketID, r.Burst, r.Count, r.Period, r.Unlimited, r.Comment, r.Enabled, r.Version)
	}
	q.WriteString(` ON CONFLICT (limit_name, bucket_id) DO UPDATE SET
		burst = excluded.burst, count = excluded.count, period = excluded.period, unlimited = excluded.unlimited,
		comment = excluded.comment, version = excluded.version, updated_at = excluded.updated_at, updated_by = excluded.updated_by`)
	return w.execCached(ctx, q.String(), args...)
}

// auditOverrides writes the audit entries of a batch in one statement,
// prepared once per transaction and batch size.
func (w *writeTx) auditOverrides(ctx context.Context, batch []overrideWrite) error {
	const perRow = 6
	var q strings.Builder
	q.WriteString(`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, bucket_id, before, after) VALUES `)
	args := make([]any, 2, 2+perRow*len(batch))
	args[0], args[1] = w.now, w.actor
	for i, ow := range batch {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("($1, $2, 'override', " + placeholders(len(args)+1, perRow) + ")")
		action := limiter.ActionCreate
		var before any
		if ow.before != nil {
			action, before = limiter.ActionUpdate, toOverrideDoc(*ow.before)
		}
		b, err := jsonDoc(before)
		if err != nil {
			return err
		}
		a, err := jsonDoc(toOverrideDoc(ow.after))
		if err != nil {
			return err
		}
		args = append(args, ow.after.ID, action, ow.after.Limit, ow.after.BucketID, b, a)
	}
	return w.execCached(ctx, q.String(), args...)
}
