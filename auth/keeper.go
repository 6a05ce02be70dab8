package auth

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// refreshTimeout bounds one read of the tokens, so that a database that
// stops answering cannot hold up the refreshes after it.
const refreshTimeout = 5 * time.Second

// Keeper holds the current Set and rereads it from the database when the
// loader says the tokens changed (and on every full load), so that
// requests are authenticated from memory, keep working from the last good
// set while the database is down, and see a revocation as fast as a
// change of a limit.
type Keeper struct {
	list      func(context.Context) ([]Token, error)
	bootstrap string
	log       *slog.Logger

	set    atomic.Pointer[Set]
	loaded atomic.Bool
	// mu serialises refreshes, so that an older read never replaces a
	// newer one.
	mu     sync.Mutex
	failed bool
}

// NewKeeper returns a Keeper that reads tokens with list on each Refresh.
// Until the first read, only the bootstrap secret (if any) works.
func NewKeeper(list func(context.Context) ([]Token, error), bootstrap string, log *slog.Logger) *Keeper {
	k := &Keeper{list: list, bootstrap: bootstrap, log: log}
	k.set.Store(NewSet(nil, bootstrap))
	return k
}

// Authenticate returns the principal of a secret.
func (k *Keeper) Authenticate(secret string) (Principal, bool) {
	return k.set.Load().Authenticate(secret)
}

// Loaded reports whether the tokens have been read at least once.
func (k *Keeper) Loaded() bool { return k.loaded.Load() }

// Refresh reads the tokens now.
func (k *Keeper) Refresh(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	tokens, err := k.list(ctx)
	if err != nil {
		if !k.failed {
			k.log.Warn("reading tokens failed; the last known tokens stay in force", "err", err)
		}
		k.failed = true
		return err
	}
	k.failed = false
	k.set.Store(NewSet(tokens, k.bootstrap))
	k.loaded.Store(true)
	return nil
}
