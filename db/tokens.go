package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// tokensLiveNameKey is the unique index on the names of live tokens.
const tokensLiveNameKey = "tokens_live_name_key"

// tokenRow is a row of the tokens table.
type tokenRow struct {
	ID        string
	Name      string
	Scope     string
	Hash      string
	CreatedAt time.Time
	RevokedAt sql.NullTime
}

const tokenColumns = `id, name, scope, hash, created_at, revoked_at`

func (r *tokenRow) dest() []any {
	return []any{&r.ID, &r.Name, &r.Scope, &r.Hash, &r.CreatedAt, &r.RevokedAt}
}

func (r *tokenRow) token() auth.Token {
	return auth.Token{ID: r.ID, Name: r.Name, Scope: auth.Scope(r.Scope), Hash: r.Hash,
		CreatedAt: r.CreatedAt.UTC(), RevokedAt: timeOf(r.RevokedAt)}
}

func scanToken(rows *sql.Rows) (auth.Token, error) {
	var r tokenRow
	err := rows.Scan(r.dest()...)
	return r.token(), err
}

// CreateToken stores t, whose Hash the caller has computed, and returns it
// with its ID and CreatedAt set. The secret itself never reaches this
// package, and the hash stays out of the audit entry.
func (d *DB) CreateToken(ctx context.Context, actor string, t auth.Token) (auth.Token, error) {
	err := d.write(ctx, actor, func(w *writeTx) error { return w.createToken(ctx, &t) })
	if err != nil {
		return auth.Token{}, err
	}
	return t, nil
}

// CreateFirstToken creates t only when the database holds no token at all,
// revoked ones included, and reports whether it did. Writers are
// serialised (see lockWrites), so of several processes starting at once on
// an empty database exactly one creates its token.
func (d *DB) CreateFirstToken(ctx context.Context, actor string, t auth.Token) (auth.Token, bool, error) {
	// The usual answer, a token exists, needs no write lock, which a long
	// import may hold for longer than a writer waits.
	var exists bool
	if err := d.fail(ctx, d.reader.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM tokens)`).Scan(&exists)); err != nil || exists {
		return auth.Token{}, false, err
	}
	created := false
	err := d.write(ctx, actor, func(w *writeTx) error {
		var exists bool
		if err := w.queryRow(ctx, []any{&exists}, `SELECT EXISTS (SELECT 1 FROM tokens)`); err != nil || exists {
			return err
		}
		created = true
		return w.createToken(ctx, &t)
	})
	if err != nil || !created {
		return auth.Token{}, false, err
	}
	return t, true, nil
}

// createToken inserts t, with a new ID and the transaction's time, and its
// audit entry.
func (w *writeTx) createToken(ctx context.Context, t *auth.Token) error {
	t.ID, t.CreatedAt, t.RevokedAt = w.d.ids.next(w.now), w.now, time.Time{}
	err := w.exec(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, NULL)`,
		t.ID, t.Name, string(t.Scope), t.Hash, t.CreatedAt)
	switch violated(err) {
	case tokensHashKey:
		return fmt.Errorf("a token has the same secret: %w", limiter.ErrTokenExists)
	case tokensLiveNameKey:
		return fmt.Errorf("token %q: %w", t.Name, limiter.ErrTokenExists)
	}
	if err != nil {
		return err
	}
	return w.audit(ctx, auditEntry{entity: entityToken, entityID: t.ID, action: limiter.ActionCreate, after: toTokenDoc(*t)})
}

// GetToken returns the token with the id, revoked or not.
func (d *DB) GetToken(ctx context.Context, id string) (auth.Token, error) {
	var r tokenRow
	err := d.fail(ctx, d.reader.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = $1`, id).Scan(r.dest()...))
	if errors.Is(err, sql.ErrNoRows) {
		return auth.Token{}, fmt.Errorf("token %q: %w", id, limiter.ErrTokenNotFound)
	}
	return r.token(), err
}

// ListTokens returns every token, revoked ones included, oldest first.
func (d *DB) ListTokens(ctx context.Context) ([]auth.Token, error) {
	return collect(ctx, d, d.reader, scanToken, `SELECT `+tokenColumns+` FROM tokens ORDER BY created_at, id`)
}

// RevokeToken stops the token with the id from working. A token that is
// unknown or already revoked is not found, so that revoking twice does not
// move the revocation time.
func (d *DB) RevokeToken(ctx context.Context, actor, id string) error {
	return d.write(ctx, actor, func(w *writeTx) error {
		var r tokenRow
		err := w.queryRow(ctx, r.dest(), `SELECT `+tokenColumns+` FROM tokens WHERE id = $1 AND revoked_at IS NULL`, id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("token %q: %w", id, limiter.ErrTokenNotFound)
		}
		if err != nil {
			return err
		}
		old := r.token()
		t := old
		t.RevokedAt = w.now
		if err := w.exec(ctx, `UPDATE tokens SET revoked_at = $2 WHERE id = $1`, id, t.RevokedAt); err != nil {
			return err
		}
		return w.audit(ctx, auditEntry{entity: entityToken, entityID: id, action: limiter.ActionUpdate,
			before: toTokenDoc(old), after: toTokenDoc(t)})
	})
}
