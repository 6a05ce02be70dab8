package db

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// The entities of audit entries.
const (
	entityLimit    = "limit"
	entityOverride = "override"
	entityToken    = "token"
)

// auditEntry is one change as the audit table records it. before and after
// are the JSON documents of the row, nil for a creation and a deletion.
type auditEntry struct {
	entity    string
	entityID  string
	action    string
	limitName string
	bucketID  string
	before    any
	after     any
}

// audit records e, stamped with the transaction's time and actor.
func (w *writeTx) audit(ctx context.Context, e auditEntry) error {
	before, err := jsonDoc(e.before)
	if err != nil {
		return err
	}
	after, err := jsonDoc(e.after)
	if err != nil {
		return err
	}
	var seq int64
	err = w.queryRow(ctx, []any{&seq}, `
		INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, bucket_id, before, after)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		RETURNING seq`,
		w.now, w.actor, e.entity, e.entityID, e.action, nullString(e.limitName), nullString(e.bucketID), before, after)
	if err != nil {
		return fmt.Errorf("database: writing the audit entry: %w", err)
	}
	w.seq = max(w.seq, seq)
	return nil
}

// jsonDoc encodes a row's document for a jsonb (Postgres) or TEXT (SQLite)
// column, NULL for none.
func jsonDoc(v any) (sql.NullString, error) {
	if v == nil {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("database: encoding an audit document: %w", err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// overrideDoc is an override in audit entries, in the shape of the REST
// API's override so that history reads like the API. Burst, count and
// period are null when the override is unlimited, as in the table, and
// period is null too for an override of a calendar quota, which has none.
type overrideDoc struct {
	ID        string     `json:"id"`
	Limit     string     `json:"limit"`
	BucketID  string     `json:"bucket_id"`
	Burst     *int64     `json:"burst"`
	Count     *int64     `json:"count"`
	Period    *string    `json:"period"`
	Unlimited bool       `json:"unlimited"`
	Comment   string     `json:"comment"`
	Enabled   bool       `json:"enabled"`
	ExpiresAt *time.Time `json:"expires_at"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	UpdatedBy string     `json:"updated_by"`
	Version   int64      `json:"version"`
}

func toOverrideDoc(o limiter.Override) *overrideDoc {
	d := &overrideDoc{
		ID: o.ID, Limit: o.Limit, BucketID: o.BucketID, Unlimited: o.Unlimited, Comment: o.Comment,
		Enabled: o.Enabled, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, UpdatedBy: o.UpdatedBy, Version: o.Version,
	}
	if !o.Unlimited {
		d.Burst, d.Count = &o.Burst, &o.Count
	}
	if !o.Unlimited && o.Period != 0 {
		period := o.Period.String()
		d.Period = &period
	}
	if !o.ExpiresAt.IsZero() {
		d.ExpiresAt = &o.ExpiresAt
	}
	return d
}

func (d *overrideDoc) override() (*limiter.Override, error) {
	o := &limiter.Override{
		ID: d.ID, Limit: d.Limit, BucketID: d.BucketID, Unlimited: d.Unlimited, Comment: d.Comment,
		Enabled: d.Enabled, CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC(), UpdatedBy: d.UpdatedBy, Version: d.Version,
	}
	if d.Burst != nil {
		o.Burst = *d.Burst
	}
	if d.Count != nil {
		o.Count = *d.Count
	}
	if d.Period != nil {
		p, err := time.ParseDuration(*d.Period)
		if err != nil {
			return nil, fmt.Errorf("database: override %q in the audit: %w", d.ID, err)
		}
		o.Period = p
	}
	if d.ExpiresAt != nil {
		o.ExpiresAt = d.ExpiresAt.UTC()
	}
	return o, nil
}

// limitDoc is a limit in audit entries, in the shape of the REST API's,
// with the generation, which says when its buckets got new keys. Period
// is null for a calendar quota, calendar and time_zone for any other
// limit.
type limitDoc struct {
	Name        string    `json:"name"`
	Enum        int       `json:"enum"`
	Generation  int       `json:"generation"`
	IDFormat    string    `json:"id_format"`
	Kind        string    `json:"kind"`
	Calendar    *string   `json:"calendar"`
	TimeZone    *string   `json:"time_zone"`
	Burst       int64     `json:"burst"`
	Count       int64     `json:"count"`
	Period      *string   `json:"period"`
	Description string    `json:"description"`
	Unit        string    `json:"unit"`
	Shadow      bool      `json:"shadow"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

func toLimitDoc(l limiter.Limit) *limitDoc {
	d := &limitDoc{
		Name: l.Name, Enum: l.Enum, Generation: l.Generation, IDFormat: string(l.IDFormat), Kind: string(l.KindOf()),
		Burst: l.Burst, Count: l.Count, Description: l.Description, Unit: l.Unit, Shadow: l.Shadow,
		CreatedAt: l.CreatedAt, UpdatedAt: l.UpdatedAt,
	}
	if l.Quota() {
		calendar, zone := string(l.Calendar), l.TimeZone
		d.Calendar, d.TimeZone = &calendar, &zone
	} else {
		period := l.Period.String()
		d.Period = &period
	}
	return d
}

// tokenDoc is a token in audit entries: never its hash, which would let
// anyone who reads the history test guesses offline.
type tokenDoc struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Scope     string     `json:"scope"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func toTokenDoc(t auth.Token) *tokenDoc {
	d := &tokenDoc{ID: t.ID, Name: t.Name, Scope: string(t.Scope), CreatedAt: t.CreatedAt}
	if !t.RevokedAt.IsZero() {
		d.RevokedAt = &t.RevokedAt
	}
	return d
}
