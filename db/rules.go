package db

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

const entityRule = "rule"

// rulesDomainDescriptorKey is the uniqueness of a pattern within a domain,
// as Postgres names it and as SQLite reports it.
const (
	rulesDomainDescriptorKey       = "rules_domain_descriptor_key"
	rulesDomainDescriptorKeySQLite = "rules.domain, rules.descriptor_hash"
)

const ruleColumns = `id, domain, descriptor, limit_name, replaces, quota_mode, created_at, updated_at`

// entryDoc is a descriptor entry as the descriptor column, the audit and
// the REST API write it: no value for an entry that matches any.
type entryDoc struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Shared bool   `json:"shared,omitempty"`
}

// descriptorJSON encodes a pattern deterministically.
func descriptorJSON(entries []limiter.DescriptorEntry) string {
	docs := make([]entryDoc, len(entries))
	for i, e := range entries {
		docs[i] = entryDoc(e)
	}
	b, _ := json.Marshal(docs) // strings, bools and structs of them always encode
	return string(b)
}

// descriptorHash tells patterns apart by their keys and values only: one
// domain holds a pattern once, shared or not. A pattern without shared
// entries hashes as it did before entries could be shared.
func descriptorHash(entries []limiter.DescriptorEntry) string {
	plain := make([]limiter.DescriptorEntry, len(entries))
	for i, e := range entries {
		plain[i] = limiter.DescriptorEntry{Key: e.Key, Value: e.Value}
	}
	h := sha256.Sum256([]byte(descriptorJSON(plain)))
	return hex.EncodeToString(h[:])
}

// replacesJSON encodes the limits a rule replaces, [] for none.
func replacesJSON(names []string) string {
	if names == nil {
		names = []string{}
	}
	b, _ := json.Marshal(names) // strings always encode
	return string(b)
}

// ruleDoc is a rule in audit entries, in the shape of the REST API's.
type ruleDoc struct {
	ID         string     `json:"id"`
	Domain     string     `json:"domain"`
	Descriptor []entryDoc `json:"descriptor"`
	Limit      string     `json:"limit"`
	Replaces   []string   `json:"replaces,omitempty"`
	QuotaMode  bool       `json:"quota_mode,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

func toRuleDoc(r limiter.Rule) *ruleDoc {
	d := &ruleDoc{ID: r.ID, Domain: r.Domain, Limit: r.Limit, Replaces: r.Replaces, QuotaMode: r.QuotaMode,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	for _, e := range r.Descriptor {
		d.Descriptor = append(d.Descriptor, entryDoc(e))
	}
	return d
}

func scanRule(rows *sql.Rows) (limiter.Rule, error) {
	return scanRuleFrom(rows)
}

func scanRuleFrom(row interface{ Scan(...any) error }) (limiter.Rule, error) {
	var r limiter.Rule
	var desc, replaces string
	if err := row.Scan(&r.ID, &r.Domain, &desc, &r.Limit, &replaces, &r.QuotaMode, &r.CreatedAt, &r.UpdatedAt); err != nil {
		return limiter.Rule{}, err
	}
	// What this version cannot read, such as a member a newer version
	// added, leaves the rule out of snapshots rather than applied without
	// it; the rest is read as far as it goes, for listings.
	var unread []string
	if err := strictJSON(replaces, &r.Replaces); err != nil {
		unread = append(unread, "replaces: "+err.Error())
	}
	if len(r.Replaces) == 0 {
		r.Replaces = nil
	}
	var docs []entryDoc
	if err := strictJSON(desc, &docs); err != nil {
		unread = append(unread, "descriptor: "+err.Error())
	}
	r.Unread = strings.Join(unread, "; ")
	r.Descriptor = make([]limiter.DescriptorEntry, len(docs))
	for i, d := range docs {
		r.Descriptor[i] = limiter.DescriptorEntry(d)
	}
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	return r, nil
}

// strictJSON decodes s into v, refusing members v has no place for; what
// it could decode stays in v.
func strictJSON(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// getRule reads one rule; sql.ErrNoRows when there is none.
func getRule(ctx context.Context, d *DB, q queryer, id string) (limiter.Rule, error) {
	r, err := scanRuleFrom(q.QueryRowContext(ctx, `SELECT `+ruleColumns+` FROM rules WHERE id = $1`, id))
	return r, d.fail(ctx, err)
}

// ruleLimit checks that the limit of r exists (limiter.ErrUnknownLimit)
// and suits it (a *limiter.ValidationError naming "limit").
func (w *writeTx) ruleLimit(ctx context.Context, r limiter.Rule) error {
	l, err := getLimit(ctx, w.d, w.tx, r.Limit)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("rule of limit %q: %w", r.Limit, limiter.ErrUnknownLimit)
	case err != nil:
		return err
	}
	// The domain words why the limit does not suit the rule.
	if msg := rules.CheckLimit(r, l); msg != "" {
		return &limiter.ValidationError{Fields: []limiter.FieldError{{Field: "limit", Message: msg}}}
	}
	return nil
}

// CreateRule stores a new rule, which the caller has validated, and returns
// it with its ID and timestamps set. A rule of the same domain and pattern
// is limiter.ErrRuleExists; a limit that does not exist is
// limiter.ErrUnknownLimit, and one that cannot serve the rule a
// *limiter.ValidationError naming "limit".
func (d *DB) CreateRule(ctx context.Context, actor string, r limiter.Rule) (limiter.Rule, error) {
	err := d.write(ctx, actor, func(w *writeTx) error {
		var err error
		r, err = w.createRule(ctx, r)
		return err
	})
	if err != nil {
		return limiter.Rule{}, err
	}
	return r, nil
}

func (w *writeTx) createRule(ctx context.Context, r limiter.Rule) (limiter.Rule, error) {
	if err := w.ruleLimit(ctx, r); err != nil {
		return limiter.Rule{}, err
	}
	r.ID = w.d.ids.next(w.now)
	r.CreatedAt, r.UpdatedAt = w.now, w.now
	desc := descriptorJSON(r.Descriptor)
	err := w.exec(ctx, `
		INSERT INTO rules (id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9)`,
		r.ID, r.Domain, desc, descriptorHash(r.Descriptor), r.Limit, replacesJSON(r.Replaces), r.QuotaMode, w.now, w.actor)
	switch violated(err) {
	case rulesDomainDescriptorKey, rulesDomainDescriptorKeySQLite:
		return limiter.Rule{}, fmt.Errorf("domain %q, descriptor %s: %w", r.Domain, desc, limiter.ErrRuleExists)
	}
	if err != nil {
		return limiter.Rule{}, err
	}
	return r, w.audit(ctx, auditEntry{entity: entityRule, entityID: r.ID, action: limiter.ActionCreate,
		limitName: r.Limit, after: toRuleDoc(r)})
}

// deleteRule deletes the stored rule old, with its audit entry.
func (w *writeTx) deleteRule(ctx context.Context, old limiter.Rule) error {
	if err := w.exec(ctx, `DELETE FROM rules WHERE id = $1`, old.ID); err != nil {
		return err
	}
	return w.audit(ctx, auditEntry{entity: entityRule, entityID: old.ID, action: limiter.ActionDelete,
		limitName: old.Limit, before: toRuleDoc(old)})
}

// GetRule returns the rule with the id, or an error wrapping
// limiter.ErrRuleNotFound.
func (d *DB) GetRule(ctx context.Context, id string) (limiter.Rule, error) {
	r, err := getRule(ctx, d, d.reader, id)
	if errors.Is(err, sql.ErrNoRows) {
		return limiter.Rule{}, fmt.Errorf("rule %q: %w", id, limiter.ErrRuleNotFound)
	}
	return r, err
}

// ListRules returns the rules of domain, or of every domain when it is "",
// sorted by domain, then id (creation order). Rules are few, a few per
// route of a proxy, so there are no pages.
func (d *DB) ListRules(ctx context.Context, domain string) ([]limiter.Rule, error) {
	return collect(ctx, d, d.reader, scanRule, `
		SELECT `+ruleColumns+` FROM rules WHERE $1 = '' OR domain = $1
		ORDER BY domain, id`, domain)
}

// SetRuleLimit points the rule with the id at another limit, which must
// exist and suit it.
func (d *DB) SetRuleLimit(ctx context.Context, actor, id, limit string) (limiter.Rule, error) {
	var r limiter.Rule
	err := d.write(ctx, actor, func(w *writeTx) error {
		old, err := getRule(ctx, d, w.tx, id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("rule %q: %w", id, limiter.ErrRuleNotFound)
		}
		if err != nil {
			return err
		}
		r = old
		if limit == old.Limit {
			return nil
		}
		if slices.Contains(old.Replaces, limit) {
			return &limiter.ValidationError{Fields: []limiter.FieldError{{Field: "limit", Message: "is a limit the rule replaces: " + rules.SelfReplaced}}}
		}
		r.Limit, r.UpdatedAt = limit, w.now
		return w.setRuleLimit(ctx, old, limit)
	})
	if err != nil {
		return limiter.Rule{}, err
	}
	return r, nil
}

// setRuleLimit points the stored rule old at limit, which must exist and
// suit it.
func (w *writeTx) setRuleLimit(ctx context.Context, old limiter.Rule, limit string) error {
	r := old
	r.Limit, r.UpdatedAt = limit, w.now
	if err := w.ruleLimit(ctx, r); err != nil {
		return err
	}
	if err := w.exec(ctx, `UPDATE rules SET limit_name = $2, updated_at = $3, updated_by = $4 WHERE id = $1`,
		r.ID, limit, w.now, w.actor); err != nil {
		return err
	}
	return w.audit(ctx, auditEntry{entity: entityRule, entityID: r.ID, action: limiter.ActionUpdate,
		limitName: limit, before: toRuleDoc(old), after: toRuleDoc(r)})
}

// DeleteRule deletes the rule with the id.
func (d *DB) DeleteRule(ctx context.Context, actor, id string) error {
	return d.write(ctx, actor, func(w *writeTx) error {
		old, err := getRule(ctx, d, w.tx, id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("rule %q: %w", id, limiter.ErrRuleNotFound)
		}
		if err != nil {
			return err
		}
		return w.deleteRule(ctx, old)
	})
}

// limitHasRules reports whether rules use the limit, which keeps it from
// being deleted. The foreign key refuses too, but SQLite would not say
// which one.
func (w *writeTx) limitHasRules(ctx context.Context, name string) (bool, error) {
	var has bool
	err := w.queryRow(ctx, []any{&has}, `SELECT EXISTS (SELECT 1 FROM rules WHERE limit_name = $1)`, name)
	return has, err
}

// ruleChanges adds to c the rules written and deleted after version, read
// in the transaction of Since.
func ruleChanges(ctx context.Context, d *DB, tx *sql.Tx, version int64, c *limiter.Changes) error {
	var err error
	c.Rules, err = collect(ctx, d, tx, scanRule, `
		SELECT `+ruleColumns+` FROM rules
		WHERE id IN (SELECT entity_id FROM audit WHERE seq > $1 AND entity = 'rule')
		ORDER BY id`, version)
	if err != nil {
		return err
	}
	c.DeletedRules, err = collect(ctx, d, tx, func(rows *sql.Rows) (string, error) {
		var id string
		err := rows.Scan(&id)
		return id, err
	}, `
		SELECT DISTINCT a.entity_id FROM audit a
		WHERE a.seq > $1 AND a.entity = 'rule'
			AND NOT EXISTS (SELECT 1 FROM rules r WHERE r.id = a.entity_id)
		ORDER BY a.entity_id`, version)
	return err
}
