// Package loader keeps the Limiter's snapshot of limits, overrides and rules in
// step with the database, so that decisions never touch SQL. It loads
// everything at start, applies the changes the database announces, and
// reloads everything every sync interval; when the database fails,
// decisions go on from the last good snapshot while the loader retries. A
// row this version cannot use never stops a load: it is left out, with
// the rows that depend on it, and reported (Status.LeftOut, the log).
package loader

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Source is the database as the loader reads it.
type Source interface {
	// Full reads every limit, then every enabled override, in one
	// consistent read, and returns the change sequence number it includes.
	Full(ctx context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error)
	// Since returns what changed after a sequence number.
	Since(ctx context.Context, version int64) (limiter.Changes, error)
	// Watch calls changed whenever a change may have been committed, until
	// ctx ends or it fails.
	Watch(ctx context.Context, changed func()) error
	// ListRules returns every rule when domain is "".
	ListRules(ctx context.Context, domain string) ([]limiter.Rule, error)
}

// Target receives each new snapshot; *limiter.Limiter is one.
type Target interface {
	SetSnapshot(*limiter.Snapshot)
}

// Config configures a Loader.
type Config struct {
	Source Source
	Target Target
	// SyncInterval is the period of full reloads, which repair anything a
	// lost notification missed; 30s when zero.
	SyncInterval time.Duration
	// MaxBackoff bounds the wait between retries after a failure, and so
	// how long after the database returns the snapshot catches up; 1s when
	// zero.
	MaxBackoff time.Duration
	// Tokens rereads the tokens, which are no part of a snapshot: on
	// every full load, and whenever the changes say a token changed, so
	// that a revocation reaches every replica as fast as a limit does.
	// Nil when nothing keeps tokens.
	Tokens func(context.Context) error
	// Now reads the clock; time.Now when nil.
	Now    func() time.Time
	Logger *slog.Logger
}

// Bounds of one read, so that a database that stops answering in the
// middle of a read is noticed and retried: a full read of a million
// overrides takes about two seconds.
const (
	fullTimeout  = 2 * time.Minute
	sinceTimeout = 10 * time.Second
)

// Status describes the snapshot in use.
type Status struct {
	// Loaded is false until the first full load succeeds.
	Loaded bool
	// Version is the database change sequence number the snapshot includes.
	Version int64
	// SyncedAt is when the loader last confirmed the snapshot against the
	// database, by a full load or by reading the changes.
	SyncedAt time.Time
	// Limits and Overrides count what the snapshot holds.
	Limits    int
	Overrides int
	// Err is the last failure since the last success, nil when in step.
	Err error
	// LeftOut are the stored rows the snapshot lacks, and why.
	LeftOut []limiter.LeftOut
}

// Loader keeps a Target's snapshot current. Run it once.
type Loader struct {
	cfg    Config
	notify chan struct{}
	// syncs carries the replies awaited by Sync.
	syncs chan chan error

	mu     sync.Mutex
	status Status
	snap   *limiter.Snapshot
	// loaded is closed after the first full load.
	loaded chan struct{}
}

// New returns a Loader; nothing happens until Run.
func New(cfg Config) *Loader {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 30 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Loader{cfg: cfg, notify: make(chan struct{}, 1), syncs: make(chan chan error), loaded: make(chan struct{})}
}

// Status returns the state of the snapshot.
func (l *Loader) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status
}

// Loaded is closed once the first snapshot is in place.
func (l *Loader) Loaded() <-chan struct{} { return l.loaded }

// Sync reads the changes now and returns when the snapshot holds every
// change committed before the call. A writer calls it after its commit, so
// that its client's next decision, on this process, sees the write.
func (l *Loader) Sync(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case l.syncs <- reply:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// changed asks for the changes to be read now.
func (l *Loader) changed() {
	select {
	case l.notify <- struct{}{}:
	default: // a reload is already pending and will see this change too
	}
}

// Run loads, then follows the database until ctx ends. It returns nil when
// ctx ends; failures are retried, never returned.
func (l *Loader) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.watch(ctx)
	}()
	defer wg.Wait()

	backoff := newBackoff(l.cfg.MaxBackoff)
	for ctx.Err() == nil {
		if err := l.full(ctx); err != nil {
			l.failed(ctx, "full load", err)
			sleep(ctx, backoff.next())
			continue
		}
		break
	}
	backoff.reset()
	full := time.NewTicker(l.cfg.SyncInterval)
	defer full.Stop()
	var retry <-chan time.Time
	for {
		var err error
		var what string
		select {
		case <-ctx.Done():
			return nil
		case <-full.C:
			what, err = "full load", l.full(ctx)
		case <-l.notify:
			what, err = "incremental load", l.since(ctx)
		case <-retry:
			what, err = "incremental load", l.since(ctx)
		case reply := <-l.syncs:
			// One read answers every Sync waiting now: each was asked
			// before the read began.
			replies := []chan error{reply}
		drain:
			for {
				select {
				case r := <-l.syncs:
					replies = append(replies, r)
				default:
					break drain
				}
			}
			what, err = "incremental load", l.since(ctx)
			for _, r := range replies {
				r <- err
			}
		}
		retry = nil
		if err != nil {
			l.failed(ctx, what, err)
			retry = time.After(backoff.next())
			continue
		}
		backoff.reset()
	}
}

// watch keeps a notification channel open, reconnecting with backoff, and
// asks for the changes after every reconnection, since notifications sent
// while it was away are lost.
func (l *Loader) watch(ctx context.Context) {
	backoff := newBackoff(l.cfg.MaxBackoff)
	for {
		start := l.cfg.Now()
		err := l.cfg.Source.Watch(ctx, l.changed)
		if ctx.Err() != nil {
			return
		}
		l.cfg.Logger.Warn("change notifications interrupted", "err", err)
		if l.cfg.Now().Sub(start) > l.cfg.MaxBackoff {
			backoff.reset()
		}
		sleep(ctx, backoff.next())
		l.changed()
	}
}

func (l *Loader) full(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, fullTimeout)
	defer cancel()
	now := l.cfg.Now()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	// A row refused is left out, and recorded as such by the builder.
	version, err := l.cfg.Source.Full(ctx, func(lim limiter.Limit) error {
		_ = b.PutLimit(lim)
		return nil
	}, func(o limiter.Override) error {
		if o.ExpiresAt.IsZero() || now.Before(o.ExpiresAt) { // else expired: never applies again
			_ = b.PutOverride(o)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := l.putRules(ctx, b); err != nil {
		return err
	}
	if err := l.rereadTokens(ctx, true); err != nil {
		return err
	}
	l.publish(b.Snapshot(version), now)
	select {
	case <-l.loaded:
	default:
		close(l.loaded)
	}
	return nil
}

// putRules adds every rule to a full load. They are read after the limits
// and overrides, in a read of their own, so they may be newer than the
// snapshot's version: a rule of a limit the snapshot lacks is left out,
// and the changes after that version, which a write after the full read
// began always announces, bring the limit and its rule. Reading a rule
// twice, or the deletion of one never read, is harmless. A rule refused
// is recorded as left out by the builder.
func (l *Loader) putRules(ctx context.Context, b *limiter.Builder) error {
	rules, err := l.cfg.Source.ListRules(ctx, "")
	if err != nil {
		return err
	}
	for _, r := range rules {
		_ = b.PutRule(r)
	}
	return nil
}

// rereadTokens calls Config.Tokens when changed. A failure fails the load,
// which is retried: the tokens read last stay in force meanwhile.
func (l *Loader) rereadTokens(ctx context.Context, changed bool) error {
	if !changed || l.cfg.Tokens == nil {
		return nil
	}
	return l.cfg.Tokens(ctx)
}

func (l *Loader) since(ctx context.Context) error {
	l.mu.Lock()
	snap := l.snap
	l.mu.Unlock()
	if snap == nil {
		return nil // the first full load will see everything
	}
	now := l.cfg.Now()
	sctx, cancel := context.WithTimeout(ctx, sinceTimeout)
	defer cancel()
	ch, err := l.cfg.Source.Since(sctx, snap.Version())
	if err != nil {
		return err
	}
	if ch.Version < snap.Version() {
		// The database went back, restored from a backup: what it holds
		// now is no change of this snapshot, so it is read whole.
		l.cfg.Logger.Warn("the database went back; loading it whole", "from", snap.Version(), "to", ch.Version)
		return l.full(ctx)
	}
	if err := l.rereadTokens(ctx, ch.Tokens); err != nil {
		return err
	}
	if ch.Version > snap.Version() {
		b := snap.Builder()
		if b.Apply(ch) {
			// A limit is left out, or comes back: what its overrides and
			// rules are is the full load's to find.
			return l.full(ctx)
		}
		snap = b.Snapshot(ch.Version)
	}
	l.publish(snap, now)
	return nil
}

// publish hands a snapshot to the target and records that the loader is
// in step at now.
func (l *Loader) publish(s *limiter.Snapshot, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	leftOut := s.LeftOut()
	if l.snap != s {
		l.logLeftOut(l.status.LeftOut, leftOut)
		l.cfg.Target.SetSnapshot(s)
		l.snap = s
	}
	if l.status.Err != nil {
		l.cfg.Logger.Info("snapshot in step with the database again", "version", s.Version())
	}
	l.status = Status{Loaded: true, Version: s.Version(), SyncedAt: now, Limits: len(s.Limits()), Overrides: s.Overrides(),
		LeftOut: leftOut}
}

// logLeftOut logs each row that the new snapshot leaves out and the one
// before did not, or for another reason, and each that it holds again:
// once per row and change, not on every load.
func (l *Loader) logLeftOut(before, after []limiter.LeftOut) {
	was := make(map[[2]string]string, len(before))
	for _, r := range before {
		was[[2]string{r.Entity, r.ID}] = r.Reason
	}
	for _, r := range after {
		key := [2]string{r.Entity, r.ID}
		if reason, ok := was[key]; !ok || reason != r.Reason {
			l.cfg.Logger.Warn("a stored row is left out of the snapshot; the rest is in force",
				"entity", r.Entity, "id", r.ID, "limit", r.Limit, "reason", r.Reason)
		}
		delete(was, key)
	}
	for key := range was {
		l.cfg.Logger.Info("a stored row left out is in force again, or gone", "entity", key[0], "id", key[1])
	}
}

func (l *Loader) failed(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	first := l.status.Err == nil
	l.status.Err = err
	l.mu.Unlock()
	if first || !errors.Is(err, limiter.ErrUnavailable) {
		l.cfg.Logger.Warn(what+" failed; decisions go on from the last snapshot", "err", err)
	}
}

// backoff doubles from 50 ms up to a bound.
type backoff struct {
	cur, max time.Duration
}

func newBackoff(limit time.Duration) *backoff { return &backoff{max: limit} }

func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, 50*time.Millisecond), b.max)
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
