package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Import writes limits, then overrides, in one transaction: all or nothing.
// With dryRun it rolls back at the end and still returns the counts.
//
// Limits are upserted by name as PutLimit does: an existing limit keeps its
// enum, and a different enum given is a conflict. Override bucket ids are
// canonicalised here, under the write lock, by the id formats the limits
// have after the limits are written. Overrides are upserted by
// limit and bucket id: an existing one takes the burst, count, period,
// unlimited and comment given and keeps its enabled and expires_at; a new
// one is created enabled and without expiry. Entries that would not change
// are counted Unchanged and not written. An override of a limit that
// exists neither before nor in limits is limiter.ErrUnknownLimit; two
// overrides of one bucket are limiter.ErrOverrideExists.
func (d *DB) Import(ctx context.Context, actor string, limits []limiter.Limit, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error) {
	return d.ImportRules(ctx, actor, "", limits, nil, overrides, dryRun)
}

// importRules makes the rules of domain those given. Without a domain
// there are none to import.
func (w *writeTx) importRules(ctx context.Context, domain string, rules []limiter.Rule, counts *limiter.ImportCounts) error {
	if domain == "" {
		return nil
	}
	stored, err := collect(ctx, w.d, w.tx, scanRule, `SELECT `+ruleColumns+` FROM rules WHERE domain = $1 ORDER BY id`, domain)
	if err != nil {
		return err
	}
	old := make(map[string]limiter.Rule, len(stored))
	for _, r := range stored {
		old[descriptorHash(r.Descriptor)] = r
	}
	named := make(map[string]bool, len(rules))
	for _, r := range rules {
		if r.Domain != domain {
			return fmt.Errorf("import of domain %q holds a rule of domain %q", domain, r.Domain)
		}
		res, err := w.putRule(ctx, r, old)
		if err != nil {
			return err
		}
		count(counts, res)
		named[descriptorHash(r.Descriptor)] = true
	}
	for _, r := range stored {
		if named[descriptorHash(r.Descriptor)] {
			continue
		}
		if err := w.deleteRule(ctx, r); err != nil {
			return err
		}
		counts.Removed = append(counts.Removed, "rule "+r.ID+" of "+descriptorJSON(r.Descriptor)+" to limit "+r.Limit)
	}
	return nil
}

// ImportRules is Import with the rules of one domain, written after the
// limits and before the overrides: a rule is upserted by descriptor,
// taking the limit and shared entries given, and counted unchanged when it
// has them already. The rules of domain that the import does not name are
// deleted, so that the domain holds exactly the rules given, and each is
// described in the counts' Removed; every rule given must be of domain.
func (d *DB) ImportRules(ctx context.Context, actor, domain string, limits []limiter.Limit, rules []limiter.Rule, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error) {
	var counts limiter.ImportCounts
	err := d.write(ctx, actor, func(w *writeTx) error {
		counts = limiter.ImportCounts{}
		w.dryRun = dryRun
		for _, l := range limits {
			_, res, err := w.putLimit(ctx, l)
			if err != nil {
				return err
			}
			count(&counts, res)
		}
		if err := w.importRules(ctx, domain, rules, &counts); err != nil {
			return err
		}
		return w.importOverrides(ctx, overrides, &counts)
	})
	if err != nil {
		return limiter.ImportCounts{}, err
	}
	return counts, nil
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

func (w *writeTx) importOverrides(ctx context.Context, in []limiter.Override, counts *limiter.ImportCounts) error {
	in, existing, err := w.overridesOfLimits(ctx, in)
	if err != nil {
		return err
	}
	seen := make(map[bucketKey]bool, len(in))
	var writes []overrideWrite
	for _, o := range in {
		k := bucketKey{o.Limit, o.BucketID}
		if seen[k] {
			return fmt.Errorf("the import holds two overrides of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrOverrideExists)
		}
		seen[k] = true
		old, ok := existing[k]
		if !ok {
			o.ID = w.d.ids.next(w.now)
			o.Enabled, o.ExpiresAt = true, time.Time{}
			o.Version, o.CreatedAt, o.UpdatedAt, o.UpdatedBy = 1, w.now, w.now, w.actor
			writes = append(writes, overrideWrite{after: stored(o)})
			counts.Created++
			continue
		}
		n := old
		n.Params, n.Unlimited, n.Comment = o.Params, o.Unlimited, o.Comment
		n = stored(n)
		if n.Params == old.Params && n.Unlimited == old.Unlimited && n.Comment == old.Comment {
			counts.Unchanged++
			continue
		}
		n.Version, n.UpdatedAt, n.UpdatedBy = old.Version+1, w.now, w.actor
		writes = append(writes, overrideWrite{before: &old, after: n})
		counts.Updated++
	}
	size := w.d.be.batchRows()
	for start := 0; start < len(writes); start += size {
		batch := writes[start:min(start+size, len(writes))]
		if err := w.upsertOverrides(ctx, batch); err != nil {
			return err
		}
		if err := w.auditOverrides(ctx, batch); err != nil {
			return err
		}
	}
	if len(writes) > 0 {
		w.seq, err = lastSeq(ctx, w.d, w.tx)
	}
	return err
}

// overridesOfLimits canonicalises the bucket ids of in by their limits' id
// formats, reading the limits under the write lock, so that a concurrent
// change of a format cannot leave an override written in the old one. It
// returns the canonicalised copy and the stored overrides of those limits.
// An unknown limit is limiter.ErrUnknownLimit; an id the format now
// refuses, limiter.ErrIDRefused.
func (w *writeTx) overridesOfLimits(ctx context.Context, in []limiter.Override) ([]limiter.Override, map[bucketKey]limiter.Override, error) {
	out := make([]limiter.Override, len(in))
	existing := map[bucketKey]limiter.Override{}
	formats := map[string]limiter.IDFormat{}
	for i, o := range in {
		format, read := formats[o.Limit]
		if !read {
			l, err := getLimit(ctx, w.d, w.tx, o.Limit)
			if errors.Is(err, sql.ErrNoRows) {
				return nil, nil, fmt.Errorf("override of limit %q for bucket %q: %w", o.Limit, o.BucketID, limiter.ErrUnknownLimit)
			}
			if err != nil {
				return nil, nil, err
			}
			format = l.IDFormat
			formats[o.Limit] = format
			err = each(ctx, w.d, w.tx, func(rows *sql.Rows) error {
				s, err := scanOverride(rows)
				if err != nil {
					return w.d.fail(ctx, err)
				}
				existing[bucketKey{s.Limit, s.BucketID}] = s
				return nil
			}, `SELECT `+overrideColumns+` FROM overrides WHERE limit_name = $1`, o.Limit)
			if err != nil {
				return nil, nil, err
			}
		}
		id, err := format.CanonicalOverride(o.BucketID)
		if err != nil {
			return nil, nil, fmt.Errorf("override of limit %q for bucket %q, id format %s: %w", o.Limit, o.BucketID, format, limiter.ErrIDRefused)
		}
		o.BucketID = id
		out[i] = o
	}
	return out, existing, nil
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
