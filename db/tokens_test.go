package db

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestFirstTokenOnce: processes starting together on an empty database
// each try to create the first token; exactly one does.
func TestFirstTokenOnce(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		const processes = 6
		handles := make([]*DB, processes)
		for i := range handles {
			handles[i] = openMigrated(t, e.url, nil)
		}
		var wg sync.WaitGroup
		var created atomic.Int32
		for i, d := range handles {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, hash := auth.NewSecret()
				_, ok, err := d.CreateFirstToken(ctx, "ratelimitd", auth.Token{Name: fmt.Sprintf("first-%d", i), Scope: auth.Admin, Hash: hash})
				if err != nil {
					t.Error(err)
				}
				if ok {
					created.Add(1)
				}
			}()
		}
		wg.Wait()
		tokens, err := e.db.ListTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if created.Load() != 1 || len(tokens) != 1 {
			t.Fatalf("%d processes said they created the first token; the database holds %d", created.Load(), len(tokens))
		}
		if err := e.db.RevokeToken(ctx, "ops", tokens[0].ID); err != nil {
			t.Fatal(err)
		}
		_, hash := auth.NewSecret()
		if _, ok, err := e.db.CreateFirstToken(ctx, "ratelimitd", auth.Token{Name: "late", Scope: auth.Admin, Hash: hash}); err != nil || ok {
			t.Errorf("with a revoked token in the database, CreateFirstToken = %v, %v; want no token created", ok, err)
		}
	})
}

func TestTokens(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		_, hash := auth.NewSecret()
		a, err := e.db.CreateToken(ctx, "bootstrap", auth.Token{Name: "ops", Scope: auth.Admin, Hash: hash})
		if err != nil {
			t.Fatal(err)
		}
		if !validID(a.ID) || !a.CreatedAt.Equal(epoch().Truncate(time.Microsecond)) || !a.RevokedAt.IsZero() || a.Hash != hash {
			t.Errorf("CreateToken = %+v", a)
		}
		e.clock.Advance(time.Second)
		_, hash2 := auth.NewSecret()
		b, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "decider", Scope: auth.Decide, Hash: hash2})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.db.CreateToken(ctx, "ops", auth.Token{Name: "copy", Scope: auth.Decide, Hash: hash2})
		wantError(t, err, limiter.ErrTokenExists)

		e.clock.Advance(time.Second)
		if err := e.db.RevokeToken(ctx, "ops", a.ID); err != nil {
			t.Fatal(err)
		}
		wantError(t, e.db.RevokeToken(ctx, "ops", a.ID), limiter.ErrTokenNotFound)
		wantError(t, e.db.RevokeToken(ctx, "ops", "nope"), limiter.ErrTokenNotFound)

		list, err := e.db.ListTokens(ctx)
		if err != nil || len(list) != 2 {
			t.Fatalf("ListTokens = %+v, %v", list, err)
		}
		a.RevokedAt = e.clock.Now().Truncate(time.Microsecond)
		if list[0] != a || list[1] != b {
			t.Errorf("ListTokens = %+v, want %+v then %+v", list, a, b)
		}

		// Token changes are audited, without the hashes.
		var n int
		err = e.db.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit WHERE entity = 'token'`).Scan(&n)
		if err != nil || n != 3 {
			t.Errorf("%d token audit entries, %v; want 3", n, err)
		}
		var leaks int
		err = e.db.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit WHERE CAST(after AS TEXT) LIKE $1 OR CAST(before AS TEXT) LIKE $1`,
			"%"+hash[:16]+"%").Scan(&leaks)
		if err != nil || leaks != 0 {
			t.Errorf("%d audit entries hold a token hash, %v", leaks, err)
		}
	})
}
