package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// gate records the keys of every script command a client sends and, while
// shut, holds every command and pipeline until it opens: a test fills the
// store's round trips with calls the gate holds, then queues calls behind
// them in an order it knows.
type gate struct {
	shut atomic.Bool
	// held receives a value for each command or pipeline held.
	held chan struct{}
	open chan struct{}

	mu      sync.Mutex
	scripts [][]string
}

func newGate() *gate {
	return &gate{held: make(chan struct{}, 1000), open: make(chan struct{})}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.pass(cmd)
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.pass(cmds...)
		return next(ctx, cmds)
	}
}

func (g *gate) pass(cmds ...redis.Cmder) {
	g.mu.Lock()
	for _, cmd := range cmds {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			args := cmd.Args()
			keys := make([]string, args[2].(int))
			for i := range keys {
				// The stores send their keys as *string (evalCmd).
				keys[i] = *args[3+i].(*string)
			}
			g.scripts = append(g.scripts, keys)
		}
	}
	g.mu.Unlock()
	if g.shut.Load() {
		g.held <- struct{}{}
		<-g.open
	}
}

// fill shuts the gate and starts MaxInFlight calls of f, which the gate
// holds; it returns when all are held. The test's cleanup opens the gate.
func (g *gate) fill(t *testing.T, f func() error) *sync.WaitGroup {
	t.Helper()
	g.shut.Store(true)
	t.Cleanup(g.release)
	var wg sync.WaitGroup
	for range redisstore.MaxInFlight {
		wg.Go(func() {
			if err := f(); err != nil {
				t.Errorf("a call the gate held: %v", err)
			}
		})
	}
	for range redisstore.MaxInFlight {
		<-g.held
	}
	return &wg
}

// release forgets the script commands recorded so far and opens the gate.
func (g *gate) release() {
	if !g.shut.Load() {
		return
	}
	g.mu.Lock()
	g.scripts = nil
	g.mu.Unlock()
	g.shut.Store(false)
	close(g.open)
}

// recorded returns the keys of each script command sent since release.
func (g *gate) recorded() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.scripts)
}

// waitQueued waits until n calls wait in the queue of s.
func waitQueued(t *testing.T, s limiter.Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if q, _ := redisstore.QueueState(s); q == n {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", q, n)
		}
	}
}

// queuedCall is a call made behind a full wire.
type queuedCall struct {
	batch   []limiter.Bucket
	written bool
	err     error
}

// queueCalls starts a spend of each batch, one after the other, each once
// the one before it is queued, so that they queue in this order.
func queueCalls(t *testing.T, s limiter.Store, now time.Time, batches ...[]limiter.Bucket) ([]*queuedCall, *sync.WaitGroup) {
	t.Helper()
	var wg sync.WaitGroup
	calls := make([]*queuedCall, len(batches))
	for i, b := range batches {
		c := &queuedCall{batch: b}
		calls[i] = c
		wg.Go(func() { c.written, c.err = s.Apply(context.Background(), limiter.Spend, now, c.batch) })
		waitQueued(t, s, i+1)
	}
	return calls, &wg
}

func bucketOf(key string, p limiter.Params, cost int64) limiter.Bucket {
	return limiter.Bucket{Key: []byte(key), Rate: p.Rate(), Cost: cost}
}

// TestCoalescedCall: calls queued behind a full wire go in one script
// call, in the order they queued, and each batch in it is all or nothing on
// its own: a denied batch writes nothing, not even its allowed buckets; a
// batch sees what the batches before it wrote; spends of one bucket admit
// exactly its burst; a key that holds no TAT fails its own batch only.
func TestCoalescedCall(t *testing.T) {
	client := testenv.Redis(t)
	g := newGate()
	client.AddHook(g)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	now := time.Now()
	one := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	ten := limiter.Params{Burst: 10, Count: 10, Period: time.Hour}
	three := limiter.Params{Burst: 3, Count: 3, Period: time.Hour}
	// Empty 1:empty; 4:hash holds a hash, no TAT. The spend loads the
	// script.
	if _, err := s.Apply(ctx, limiter.Spend, now, []limiter.Bucket{bucketOf("1:empty", one, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := client.HSet(ctx, p+"4:hash", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	held := g.fill(t, func() error { return errOf(s.Apply(ctx, limiter.Check, now, batchOf("1:held"))) })
	batches := [][]limiter.Bucket{
		{bucketOf("1:empty", one, 1), bucketOf("2:shared", ten, 1)}, // denied by 1:empty
		{bucketOf("2:shared", ten, 1)},                              // allowed, the first spend of 2:shared
		{bucketOf("3:twice", ten, 2)},
		{bucketOf("3:twice", ten, 3)}, // reads what the one before wrote
		{bucketOf("4:hash", ten, 1)},  // an error of its own
		{bucketOf("5:after", ten, 1)},
	}
	const hot = 7
	for range hot {
		batches = append(batches, []limiter.Bucket{bucketOf("6:hot", three, 1)})
	}
	calls, wg := queueCalls(t, s, now, batches...)
	g.release()
	wg.Wait()
	held.Wait()

	var want []string
	for _, b := range batches {
		for _, x := range b {
			want = append(want, p+string(x.Key))
		}
	}
	if scripts := g.recorded(); !slices.ContainsFunc(scripts, func(keys []string) bool { return slices.Equal(keys, want) }) {
		t.Fatalf("the queued calls were not one script call of their keys in order: script calls %q", scripts)
	}

	nowUS := now.UnixMicro()
	for i, c := range calls {
		if i == 4 {
			continue
		}
		if c.err != nil {
			t.Fatalf("call %d: %v", i, c.err)
		}
	}
	if c := calls[0]; c.written || c.batch[0].Outcome.Allowed || !c.batch[1].Outcome.Allowed {
		t.Errorf("the batch on an empty bucket: written %v, outcomes %+v", c.written, c.batch)
	}
	if c := calls[1]; !c.written || c.batch[0].TAT != 0 {
		t.Errorf("2:shared after the denied batch: written %v, read TAT %d (want 0: the denied batch wrote nothing)", c.written, c.batch[0].TAT)
	}
	if a, b := calls[2].batch[0], calls[3].batch[0]; !calls[2].written || !calls[3].written || a.TAT != 0 || b.TAT != a.Next {
		t.Errorf("3:twice: the first spend read %d and wrote %d, the second read %d", a.TAT, a.Next, b.TAT)
	}
	if err := calls[4].err; err == nil || !strings.Contains(err.Error(), p+"4:hash holds no TAT") {
		t.Errorf("a spend of a key that holds a hash: %v", err)
	}
	if c := calls[5]; !c.written || c.batch[0].TAT != 0 {
		t.Errorf("the batch after the failed one: written %v, read TAT %d", c.written, c.batch[0].TAT)
	}
	var admitted int64
	for _, c := range calls[6:] {
		if c.written {
			admitted++
		}
	}
	if admitted != three.Burst {
		t.Errorf("%d spends of 6:hot in one script call admitted %d, want its burst %d", hot, admitted, three.Burst)
	}

	// What is stored: 2:shared holds the one token of the allowed batch.
	after := []limiter.Bucket{bucketOf("2:shared", ten, 0), bucketOf("3:twice", ten, 0), bucketOf("6:hot", three, 0)}
	if _, err := s.Apply(ctx, limiter.Check, now, after); err != nil {
		t.Fatal(err)
	}
	for i, tokens := range []int64{1, 5, 3} {
		if b := after[i]; b.TAT != nowUS+tokens*b.Rate.Interval {
			t.Errorf("%s holds TAT %d, want %d tokens spent at %d", b.Key, b.TAT, tokens, nowUS)
		}
	}
}

// TestManyJoinsTheCallsInFlight: the batches of one ApplyMany, queued
// between two calls behind a full wire, go into the same script call as
// them, in order, each batch all or nothing on its own.
func TestManyJoinsTheCallsInFlight(t *testing.T) {
	client := testenv.Redis(t)
	g := newGate()
	client.AddHook(g)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	now := time.Now()
	two := limiter.Params{Burst: 2, Count: 2, Period: time.Hour}
	if _, err := s.Apply(ctx, limiter.Check, now, batchOf("1:load")); err != nil { // loads the script
		t.Fatal(err)
	}
	held := g.fill(t, func() error { return errOf(s.Apply(ctx, limiter.Check, now, batchOf("1:held"))) })
	before, wg := queueCalls(t, s, now, []limiter.Bucket{bucketOf("1:x", two, 1)})
	batches := []limiter.Batch{
		{Op: limiter.Spend, Buckets: []limiter.Bucket{bucketOf("1:x", two, 1)}},                          // the second token of 1:x
		{Op: limiter.Spend, Buckets: []limiter.Bucket{bucketOf("2:y", two, 1), bucketOf("1:x", two, 1)}}, // denied by 1:x: 2:y untouched
		{Op: limiter.Refund, Buckets: []limiter.Bucket{bucketOf("1:x", two, 1)}},
		{Op: limiter.Check, Buckets: []limiter.Bucket{bucketOf("1:x", two, 0), bucketOf("2:y", two, 0)}},
	}
	wg.Go(func() { s.ApplyMany(ctx, now, batches) })
	waitQueued(t, s, 2)
	after := []*queuedCall{{batch: []limiter.Bucket{bucketOf("1:x", two, 1)}}}
	wg.Go(func() { after[0].written, after[0].err = s.Apply(ctx, limiter.Spend, now, after[0].batch) })
	waitQueued(t, s, 3)
	g.release()
	wg.Wait()
	held.Wait()

	want := []string{p + "1:x", p + "1:x", p + "2:y", p + "1:x", p + "1:x", p + "1:x", p + "2:y", p + "1:x"}
	if scripts := g.recorded(); !slices.ContainsFunc(scripts, func(keys []string) bool { return slices.Equal(keys, want) }) {
		t.Fatalf("the calls and the batches were not one script call of their keys in order: script calls %q", scripts)
	}
	for i, b := range batches {
		if b.Err != nil {
			t.Fatalf("batch %d: %v", i, b.Err)
		}
	}
	if before[0].err != nil || after[0].err != nil {
		t.Fatal(before[0].err, after[0].err)
	}
	nowUS := now.UnixMicro()
	T := two.Rate().Interval
	switch {
	case !before[0].written || !batches[0].Written:
		t.Errorf("the first two spends of 1:x: %v and %v, want both written", before[0].written, batches[0].Written)
	case batches[1].Written || batches[1].Buckets[0].Next != 0:
		t.Errorf("the batch denied by 1:x: written %v, 2:y %+v", batches[1].Written, batches[1].Buckets[0])
	case !batches[2].Written || batches[2].Buckets[0].TAT != nowUS+2*T:
		t.Errorf("the refund read %d, want the two spends' %d", batches[2].Buckets[0].TAT, nowUS+2*T)
	case batches[3].Buckets[0].TAT != nowUS+T || batches[3].Buckets[1].TAT != 0:
		t.Errorf("the check read 1:x %d and 2:y %d, want %d and 0", batches[3].Buckets[0].TAT, batches[3].Buckets[1].TAT, nowUS+T)
	case !after[0].written || after[0].batch[0].TAT != nowUS+T:
		t.Errorf("the spend after the batches: written %v, read %d, want the refunded bucket's %d", after[0].written, after[0].batch[0].TAT, nowUS+T)
	}
}

// TestBatchesReadWhatTheOnesBeforeDeleted: a refund that fills its
// bucket deletes the key, and the batches after it in the same script
// call read the bucket as absent, not as the script first read it.
func TestBatchesReadWhatTheOnesBeforeDeleted(t *testing.T) {
	client := testenv.Redis(t)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	now := time.Now()
	ten := limiter.Params{Burst: 10, Count: 10, Period: time.Hour}
	if _, err := s.Apply(ctx, limiter.Spend, now, []limiter.Bucket{bucketOf("1:z", ten, 2)}); err != nil {
		t.Fatal(err)
	}
	batches := []limiter.Batch{
		{Op: limiter.Refund, Buckets: []limiter.Bucket{bucketOf("1:z", ten, 5)}}, // more than was spent: full, deleted
		{Op: limiter.Check, Buckets: []limiter.Bucket{bucketOf("1:z", ten, 0)}},
		{Op: limiter.Spend, Buckets: []limiter.Bucket{bucketOf("1:z", ten, 1)}},
	}
	s.ApplyMany(ctx, now, batches)
	for i, b := range batches {
		if b.Err != nil {
			t.Fatalf("batch %d: %v", i, b.Err)
		}
	}
	nowUS, T := now.UnixMicro(), ten.Rate().Interval
	if r, c, sp := batches[0].Buckets[0].TAT, batches[1].Buckets[0].TAT, batches[2].Buckets[0].TAT; r != nowUS+2*T || c != 0 || sp != 0 {
		t.Errorf("the refund read %d (want %d), the check %d and the spend %d after it (want 0)", r, nowUS+2*T, c, sp)
	}
	stored, err := client.Get(ctx, p+"1:z").Int64()
	if err != nil || stored != nowUS+T {
		t.Errorf("1:z holds %d (%v), want the last spend's %d", stored, err, nowUS+T)
	}
}

// TestOutsizedRoundTripNotPooled: the memory of a round trip that carried
// thousands of buckets does not go back to the pool, where the round trips
// of a few buckets after it would hold on to it.
func TestOutsizedRoundTripNotPooled(t *testing.T) {
	client := testenv.Redis(t)
	p := prefix(t, client)
	s := redisstore.NewNode(client, redisstore.Options{Prefix: p, Timeout: patient})
	ten := limiter.Params{Burst: 10, Count: 10, Period: time.Hour}
	batches := make([]limiter.Batch, 5000)
	// The pool may drop what it is given (always, now and then, under the
	// race detector): a few tries make a pooled outsized round trip show.
	for try := range 5 {
		for i := range batches {
			batches[i] = limiter.Batch{Op: limiter.Spend, Buckets: []limiter.Bucket{bucketOf(fmt.Sprintf("1:%d-%d", try, i), ten, 1)}}
		}
		s.ApplyMany(context.Background(), time.Now(), batches)
		if err := batches[len(batches)-1].Err; err != nil {
			t.Fatal(err)
		}
		if keys, parts, ok := redisstore.PooledTrip(s); ok && (keys > 4096 || parts > 4096) {
			t.Fatalf("a round trip of %d buckets went back to the pool with room for %d keys and %d parts", len(batches), keys, parts)
		}
	}
}

// TestCoalescedSpendsAdmitExactlyTheBurst: many goroutines spending on one
// bucket over a slow wire, so that their calls share script calls, admit
// exactly its burst.
func TestCoalescedSpendsAdmitExactlyTheBurst(t *testing.T) {
	client := testenv.Redis(t)
	g := newGate()
	client.AddHook(g)
	client.AddHook(slowCalls{})
	s := redisstore.New(client, redisstore.Options{Prefix: prefix(t, client), Timeout: patient})
	p := limiter.Params{Burst: 50, Count: 1, Period: time.Hour}
	var allowed atomic.Int64
	const goroutines, spends = 32, 10
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range spends {
				b := []limiter.Bucket{bucketOf("1:race", p, 1)}
				written, err := s.Apply(context.Background(), limiter.Spend, time.Now(), b)
				if err != nil {
					t.Error(err)
					return
				}
				if written {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got != p.Burst {
		t.Errorf("%dx%d spends against a burst of %d admitted %d", goroutines, spends, p.Burst, got)
	}
	most := 0
	scripts := g.recorded()
	for _, keys := range scripts {
		most = max(most, len(keys))
	}
	if most < 2 {
		t.Errorf("%d spends in %d script calls, none of which carried more than one", goroutines*spends, len(scripts))
	}
	t.Logf("%d spends in %d script calls, at most %d in one", goroutines*spends, len(scripts), most)
}

// slowCalls makes every command and pipeline take a millisecond longer.
type slowCalls struct{}

func (slowCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (slowCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(time.Millisecond)
		return next(ctx, cmd)
	}
}

func (slowCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(time.Millisecond)
		return next(ctx, cmds)
	}
}

// TestQueuedCallTimesOut: behind a stalled server, a call that queues
// because the wire is full returns at its own deadline, not theirs, and is
// never sent.
func TestQueuedCallTimesOut(t *testing.T) {
	srv := testenv.RedisServer(t)
	client := clientOn(t, srv)
	var trips roundTrips
	client.AddHook(&trips)
	s := redisstore.New(client, redisstore.Options{Timeout: patient})
	ctx := context.Background()
	if _, err := s.Apply(ctx, limiter.Check, time.Now(), batchOf("1:warm")); err != nil { // loads the script
		t.Fatal(err)
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	// Fill the wire of s with calls that wait for the stalled server.
	start := trips.n.Load()
	var wg sync.WaitGroup
	for range redisstore.MaxInFlight {
		wg.Go(func() { _, _ = s.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:held")) })
	}
	for trips.n.Load() < start+redisstore.MaxInFlight {
		time.Sleep(time.Millisecond)
	}
	queuedAt := time.Now()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := s.Apply(short, limiter.Spend, time.Now(), batchOf("1:queued"))
	took := time.Since(queuedAt)
	if !isTimeout(err) {
		t.Errorf("a call queued behind a stalled server: got %v, want a timeout", err)
	}
	// A liveness check, not a speed claim: the call did not wait for the
	// calls ahead of it.
	if took > 5*time.Second {
		t.Errorf("a call queued behind a stalled server returned after %v", took)
	}
	srv.Resume()
	wg.Wait()
	for {
		if q, n := redisstore.QueueState(s); q == 0 && n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if n, err := client.Exists(ctx, "1:queued").Result(); err != nil || n != 0 {
		t.Errorf("the call that timed out while queued was sent: EXISTS %d, %v", n, err)
	}
}

// TestClusterCoalescesBySlot: on a Cluster, the calls queued behind a full
// wire to one master go as one script call per hash slot, a batch across
// slots in both, and spends of one bucket admit exactly its burst.
func TestClusterCoalescesBySlot(t *testing.T) {
	client := clusterClient(t)
	master := masters(t, client)
	g := newGate()
	client.AddHook(g)
	p := prefix(t, client)
	// {a} and {b} are two slots of one master, so they share its queue.
	b := ""
	for i := 0; b == ""; i++ {
		tag := fmt.Sprintf("{b%d}", i)
		if master(p+"1:"+tag) == master(p+"1:{a}") && redisstore.KeySlot(p+"1:"+tag) != redisstore.KeySlot(p+"1:{a}") {
			b = tag
		}
	}
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	now := time.Now()
	three := limiter.Params{Burst: 3, Count: 3, Period: time.Hour}
	if _, err := s.Apply(ctx, limiter.Check, now, batchOf("1:{a}", "1:"+b)); err != nil { // loads the script
		t.Fatal(err)
	}
	held := g.fill(t, func() error { return errOf(s.Apply(ctx, limiter.Check, now, batchOf("9:{a}held"))) })
	var batches [][]limiter.Bucket
	const hot = 5
	for range hot {
		batches = append(batches, []limiter.Bucket{bucketOf("1:{a}", three, 1)})
	}
	batches = append(batches,
		[]limiter.Bucket{bucketOf("1:"+b, three, 1)},
		[]limiter.Bucket{bucketOf("2:{a}", three, 1), bucketOf("2:"+b, three, 1)})
	calls, wg := queueCalls(t, s, now, batches...)
	g.release()
	wg.Wait()
	held.Wait()

	var admitted int64
	for i, c := range calls {
		if c.err != nil {
			t.Fatalf("call %d: %v", i, c.err)
		}
		if i < hot && c.written {
			admitted++
		}
		if i >= hot && !c.written {
			t.Errorf("call %d was denied: %+v", i, c.batch)
		}
	}
	if admitted != three.Burst {
		t.Errorf("%d spends of 1:{a} admitted %d, want its burst %d", hot, admitted, three.Burst)
	}
	scripts := g.recorded()
	var slots []uint16
	for _, keys := range scripts {
		slot := redisstore.KeySlot(keys[0])
		for _, k := range keys {
			if redisstore.KeySlot(k) != slot {
				t.Errorf("a script call spans slots: %q", keys)
			}
		}
		slots = append(slots, slot)
	}
	slices.Sort(slots)
	if want := []uint16{redisstore.KeySlot(p + "1:{a}"), redisstore.KeySlot(p + "1:" + b)}; !slices.Equal(slots, sortedSlots(want)) {
		t.Errorf("the queued calls went in script calls %q, want one per slot", scripts)
	}
}

func sortedSlots(s []uint16) []uint16 {
	slices.Sort(s)
	return s
}

// TestClusterStalledMaster: on a Cluster, a call whose buckets are on a
// healthy master is answered while a call on a stalled master is on the
// wire: each master has its own queue.
func TestClusterStalledMaster(t *testing.T) {
	client := clusterClient(t)
	master := masters(t, client)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: 2 * time.Second})
	ctx := context.Background()
	stalled, healthy := "1:{a}", ""
	for i := 0; healthy == ""; i++ {
		if k := fmt.Sprintf("1:{b%d}", i); master(p+k) != master(p+stalled) {
			healthy = k
		}
	}
	// The client learns the slots, and both masters the script.
	if _, err := s.Apply(ctx, limiter.Check, time.Now(), batchOf(stalled, healthy)); err != nil {
		t.Fatal(err)
	}
	node, err := client.MasterForKey(ctx, p+stalled)
	if err != nil {
		t.Fatal(err)
	}
	pauseCluster(t, []string{node.Options().Addr})
	done := make(chan error, 1)
	go func() { done <- errOf(s.Apply(ctx, limiter.Spend, time.Now(), batchOf(stalled))) }()
	for {
		if _, n := redisstore.QueueState(s); n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), batchOf(healthy)); err != nil {
		t.Errorf("a spend on a healthy master while another is stalled: %v", err)
	}
	if err := <-done; !isTimeout(err) {
		t.Errorf("a spend on the stalled master: got %v, want a timeout", err)
	}
}
