package db

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// snapshotOf builds a snapshot the way the loader does.
func snapshotOf(t *testing.T, e *env) (*limiter.Builder, int64) {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	v, err := e.db.Full(ctxT(t), b.PutLimit, b.PutOverride)
	if err != nil {
		t.Fatalf("Full: %v", err)
	}
	return b, v
}

func TestFull(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		var limits []limiter.Limit
		var overrides []limiter.Override
		v, err := e.db.Full(ctx, func(l limiter.Limit) error { limits = append(limits, l); return nil },
			func(o limiter.Override) error { overrides = append(overrides, o); return nil })
		if err != nil || v != 0 || len(limits)+len(overrides) != 0 {
			t.Fatalf("Full of an empty database = %d, %v, %v, %v", v, limits, overrides, err)
		}

		l := e.putLimit(t, limitOf("L", limiter.RegID))
		on := e.createOverride(t, overrideOf("L", "1"))
		off := overrideOf("L", "2")
		off.Enabled = false
		e.createOverride(t, off)
		_, hash := auth.NewSecret()
		if _, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "t", Scope: auth.Admin, Hash: hash}); err != nil {
			t.Fatal(err)
		}

		v, err = e.db.Full(ctx, func(l limiter.Limit) error { limits = append(limits, l); return nil },
			func(o limiter.Override) error { overrides = append(overrides, o); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if v != e.version(t) || v < 4 {
			t.Errorf("Full version = %d, current %d", v, e.version(t))
		}
		if len(limits) != 1 || limits[0] != l || len(overrides) != 1 || overrides[0] != on {
			t.Errorf("Full = %+v, %+v", limits, overrides)
		}

		stop := errors.New("stop")
		_, err = e.db.Full(ctx, func(limiter.Limit) error { return nil }, func(limiter.Override) error { return stop })
		if err != stop {
			t.Errorf("a callback's error came back as %v", err)
		}
	})
}

func TestSince(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		v := e.version(t)
		// next checks that exactly want changed after v, and moves v on.
		next := func(step string, want limiter.Changes) {
			t.Helper()
			c, err := e.db.Since(ctx, v)
			if err != nil {
				t.Fatalf("%s: Since: %v", step, err)
			}
			if c.Version <= v {
				t.Errorf("%s: version %d did not increase from %d", step, c.Version, v)
			}
			want.Version = c.Version
			if fmt.Sprintf("%+v", c) != fmt.Sprintf("%+v", want) {
				t.Errorf("%s: Since =\n%+v\nwant\n%+v", step, c, want)
			}
			v = c.Version
		}

		l := e.putLimit(t, limitOf("L", limiter.RegID))
		next("create limit", limiter.Changes{Limits: []limiter.Limit{l}})
		e.clock.Advance(time.Second)
		l.Burst, l.Enum = 42, 0
		l = e.putLimit(t, l)
		next("update limit", limiter.Changes{Limits: []limiter.Limit{l}})

		o := e.createOverride(t, overrideOf("L", "1"))
		next("create override", limiter.Changes{Overrides: []limiter.Override{o}})
		o, err := e.db.UpdateOverride(ctx, "bob", o.ID, func(n *limiter.Override, _ limiter.Limit) error { n.Enabled = false; return nil })
		if err != nil {
			t.Fatal(err)
		}
		next("disable override", limiter.Changes{Overrides: []limiter.Override{o}})
		if err := e.db.DeleteOverride(ctx, "bob", o.ID); err != nil {
			t.Fatal(err)
		}
		next("delete override", limiter.Changes{DeletedOverrides: []limiter.Override{{ID: o.ID, Limit: "L", BucketID: "1"}}})

		_, hash := auth.NewSecret()
		tok, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "t", Scope: auth.Admin, Hash: hash})
		if err != nil {
			t.Fatal(err)
		}
		next("create token", limiter.Changes{Tokens: true})
		if err := e.db.RevokeToken(ctx, "ops", tok.ID); err != nil {
			t.Fatal(err)
		}
		next("revoke token", limiter.Changes{Tokens: true})

		if err := e.db.DeleteLimit(ctx, "alice", "L"); err != nil {
			t.Fatal(err)
		}
		next("delete limit", limiter.Changes{DeletedLimits: []string{"L"}})

		// Nothing new: the same version, no changes.
		if c, err := e.db.Since(ctx, v); err != nil || c.Version != v || !c.Empty() {
			t.Errorf("Since with nothing new = %+v, %v", c, err)
		}
	})
}

func TestSinceRecreatedOverride(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		old := e.createOverride(t, overrideOf("L", "5"))
		b, v := snapshotOf(t, e)

		// Deleted, created again with other parameters, changed, all
		// between two reads of the loader.
		if err := e.db.DeleteOverride(ctx, "bob", old.ID); err != nil {
			t.Fatal(err)
		}
		again := overrideOf("L", "5")
		again.Burst = 3
		again = e.createOverride(t, again)
		again, err := e.db.UpdateOverride(ctx, "bob", again.ID, func(n *limiter.Override, _ limiter.Limit) error { n.Burst = 4; return nil })
		if err != nil {
			t.Fatal(err)
		}
		c, err := e.db.Since(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Overrides) != 1 || c.Overrides[0] != again || len(c.DeletedOverrides) != 1 || c.DeletedOverrides[0].ID != old.ID {
			t.Fatalf("Since = %+v", c)
		}
		if b.Apply(c) {
			t.Fatal("changes of usable rows need a full load")
		}
		r, err := b.Snapshot(c.Version).Resolve("L", "5", epoch())
		if err != nil || r.Source != limiter.SourceOverride || r.Params.Burst != 4 {
			t.Errorf("after applying: %+v, %v", r, err)
		}

		// A deleted and recreated limit comes out as the current limit.
		e.clock.Advance(time.Second)
		if err := e.db.DeleteOverride(ctx, "bob", again.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.db.DeleteLimit(ctx, "alice", "L"); err != nil {
			t.Fatal(err)
		}
		l := e.putLimit(t, limitOf("L", limiter.String))
		c, err = e.db.Since(ctx, c.Version)
		if err != nil || len(c.Limits) != 1 || c.Limits[0] != l || len(c.DeletedLimits) != 0 || len(c.DeletedOverrides) != 1 {
			t.Errorf("Since after recreating the limit = %+v, %v", c, err)
		}
		if b.Apply(c) {
			t.Fatal("changes of usable rows need a full load")
		}
	})
}

// TestSinceNeverSkipsConcurrentWrites follows the change log the way the
// loader does while several writers commit: a change whose sequence number
// committed after a higher one would be skipped for good.
func TestSinceNeverSkipsConcurrentWrites(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		const writers, each = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					if _, err := e.db.CreateOverride(ctx, "bob", overrideOf("L", fmt.Sprint(w*1000+i+1))); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()

		seen := map[string]bool{}
		var v int64
		follow := func() {
			c, err := e.db.Since(ctx, v)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range c.Overrides {
				seen[o.ID] = true
			}
			v = c.Version
		}
		for finished := false; !finished; {
			select {
			case <-done:
				finished = true
			default:
			}
			follow()
		}
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		follow()
		if len(seen) != writers*each {
			t.Errorf("followed %d overrides, want %d", len(seen), writers*each)
		}
	})
}

// watcher runs Watch and counts calls of changed.
type watcher struct {
	calls chan struct{}
	err   chan error
}

func startWatch(ctx context.Context, t *testing.T, d *DB) *watcher {
	w := &watcher{calls: make(chan struct{}, 100), err: make(chan error, 1)}
	go func() {
		w.err <- d.Watch(ctx, func() { w.calls <- struct{}{} })
	}()
	w.wait(t, "the first call", 10*time.Second)
	return w
}

func (w *watcher) wait(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.calls:
	case err := <-w.err:
		t.Fatalf("waiting for %s: Watch returned %v", what, err)
	case <-time.After(timeout):
		t.Fatalf("no call of changed for %s within %v", what, timeout)
	}
}

func TestWatch(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(ctxT(t))
		w := startWatch(ctx, t, e.db)

		writer := e.db
		if e.engine == "postgres" {
			// Another process's change, through another DB.
			writer = openMigrated(t, e.url, nil)
		}
		if _, _, err := writer.PutLimit(ctx, "alice", limitOf("L", limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "a committed change", time.Second)

		// A write that fails or changes nothing commits nothing; a dry run
		// neither. The next call must come from the next real write.
		_, _, _ = writer.PutLimit(ctx, "alice", limitOf("L", limiter.RegID))
		_, _ = writer.Import(ctx, "alice", []limiter.Limit{limitOf("M", limiter.RegID)}, nil, true)
		if _, err := writer.CreateOverride(ctx, "bob", overrideOf("L", "1")); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "the second change", time.Second)
		select {
		case <-w.calls:
			t.Error("changed called more often than changes were committed")
		case <-time.After(100 * time.Millisecond):
		}

		// Another process's change to the same database: on SQLite the
		// command line's, found by the watch's poll of the change log.
		other := openMigrated(t, e.url, nil)
		if _, _, err := other.PutLimit(ctx, "cli", limitOf("N", limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "another process's change", 3*time.Second)

		cancel()
		if err := <-w.err; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch after cancel = %v, want context.Canceled", err)
		}
	})
}

// TestWatchSurvivesHealthChecks makes Watch check its idle connection
// every millisecond: the checks must neither end the watch nor lose a
// notification.
func TestWatchSurvivesHealthChecks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "postgres")
	e.db.be.(*postgres).healthInterval = time.Millisecond
	w := startWatch(ctxT(t), t, e.db)
	for i := range 3 {
		if _, _, err := e.db.PutLimit(ctxT(t), "alice", limitOf(fmt.Sprint("L", i), limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "a change", time.Second)
	}
}

func TestWatchEndsAtClose(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		d := openMigrated(t, e.url, nil)
		w := startWatch(ctxT(t), t, d)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-w.err:
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Watch after Close = %v, want ErrUnavailable", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Watch did not end at Close")
		}
		if err := d.Watch(ctxT(t), func() {}); !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Watch on a closed DB = %v", err)
		}
	})
}
