package loader_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/loader"
)

// fakeSource is a database in memory with a change log.
type fakeSource struct {
	mu        sync.Mutex
	version   int64
	limits    map[string]limiter.Limit
	overrides map[string]limiter.Override // by bucket id
	log       []limiter.Changes
	fail      bool
	notify    chan struct{}
	fulls     atomic.Int64
	// rereads counts the loader's calls of Config.Tokens.
	rereads atomic.Int64
}

var errDown = errors.New("database down")

func newSource() *fakeSource {
	return &fakeSource{
		limits:    map[string]limiter.Limit{},
		overrides: map[string]limiter.Override{},
		notify:    make(chan struct{}, 16),
	}
}

func (s *fakeSource) Full(_ context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fulls.Add(1)
	if s.fail {
		return 0, errDown
	}
	for _, l := range s.limits {
		if err := onLimit(l); err != nil {
			return 0, err
		}
	}
	for _, o := range s.overrides {
		if err := onOverride(o); err != nil {
			return 0, err
		}
	}
	return s.version, nil
}

func (s *fakeSource) ListRules(context.Context, string) ([]limiter.Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return nil, errDown
	}
	return nil, nil
}

func (s *fakeSource) Since(_ context.Context, version int64) (limiter.Changes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return limiter.Changes{}, errDown
	}
	out := limiter.Changes{Version: s.version}
	for _, c := range s.log {
		if c.Version > version {
			out.Limits = append(out.Limits, c.Limits...)
			out.Overrides = append(out.Overrides, c.Overrides...)
			out.DeletedOverrides = append(out.DeletedOverrides, c.DeletedOverrides...)
			out.Tokens = out.Tokens || c.Tokens
		}
	}
	return out, nil
}

func (s *fakeSource) Watch(ctx context.Context, changed func()) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.notify:
			changed()
		}
	}
}

// write records a change; notify says whether the change is announced.
func (s *fakeSource) write(c limiter.Changes, notify bool) {
	s.mu.Lock()
	s.version++
	c.Version = s.version
	s.apply(c)
	s.mu.Unlock()
	if notify {
		s.notify <- struct{}{}
	}
}

// restore puts back what the source held at version, as a restore from a
// backup does.
func (s *fakeSource) restore(version int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version = 0
	s.limits, s.overrides = map[string]limiter.Limit{}, map[string]limiter.Override{}
	log := s.log
	s.log = nil
	for _, c := range log {
		if c.Version > version {
			break
		}
		s.version = c.Version
		s.apply(c)
	}
}

// apply makes a change and logs it; s.mu is held.
func (s *fakeSource) apply(c limiter.Changes) {
	for _, l := range c.Limits {
		s.limits[l.Name] = l
	}
	for _, o := range c.Overrides {
		s.overrides[o.BucketID] = o
	}
	for _, o := range c.DeletedOverrides {
		delete(s.overrides, o.BucketID)
	}
	s.log = append(s.log, c)
}

func (s *fakeSource) setFail(fail bool) {
	s.mu.Lock()
	s.fail = fail
	s.mu.Unlock()
}

// target records the snapshots it is given.
type target struct {
	snap atomic.Pointer[limiter.Snapshot]
}

func (t *target) SetSnapshot(s *limiter.Snapshot) { t.snap.Store(s) }

var limit = limiter.Limit{Name: "NewOrdersPerAccount", Enum: 3, IDFormat: limiter.RegID,
	Params: limiter.Params{Burst: 300, Count: 300, Period: 3 * time.Hour}}

func over(id string, burst int64) limiter.Override {
	return limiter.Override{Limit: limit.Name, BucketID: id, Enabled: true,
		Params: limiter.Params{Burst: burst, Count: burst, Period: time.Hour}}
}

// eventually waits for cond, failing after 5 s; the loader works in the
// background, so tests wait for its effect rather than for a time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func start(t *testing.T, src *fakeSource, now func() time.Time, interval time.Duration) (*loader.Loader, *target) {
	t.Helper()
	tg := &target{}
	l := loader.New(loader.Config{Source: src, Target: tg, SyncInterval: interval, MaxBackoff: 20 * time.Millisecond, Now: now,
		Tokens: func(context.Context) error { src.rereads.Add(1); return nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return l, tg
}

func burstOf(t *testing.T, tg *target, id string) int64 {
	t.Helper()
	s := tg.snap.Load()
	if s == nil {
		return -1
	}
	r, err := s.Resolve(limit.Name, id, time.Now())
	if err != nil {
		t.Error(err) // not Fatal: goroutines of a test call this too
		return -1
	}
	return r.Params.Burst
}

func TestLoadsThenFollowsChanges(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	l, tg := start(t, src, nil, time.Hour)
	<-l.Loaded()
	if st := l.Status(); !st.Loaded || st.Version != 1 || st.Limits != 1 || st.Overrides != 0 {
		t.Fatalf("status after the first load with no overrides: %+v", st)
	}
	src.write(limiter.Changes{Overrides: []limiter.Override{over("7", 600)}}, true)
	eventually(t, "the new override", func() bool { return burstOf(t, tg, "7") == 600 })
	src.write(limiter.Changes{DeletedOverrides: []limiter.Override{over("7", 0)}}, true)
	eventually(t, "the deletion", func() bool { return burstOf(t, tg, "7") == 300 })
	if st := l.Status(); st.Version != 3 || st.Err != nil {
		t.Fatalf("status: %+v", st)
	}
}

// Tokens are no part of the snapshot, but follow the same change feed: they
// are reread on a full load and when a change names them, and only then.
func TestTokensFollowTheChanges(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	l, tg := start(t, src, nil, time.Hour)
	<-l.Loaded()
	if n := src.rereads.Load(); n != 1 {
		t.Fatalf("%d rereads of the tokens after the first load, want 1", n)
	}
	src.write(limiter.Changes{Overrides: []limiter.Override{over("7", 600)}}, true)
	eventually(t, "the new override", func() bool { return burstOf(t, tg, "7") == 600 })
	if n := src.rereads.Load(); n != 1 {
		t.Fatalf("a change of an override reread the tokens (%d rereads)", n)
	}
	src.write(limiter.Changes{Tokens: true}, true)
	eventually(t, "the tokens reread", func() bool { return src.rereads.Load() == 2 })
}

func TestFullReloadRepairsALostNotification(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	l, tg := start(t, src, nil, 20*time.Millisecond)
	<-l.Loaded()
	src.write(limiter.Changes{Overrides: []limiter.Override{over("8", 5)}}, false)
	eventually(t, "the periodic full load", func() bool { return burstOf(t, tg, "8") == 5 })
}

func TestDatabaseFailureKeepsTheLastSnapshot(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}, Overrides: []limiter.Override{over("9", 50)}}, false)
	l, tg := start(t, src, nil, time.Hour)
	<-l.Loaded()
	before := tg.snap.Load()
	src.setFail(true)
	src.notify <- struct{}{}
	eventually(t, "the failure to show", func() bool { return l.Status().Err != nil })
	if tg.snap.Load() != before || burstOf(t, tg, "9") != 50 {
		t.Fatal("a failed load replaced the snapshot")
	}
	// While it is down, a change is committed; once it is back, the
	// retries pick the change up without a new notification.
	src.mu.Lock()
	src.fail = false
	src.mu.Unlock()
	src.write(limiter.Changes{Overrides: []limiter.Override{over("9", 70)}}, false)
	eventually(t, "the retry to catch up", func() bool { return burstOf(t, tg, "9") == 70 && l.Status().Err == nil })
}

func TestFirstLoadRetriesUntilTheDatabaseAnswers(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	src.setFail(true)
	l, tg := start(t, src, nil, time.Hour)
	eventually(t, "a few failed attempts", func() bool { return src.fulls.Load() >= 3 })
	if tg.snap.Load() != nil || l.Status().Loaded {
		t.Fatal("a snapshot appeared while the database was down")
	}
	src.setFail(false)
	select {
	case <-l.Loaded():
	case <-time.After(5 * time.Second):
		t.Fatal("no load after the database came back")
	}
}

func TestExpiredOverridesAreLeftOut(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	expired, live := over("1", 10), over("2", 20)
	expired.ExpiresAt, live.ExpiresAt = now, now.Add(time.Minute)
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}, Overrides: []limiter.Override{expired, live}}, false)
	l, _ := start(t, src, func() time.Time { return now }, time.Hour)
	<-l.Loaded()
	if n := l.Status().Overrides; n != 1 {
		t.Fatalf("%d overrides loaded, want only the one not expired", n)
	}
}

// TestSyncSeesEarlierCommits: a change committed without a notification is
// in the snapshot as soon as Sync returns.
func TestSyncSeesEarlierCommits(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	l, tg := start(t, src, nil, time.Hour)
	<-l.Loaded()
	src.write(limiter.Changes{Overrides: []limiter.Override{over("5", 42)}}, false)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Sync(context.Background()); err != nil {
				t.Error(err)
			}
			if got := burstOf(t, tg, "5"); got != 42 {
				t.Errorf("after Sync the burst is %d, want 42", got)
			}
		}()
	}
	wg.Wait()
	src.setFail(true)
	if err := l.Sync(context.Background()); err == nil {
		t.Fatal("Sync on a failing database reported no error")
	}
}

// TestRestoredDatabase: a database restored from a backup is behind the
// snapshot; the next read loads it whole, so that decisions follow what it
// holds now, not what it held before the restore.
func TestRestoredDatabase(t *testing.T) {
	src := newSource()
	src.write(limiter.Changes{Limits: []limiter.Limit{limit}}, false)
	src.write(limiter.Changes{Overrides: []limiter.Override{over("5", 42)}}, false)
	l, tg := start(t, src, nil, time.Hour)
	<-l.Loaded()
	src.write(limiter.Changes{Overrides: []limiter.Override{over("6", 7)}}, false)
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := burstOf(t, tg, "6"); got != 7 {
		t.Fatalf("before the restore the burst is %d, want 7", got)
	}
	src.restore(2)
	if err := l.Sync(context.Background()); err != nil {
		t.Fatalf("the read after the restore: %v", err)
	}
	if got := burstOf(t, tg, "6"); got != limit.Burst {
		t.Errorf("after the restore bucket 6 has burst %d, want the default %d", got, limit.Burst)
	}
	if got := burstOf(t, tg, "5"); got != 42 {
		t.Errorf("after the restore bucket 5 has burst %d, want 42", got)
	}
	if st := l.Status(); st.Version != 2 || st.Err != nil {
		t.Errorf("status after the restore: %+v", st)
	}
}
