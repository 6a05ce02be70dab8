package limiter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
)

// countingStore counts the calls that reach a store and can fail them.
type countingStore struct {
	limiter.Store
	calls atomic.Int64
	fail  atomic.Bool
	// notDurable fails the calls with errNotDurable instead.
	notDurable atomic.Bool
}

var (
	errDown       = errors.New("store down")
	errNotDurable = fmt.Errorf("no replica acknowledged it: %w", limiter.ErrNotDurable)
)

func (s *countingStore) call() error {
	s.calls.Add(1)
	switch {
	case s.fail.Load():
		return errDown
	case s.notDurable.Load():
		return errNotDurable
	}
	return nil
}

func (s *countingStore) Apply(ctx context.Context, op limiter.Op, now time.Time, b []limiter.Bucket) (bool, error) {
	if err := s.call(); err != nil {
		return false, err
	}
	return s.Store.Apply(ctx, op, now, b)
}

// fixture is a Limiter on a memstore with a fake clock.
type fixture struct {
	l     *limiter.Limiter
	store *countingStore
	now   time.Time
}

func newFixture(t *testing.T, cfg limiter.Config, s *limiter.Snapshot) *fixture {
	t.Helper()
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	f := &fixture{store: &countingStore{Store: ms}, now: t0}
	cfg.Store = f.store
	cfg.Now = func() time.Time { return f.now }
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	f.l = limiter.New(cfg)
	f.l.SetSnapshot(s)
	return f
}

func (f *fixture) decide(t *testing.T, op limiter.Op, reqs ...limiter.Request) limiter.Result {
	t.Helper()
	res, err := f.l.Decide(context.Background(), op, reqs, nil)
	if err != nil {
		t.Fatalf("%s %+v: %v", op, reqs, err)
	}
	return res
}

func shadowLimit() limiter.Limit {
	return limiter.Limit{Name: "Shadowed", Enum: 101, IDFormat: limiter.RegID, Shadow: true,
		Params: limiter.Params{Burst: 1, Count: 1, Period: time.Hour}}
}

func testSnapshot(t *testing.T) *limiter.Snapshot {
	blocked := override("NewOrdersPerAccount", "666", 0)
	small := override("NewOrdersPerAccount", "5", 2)
	unlimited := limiter.Override{Limit: "NewOrdersPerAccount", BucketID: "9", Enabled: true, Unlimited: true}
	return build(t, []limiter.Limit{orders(), emails(), shadowLimit()}, blocked, small, unlimited)
}

func req(limit, id string, cost int64) limiter.Request {
	return limiter.Request{Limit: limit, BucketID: id, Cost: cost}
}

func TestSpendIsAllOrNothing(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 2)) // bucket 5 is now empty
	res := f.decide(t, limiter.Spend, req("MailsPerAddress", "a@example.com", 1), req("NewOrdersPerAccount", "0005", 1))
	if res.Allowed {
		t.Fatal("a batch with an empty bucket was allowed")
	}
	d := res.Decisions
	if !d[0].Allowed || d[1].Allowed || d[1].Reason != limiter.ReasonLimited || d[1].BucketID != "5" || d[1].Source != limiter.SourceOverride {
		t.Fatalf("decisions %+v", d)
	}
	if d[0].Remaining != 5 || d[0].ResetAfter != 0 {
		t.Errorf("the bucket that allowed its cost reports remaining %d, reset after %v: want what it holds, 5 and 0",
			d[0].Remaining, d[0].ResetAfter)
	}
	if res.RetryAfter != 30*time.Minute || res.ResetAfter != time.Hour {
		t.Fatalf("retry %v reset %v, want 30m and 1h", res.RetryAfter, res.ResetAfter)
	}
	if got := f.decide(t, limiter.Check, req("MailsPerAddress", "a@example.com", 0)).Decisions[0].Remaining; got != 5 {
		t.Fatalf("the allowed bucket of a denied batch was spent: remaining %d", got)
	}
}

func TestLocalDecisionsSkipTheStore(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "9", 1000))
	if !res.Allowed || res.Decisions[0].Source != limiter.SourceUnlimited || res.Decisions[0].Remaining != 300 {
		t.Fatalf("unlimited: %+v", res)
	}
	res = f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "666", 1))
	if res.Allowed || res.Decisions[0].Reason != limiter.ReasonBlocked || res.RetryAfter != limiter.Never {
		t.Fatalf("blocked: %+v", res)
	}
	if n := f.store.calls.Load(); n != 0 {
		t.Fatalf("unlimited and blocked buckets made %d store calls", n)
	}
	// A blocked bucket denies its batch; the other bucket is only read.
	res = f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "666", 1), req("NewOrdersPerAccount", "1", 1))
	if res.Allowed || !res.Decisions[1].Allowed {
		t.Fatalf("blocked with another: %+v", res)
	}
	if got := f.decide(t, limiter.Check, req("NewOrdersPerAccount", "1", 0)).Decisions[0].Remaining; got != 300 {
		t.Fatalf("a batch denied by a blocked bucket spent the other: remaining %d", got)
	}
}

func TestShadowNeverDenies(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	f.decide(t, limiter.Spend, req("Shadowed", "1", 1))
	res := f.decide(t, limiter.Spend, req("Shadowed", "1", 1), req("NewOrdersPerAccount", "1", 1))
	if !res.Allowed || res.Decisions[0].Allowed || !res.Decisions[0].Shadow || res.RetryAfter != 0 {
		t.Fatalf("shadow: %+v", res)
	}
	if got := f.decide(t, limiter.Check, req("NewOrdersPerAccount", "1", 0)).Decisions[0].Remaining; got != 299 {
		t.Fatalf("the real bucket beside a denied shadow one was not spent: remaining %d", got)
	}
}

func TestEveryFieldErrorAtOnce(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	_, err := f.l.Decide(context.Background(), limiter.Spend, []limiter.Request{
		req("NewOrdersPerAccount", "1", 1),
		req("Nope", "1", 1),
		req("NewOrdersPerAccount", "abc", -1),
		req("NewOrdersPerAccount", "001", 1),
	}, nil)
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v, want a ValidationError", err)
	}
	want := []string{"buckets[1].limit", "buckets[2].cost", "buckets[2].bucket_id", "buckets[3]"}
	if len(ve.Fields) != len(want) {
		t.Fatalf("fields %+v, want %v", ve.Fields, want)
	}
	for i, fe := range ve.Fields {
		if fe.Field != want[i] || fe.Message == "" {
			t.Fatalf("field %d: %+v, want %s", i, fe, want[i])
		}
	}
	for _, n := range []int{0, limiter.MaxBatch + 1} {
		reqs := make([]limiter.Request, n)
		for i := range reqs {
			reqs[i] = req("NewOrdersPerAccount", fmt.Sprint(i+1), 1)
		}
		if _, err := f.l.Decide(context.Background(), limiter.Spend, reqs, nil); !errors.As(err, &ve) || ve.Fields[0].Field != "buckets" {
			t.Fatalf("%d buckets: %v", n, err)
		}
	}
	if n := f.store.calls.Load(); n != 0 {
		t.Fatalf("invalid requests made %d store calls", n)
	}
}

func TestNoSnapshotIsUnavailable(t *testing.T) {
	l := limiter.New(limiter.Config{Store: memstore.New(memstore.Options{})})
	_, err := l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("A", "1", 1)}, nil)
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("got %v", err)
	}
}

func TestFailModes(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			f := newFixture(t, limiter.Config{FailOpen: open}, testSnapshot(t))
			f.store.fail.Store(true)
			res, err := f.l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "1", 1)}, nil)
			switch {
			case !open && (!errors.Is(err, limiter.ErrUnavailable) || res.Allowed):
				t.Fatalf("closed: %+v, %v", res, err)
			case open && (err != nil || !res.Allowed || !res.Degraded):
				t.Fatalf("open: %+v, %v", res, err)
			}
			// A blocked bucket needs no store and still denies.
			res, err = f.l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "666", 1)}, nil)
			if err != nil || res.Allowed || res.Degraded {
				t.Fatalf("blocked while the store is down: %+v, %v", res, err)
			}
			if got := f.l.Stats().StoreErrors; got != 1 {
				t.Fatalf("StoreErrors = %d, want 1", got)
			}
		})
	}
}

// TestNotDurableIsNoOutage: a write the store could not vouch for is
// answered by the fail mode and counted as a store error, but logged as
// no outage: the store answers the decisions in between, and their
// alternation must not log an outage's start and end at the rate of
// requests.
func TestNotDurableIsNoOutage(t *testing.T) {
	var logs bytes.Buffer
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	store := &countingStore{Store: ms}
	l := limiter.New(limiter.Config{Store: store, Now: func() time.Time { return t0 }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	l.SetSnapshot(testSnapshot(t))
	spend := func() error {
		_, err := l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "1", 1)}, nil)
		return err
	}
	for range 3 {
		store.notDurable.Store(true)
		if err := spend(); !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, limiter.ErrNotDurable) {
			t.Fatalf("a spend not known durable, fail mode closed: %v", err)
		}
		store.notDurable.Store(false)
		if err := spend(); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Stats().StoreErrors; got != 3 {
		t.Errorf("StoreErrors = %d, want 3", got)
	}
	if logs.Len() != 0 {
		t.Errorf("the log: %s", logs.String())
	}
	// An outage is logged, once.
	store.fail.Store(true)
	for range 2 {
		if err := spend(); !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("a spend with the store down: %v", err)
		}
	}
	if n := strings.Count(logs.String(), "store unavailable"); n != 1 {
		t.Errorf("%d lines of store unavailable in %s", n, logs.String())
	}
}

func TestDeniedCache(t *testing.T) {
	f := newFixture(t, limiter.Config{DeniedCacheSize: 1000}, testSnapshot(t))
	empty := req("NewOrdersPerAccount", "5", 2)
	f.decide(t, limiter.Spend, empty) // spends the whole burst of 2
	calls := f.store.calls.Load()
	for range 3 {
		res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 1))
		if res.Allowed || res.Decisions[0].RetryAfter != 30*time.Minute {
			t.Fatalf("a cached denial: %+v", res)
		}
	}
	if got := f.store.calls.Load() - calls; got != 0 {
		t.Fatalf("denials of an empty bucket made %d store calls", got)
	}
	if got := f.l.Stats().DeniedCacheHit; got != 3 {
		t.Fatalf("DeniedCacheHit = %d, want 3", got)
	}
	// When a token is back, the store is asked again.
	f.now = f.now.Add(30 * time.Minute)
	if res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 1)); !res.Allowed {
		t.Fatalf("after the retry-after: %+v", res)
	}
	// A refund through this process forgets the bucket at once.
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 300))
	f.decide(t, limiter.Refund, req("NewOrdersPerAccount", "1", 1))
	if res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 1)); !res.Allowed {
		t.Fatalf("after a refund: %+v", res)
	}
	// A raised burst takes effect at once: parameters are not cached.
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "2", 300))
	b := f.l.Snapshot().Builder()
	raised := override("NewOrdersPerAccount", "2", 0)
	raised.Params = limiter.Params{Burst: 301, Count: 300, Period: 3 * time.Hour}
	if err := b.PutOverride(raised); err != nil {
		t.Fatal(err)
	}
	f.l.SetSnapshot(b.Snapshot(2))
	if res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "2", 1)); !res.Allowed {
		t.Fatalf("after raising the limit: %+v", res)
	}
}

func TestResetFillsBuckets(t *testing.T) {
	f := newFixture(t, limiter.Config{DeniedCacheSize: 100}, testSnapshot(t))
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 300))
	n, err := f.l.Reset(context.Background(), []limiter.Request{{Limit: "NewOrdersPerAccount", BucketID: "01"}})
	if err != nil || n != 1 {
		t.Fatalf("Reset: %d, %v", n, err)
	}
	if res := f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 300)); !res.Allowed {
		t.Fatalf("after reset: %+v", res)
	}
}

// TestConcurrentSpendsAdmitExactlyTheBurst goes through the whole Limiter.
func TestConcurrentSpendsAdmitExactlyTheBurst(t *testing.T) {
	f := newFixture(t, limiter.Config{DeniedCacheSize: 1000}, build(t, []limiter.Limit{orders()}))
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				res, err := f.l.Decide(context.Background(), limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "77", 1)}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 300 {
		t.Fatalf("admitted %d, want exactly the burst of 300", got)
	}
}

func settleReq(limit, id string, reserved, actual int64) limiter.Request {
	return limiter.Request{Limit: limit, BucketID: id, Cost: actual, Reserved: reserved}
}

// TestSettle: a settle applies every bucket it can in one store call, even
// beside a blocked bucket, which it leaves alone and which alone makes the
// batch not allowed; unlimited buckets are unchanged.
func TestSettle(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	res := f.decide(t, limiter.Settle,
		settleReq("MailsPerAddress", "b@example.com", 0, 1),
		settleReq("NewOrdersPerAccount", "9", 0, 50),
		settleReq("NewOrdersPerAccount", "666", 0, 1),
		settleReq("Shadowed", "1", 0, 2))
	d := res.Decisions
	switch {
	case res.Allowed:
		t.Errorf("a settle with a blocked bucket was allowed: %+v", res)
	case !d[0].Allowed || d[0].Remaining != 4:
		t.Errorf("the charged bucket: %+v", d[0])
	case !d[1].Allowed || d[1].Source != limiter.SourceUnlimited || d[1].Remaining != 300:
		t.Errorf("the unlimited bucket: %+v", d[1])
	case d[2].Allowed || d[2].Reason != limiter.ReasonBlocked:
		t.Errorf("the blocked bucket: %+v", d[2])
	case !d[3].Allowed || d[3].Debt != 1 || !d[3].Shadow:
		t.Errorf("the shadow bucket: %+v", d[3])
	}
	if n := f.store.calls.Load(); n != 1 {
		t.Errorf("a settle made %d store calls, want 1", n)
	}
	if got := f.decide(t, limiter.Check, req("MailsPerAddress", "b@example.com", 0)).Decisions[0].Remaining; got != 4 {
		t.Errorf("after the settle the bucket holds %d, want 4", got)
	}
}

// TestSettleFieldErrors: negative amounts are named as the REST API names
// them, and nothing reaches the store.
func TestSettleFieldErrors(t *testing.T) {
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	_, err := f.l.Decide(context.Background(), limiter.Settle, []limiter.Request{settleReq("MailsPerAddress", "a@example.com", -1, -1)}, nil)
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) != 2 || ve.Fields[0].Field != "buckets[0].actual" || ve.Fields[1].Field != "buckets[0].reserved" {
		t.Fatalf("got %v, want errors on buckets[0].actual and buckets[0].reserved", err)
	}
	if n := f.store.calls.Load(); n != 0 {
		t.Fatalf("an invalid settle made %d store calls", n)
	}
}

// TestDebtIsCachedAsADenial: a bucket a settle put into debt is denied
// from the denied cache, with a retry-after that pays the debt first.
func TestDebtIsCachedAsADenial(t *testing.T) {
	f := newFixture(t, limiter.Config{DeniedCacheSize: 64}, testSnapshot(t))
	// 5 an hour: T = 12 min; 8 used of a full bucket leaves 3 owed.
	d := f.decide(t, limiter.Settle, settleReq("MailsPerAddress", "a@example.com", 0, 8)).Decisions[0]
	if !d.Allowed || d.Debt != 3 || d.ResetAfter != 96*time.Minute {
		t.Fatalf("settle: %+v", d)
	}
	calls := f.store.calls.Load()
	res := f.decide(t, limiter.Spend, req("MailsPerAddress", "a@example.com", 1))
	if d := res.Decisions[0]; res.Allowed || d.Debt != 3 || d.RetryAfter != 48*time.Minute {
		t.Fatalf("spend in debt: %+v", res)
	}
	res = f.decide(t, limiter.Check, req("MailsPerAddress", "a@example.com", 0))
	if d := res.Decisions[0]; res.Allowed || d.Debt != 3 || d.RetryAfter != 36*time.Minute {
		t.Fatalf("check in debt: %+v", res)
	}
	if n := f.store.calls.Load(); n != calls {
		t.Fatalf("the denials made %d store calls, want none", n-calls)
	}
}

// gatedStore holds its armed call after the store has applied it, so that
// a test can run another operation between a store's answer and the
// Limiter's use of it.
type gatedStore struct {
	limiter.Store
	armed            atomic.Bool
	applied, release chan struct{}
}

func (s *gatedStore) Apply(ctx context.Context, op limiter.Op, now time.Time, b []limiter.Bucket) (bool, error) {
	written, err := s.Store.Apply(ctx, op, now, b)
	if s.armed.CompareAndSwap(true, false) {
		s.applied <- struct{}{}
		<-s.release
	}
	return written, err
}

// TestDeniedCacheRacesUndos: a spend's answer that comes back after a
// refund, reset or settle gave the bucket its tokens back must not make
// the denied cache deny from the TAT that was undone.
func TestDeniedCacheRacesUndos(t *testing.T) {
	ctx := context.Background()
	bucket := []limiter.Request{req("NewOrdersPerAccount", "1", 1)}
	undos := map[string]func(*limiter.Limiter) error{
		"refund": func(l *limiter.Limiter) error {
			_, err := l.Decide(ctx, limiter.Refund, []limiter.Request{req("NewOrdersPerAccount", "1", 300)}, nil)
			return err
		},
		"reset": func(l *limiter.Limiter) error {
			_, err := l.Reset(ctx, bucket)
			return err
		},
		"settle": func(l *limiter.Limiter) error {
			_, err := l.Decide(ctx, limiter.Settle, []limiter.Request{settleReq("NewOrdersPerAccount", "1", 300, 0)}, nil)
			return err
		},
	}
	for name, undo := range undos {
		t.Run(name, func(t *testing.T) {
			ms := memstore.New(memstore.Options{})
			t.Cleanup(ms.Close)
			gs := &gatedStore{Store: ms, applied: make(chan struct{}), release: make(chan struct{})}
			l := limiter.New(limiter.Config{Store: gs, DeniedCacheSize: 1000, Now: func() time.Time { return t0 },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			l.SetSnapshot(build(t, []limiter.Limit{orders()}))
			if _, err := l.Decide(ctx, limiter.Spend, []limiter.Request{req("NewOrdersPerAccount", "1", 299)}, nil); err != nil {
				t.Fatal(err)
			}
			// The last token goes, and the answer is held after the store
			// applied it while the bucket gets its tokens back.
			gs.armed.Store(true)
			done := make(chan error)
			go func() {
				res, err := l.Decide(ctx, limiter.Spend, bucket, nil)
				if err == nil && !res.Allowed {
					err = fmt.Errorf("the last token was denied: %+v", res)
				}
				done <- err
			}()
			<-gs.applied
			if err := undo(l); err != nil {
				t.Fatal(err)
			}
			close(gs.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			res, err := l.Decide(ctx, limiter.Spend, bucket, nil)
			if err != nil || !res.Allowed {
				t.Fatalf("the store holds tokens again, but the spend got %+v, %v", res, err)
			}
		})
	}
}

// traceKey marks the context that TraceStore hands the store.
type traceKey struct{}

// ctxStore records the trace mark of the context each call gets.
type ctxStore struct {
	limiter.Store
	marks []any
}

func (s *ctxStore) Apply(ctx context.Context, op limiter.Op, now time.Time, b []limiter.Bucket) (bool, error) {
	s.marks = append(s.marks, ctx.Value(traceKey{}))
	return s.Store.Apply(ctx, op, now, b)
}

// storeCall is what TraceStore was told of one call to the store.
type storeCall struct {
	op      limiter.Op
	limits  []string
	allowed bool
	err     error
}

func TestTraceStoreSeesEachStoreCall(t *testing.T) {
	var calls []storeCall
	trace := func(ctx context.Context, op limiter.Op, limits []string) (context.Context, func(bool, error)) {
		i := len(calls)
		calls = append(calls, storeCall{op: op, limits: limits})
		return context.WithValue(ctx, traceKey{}, i), func(allowed bool, err error) {
			calls[i].allowed, calls[i].err = allowed, err
		}
	}
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	cs := &ctxStore{Store: f.store}
	f.l = limiter.New(limiter.Config{Store: cs, Now: func() time.Time { return f.now }, TraceStore: trace,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	f.l.SetSnapshot(testSnapshot(t))

	// Two buckets of one limit name it once; the unlimited bucket needs
	// no store and is not named; a denied shadow bucket denies nothing.
	f.decide(t, limiter.Spend, req("Shadowed", "1", 1))
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 1), req("Shadowed", "1", 1),
		req("NewOrdersPerAccount", "9", 1), req("NewOrdersPerAccount", "2", 1))
	// An empty bucket denies the batch.
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "5", 3))
	// A blocked bucket needs no store: no call, nothing traced.
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "666", 1))
	f.store.fail.Store(true)
	if _, err := f.l.Decide(context.Background(), limiter.Check, []limiter.Request{req("MailsPerAddress", "a@example.com", 1)}, nil); err == nil {
		t.Fatal("a failing store answered")
	}

	want := []storeCall{
		{op: limiter.Spend, limits: []string{"Shadowed"}, allowed: true},
		{op: limiter.Spend, limits: []string{"NewOrdersPerAccount", "Shadowed"}, allowed: true},
		{op: limiter.Spend, limits: []string{"NewOrdersPerAccount"}, allowed: false},
		{op: limiter.Check, limits: []string{"MailsPerAddress"}, err: errDown},
	}
	if len(calls) != len(want) {
		t.Fatalf("%d store calls traced, want %d: %+v", len(calls), len(want), calls)
	}
	for i, w := range want {
		c := calls[i]
		// A failed call allowed nothing it could tell.
		if c.op != w.op || !slices.Equal(c.limits, w.limits) || c.allowed != w.allowed || !errors.Is(c.err, w.err) {
			t.Errorf("call %d: %+v, want %+v", i, c, w)
		}
	}
	if !slices.Equal(cs.marks, []any{0, 1, 2, 3}) {
		t.Errorf("the store ran in contexts %v, want those TraceStore returned, 0 to 3", cs.marks)
	}
}

func TestObserveStoreTimesEachStoreCall(t *testing.T) {
	type observed struct {
		op     limiter.Op
		failed bool
	}
	var seen []observed
	observe := func(op limiter.Op, took time.Duration, err error) {
		if took < 0 {
			t.Errorf("a store call took %v", took)
		}
		seen = append(seen, observed{op, err != nil})
	}
	f := newFixture(t, limiter.Config{}, testSnapshot(t))
	f.l = limiter.New(limiter.Config{Store: f.store, Now: func() time.Time { return f.now }, ObserveStore: observe,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	f.l.SetSnapshot(testSnapshot(t))
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "1", 1))
	// A blocked bucket needs no store: nothing is timed.
	f.decide(t, limiter.Spend, req("NewOrdersPerAccount", "666", 1))
	f.store.fail.Store(true)
	if _, err := f.l.Decide(context.Background(), limiter.Check, []limiter.Request{req("MailsPerAddress", "a@example.com", 1)}, nil); err == nil {
		t.Fatal("a failing store answered")
	}
	if want := []observed{{limiter.Spend, false}, {limiter.Check, true}}; !slices.Equal(seen, want) {
		t.Errorf("observed %+v, want %+v", seen, want)
	}
}
