package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
)

// patient is the Timeout of the tests that check what a call does, not
// when it gives up: on a loaded machine, under the race detector, a call
// can take longer than DefaultTimeout.
const patient = 10 * time.Second

func TestContract(t *testing.T) {
	client := testenv.Redis(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return harness(t, client, prefix(t, client), true)
	})
}

// TestClusterContract runs the suite on a Cluster, under prefixes that put
// the buckets of each multi-bucket batch on different masters. Concurrent
// batches across slots can deny each other spuriously (see cluster.go), so
// they admit at most, not exactly, the limit.
func TestClusterContract(t *testing.T) {
	client := clusterClient(t)
	master := masters(t, client)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		p := spreadPrefix(t, master)
		t.Cleanup(func() { dropPrefix(t, client, p) })
		return harness(t, client, p, false)
	})
}

// TestClusterHashTagContract runs the suite on a Cluster under a prefix
// with a hash tag, which puts every key in one slot: batches, and leases
// with their records, are then as exact as on a single node.
func TestClusterHashTagContract(t *testing.T) {
	client := clusterClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		p := "{" + testenv.RandomName("rltest") + "}:"
		t.Cleanup(func() { dropPrefix(t, client, p) })
		return harness(t, client, p, true)
	})
}

func harness(t *testing.T, client redis.UniversalClient, prefix string, exact bool) storetest.Harness {
	expiry := func(t *testing.T, key string) (time.Time, bool) {
		ms, err := client.Do(context.Background(), "PEXPIRETIME", key).Int64()
		switch {
		case err != nil:
			t.Fatalf("PEXPIRETIME %s: %v", key, err)
		case ms == -1:
			t.Fatalf("%s never expires", key)
		}
		return time.UnixMilli(ms), ms != -2
	}
	return storetest.Harness{
		Store:  redisstore.New(client, redisstore.Options{Prefix: prefix, Timeout: patient}),
		Expiry: func(t *testing.T, key string) (time.Time, bool) { return expiry(t, prefix+key) },
		RecordExpiry: func(t *testing.T, id string) (time.Time, bool) {
			return expiry(t, redisstore.RecordKey(prefix, id))
		},
		ExpiryMargin: redisstore.DefaultExpiryMargin,
		ExactBatches: exact,
	}
}

// prefix returns a fresh key prefix whose keys are deleted when the test
// ends: some of the suite's buckets would otherwise live for a century.
func prefix(t *testing.T, client redis.UniversalClient) string {
	p := testenv.RandomName("rltest:") + ":"
	t.Cleanup(func() { dropPrefix(t, client, p) })
	return p
}

func dropPrefix(t *testing.T, client redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drop := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, drop)
	} else {
		err = drop(ctx, client.(*redis.Client))
	}
	if err != nil {
		t.Errorf("deleting the keys under %s: %v", prefix, err)
	}
}

// clusterClient returns a client of the test Cluster, made as production
// makes it.
func clusterClient(t testing.TB) *redis.ClusterClient {
	addrs := testenv.RedisCluster(t)
	opts, err := redisstore.ParseURL("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewUniversalClient(opts).(*redis.ClusterClient)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// masters returns the id of the master that serves a key.
func masters(t testing.TB, c *redis.ClusterClient) func(key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return func(key string) string {
		slot := int64(redisstore.KeySlot(key))
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > slot || slot > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						return n.ID
					}
				}
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
}

// spreadPrefix returns a prefix under which the two buckets of each pair
// that storetest spends, shadows or resets together sit on different
// masters, and the ten buckets of its big batch on all three: the suite
// then crosses slots and nodes wherever a batch can.
func spreadPrefix(t *testing.T, master func(string) string) string {
	pairs := [][2]string{{"1:pair", "2:pair"}, {"1:real", "2:shadow"}, {"1:reset", "2:reset"}}
	for range 1000 {
		p := testenv.RandomName("rltest:") + ":"
		spread := true
		for _, pair := range pairs {
			spread = spread && master(p+pair[0]) != master(p+pair[1])
		}
		nodes := map[string]bool{}
		for i := 1; i <= 10; i++ {
			nodes[master(fmt.Sprintf("%s%d:batch", p, i))] = true
		}
		if spread && len(nodes) == 3 {
			return p
		}
	}
	t.Fatal("no prefix in 1000 spreads the batches over the masters")
	return ""
}

// roundTrips counts the commands and pipelines a client sends: on a single
// node, each is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}

var perSecond = limiter.Params{Burst: 10, Count: 10, Period: time.Second}

func batchOf(keys ...string) []limiter.Bucket {
	batch := make([]limiter.Bucket, len(keys))
	for i, k := range keys {
		batch[i] = limiter.Bucket{Key: []byte(k), Rate: perSecond.Rate(), Cost: 1}
	}
	return batch
}

// TestOneRoundTrip: every call on a single node is one script call, once
// the server has the script cached.
func TestOneRoundTrip(t *testing.T) {
	client := testenv.Redis(t)
	var trips roundTrips
	client.AddHook(&trips)
	s := redisstore.New(client, redisstore.Options{Prefix: prefix(t, client), Timeout: patient})
	ctx := context.Background()
	batch := batchOf("1:a", "2:b", "3:c")
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), batch); err != nil { // may load the script
		t.Fatal(err)
	}
	// More keys than one script call takes: a pipeline of two, which the
	// client may first dial a connection for.
	many := func() error {
		batches := make([]limiter.Batch, 200)
		for i := range batches {
			batches[i] = limiter.Batch{Op: []limiter.Op{limiter.Spend, limiter.Check, limiter.Refund}[i%3], Buckets: batchOf(fmt.Sprintf("1:%d", i%70))}
		}
		s.ApplyMany(ctx, time.Now(), batches)
		for _, b := range batches {
			if b.Err != nil {
				return b.Err
			}
		}
		return nil
	}
	if err := many(); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"spend", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), batch)) }},
		{"spend of one bucket", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), batch[:1])) }},
		{"refund", func() error { return errOf(s.Apply(ctx, limiter.Refund, time.Now(), batch)) }},
		{"settle", func() error { return errOf(s.Apply(ctx, limiter.Settle, time.Now(), batch)) }},
		{"check", func() error { return errOf(s.Apply(ctx, limiter.Check, time.Now(), batch)) }},
		{"many batches", many},
		{"reset", func() error { return s.Reset(ctx, []string{"1:a", "2:b", "3:c"}) }},
	} {
		trips.n.Store(0)
		if err := call.f(); err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		if n := trips.n.Load(); n != 1 {
			t.Errorf("a %s took %d round trips, want 1", call.name, n)
		}
	}
}

// TestScriptFlushed: a server that lost the script (a restart, a failover,
// SCRIPT FLUSH) is sent it again, and a spend still works.
func TestScriptFlushed(t *testing.T) {
	srv := testenv.RedisServer(t) // SCRIPT FLUSH must not disturb other tests
	client := clientOn(t, srv)
	var trips roundTrips
	client.AddHook(&trips)
	s := redisstore.New(client, redisstore.Options{Timeout: patient})
	ctx := context.Background()
	batch := batchOf("1:flush")
	for i := range 3 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if _, err := s.Apply(ctx, limiter.Spend, now, batch); err != nil {
			t.Fatalf("spend %d after SCRIPT FLUSH: %v", i, err)
		}
		if _, o := limiter.SpendStep(batch[0].TAT, now.UnixMicro(), batch[0].Rate, 1); !o.Allowed || o.Remaining != int64(9-i) {
			t.Fatalf("spend %d after SCRIPT FLUSH: %+v", i, o)
		}
	}
	trips.n.Store(0)
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), batch); err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 1 {
		t.Fatalf("after the script was sent again a spend took %d round trips, want 1", n)
	}
}

// TestClusterScriptFlushed: the pipelined calls of a batch across slots
// recover from a node without the script too.
func TestClusterScriptFlushed(t *testing.T) {
	client := clusterClient(t)
	master := masters(t, client)
	p := spreadPrefix(t, master)
	t.Cleanup(func() { dropPrefix(t, client, p) })
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	for i := range 3 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		batch := batchOf("1:pair", "2:pair")
		now := time.Now()
		if _, err := s.Apply(ctx, limiter.Spend, now, batch); err != nil {
			t.Fatalf("spend %d after SCRIPT FLUSH: %v", i, err)
		}
		for _, b := range batch {
			if _, o := limiter.SpendStep(b.TAT, now.UnixMicro(), b.Rate, 1); !o.Allowed || o.Remaining != int64(9-i) {
				t.Fatalf("spend %d of %s after SCRIPT FLUSH: %+v", i, b.Key, o)
			}
		}
	}
}

// TestClusterDeniedBatchGivesBack: when one slot denies, the slots already
// spent get their tokens back, and a shadow bucket that was denied there,
// and so not spent, gets nothing.
func TestClusterDeniedBatchGivesBack(t *testing.T) {
	client := clusterClient(t)
	p := prefix(t, client)
	if redisstore.KeySlot(p+"1:{a}") == redisstore.KeySlot(p+"3:{b}") {
		t.Fatal("the hash tags {a} and {b} share a slot")
	}
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	now := time.Now()
	one := limiter.Params{Burst: 1, Count: 1, Period: time.Hour}
	bucket := func(key string, shadow bool) limiter.Bucket {
		return limiter.Bucket{Key: []byte(key), Rate: one.Rate(), Cost: 1, Shadow: shadow}
	}
	// Empty the shadow bucket of slot {a} and the bucket of slot {b}.
	if _, err := s.Apply(ctx, limiter.Spend, now, []limiter.Bucket{bucket("2:{a}", true), bucket("3:{b}", false)}); err != nil {
		t.Fatal(err)
	}
	before := []limiter.Bucket{bucket("1:{a}", false), bucket("2:{a}", true), bucket("3:{b}", false)}
	if _, err := s.Apply(ctx, limiter.Check, time.Now(), before); err != nil {
		t.Fatal(err)
	}
	batch := []limiter.Bucket{bucket("1:{a}", false), bucket("2:{a}", true), bucket("3:{b}", false)}
	if _, err := s.Apply(ctx, limiter.Spend, now, batch); err != nil {
		t.Fatal(err)
	}
	if _, o := limiter.SpendStep(batch[2].TAT, now.UnixMicro(), batch[2].Rate, 1); o.Allowed {
		t.Fatalf("the empty bucket of slot {b} allowed: %+v", o)
	}
	after := []limiter.Bucket{bucket("1:{a}", false), bucket("2:{a}", true), bucket("3:{b}", false)}
	if _, err := s.Apply(ctx, limiter.Check, time.Now(), after); err != nil {
		t.Fatal(err)
	}
	if after[0].TAT > now.UnixMicro() {
		t.Errorf("1:{a} kept the token of the denied batch: TAT %d at %d", after[0].TAT, now.UnixMicro())
	}
	if after[1].TAT != before[1].TAT {
		t.Errorf("the denied shadow bucket 2:{a} was given back a token it never spent: TAT %d, before %d", after[1].TAT, before[1].TAT)
	}
	if after[2].TAT != before[2].TAT {
		t.Errorf("the denying bucket 3:{b} changed: TAT %d, before %d", after[2].TAT, before[2].TAT)
	}
}

// TestStalledServer: a server that stops answering makes a call fail at its
// deadline instead of hanging, which lets the Limiter apply its fail mode.
func TestStalledServer(t *testing.T) {
	srv := testenv.RedisServer(t)
	client := clientOn(t, srv)
	s := redisstore.New(client, redisstore.Options{Timeout: 100 * time.Millisecond})
	// setup shares the connection and the cached script, and may be slow.
	setup := redisstore.New(client, redisstore.Options{Timeout: patient})
	ctx := context.Background()
	if _, err := setup.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:stall")); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	for _, call := range append([]storeCall{
		{"spend", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:stall"))) }},
		{"refund", func() error { return errOf(s.Apply(ctx, limiter.Refund, time.Now(), batchOf("1:stall"))) }},
		{"check", func() error { return errOf(s.Apply(ctx, limiter.Check, time.Now(), batchOf("1:stall"))) }},
		{"reset", func() error { return s.Reset(ctx, []string{"1:stall"}) }},
		{"ping", func() error { return s.Ping(ctx) }},
	}, leaseCalls(ctx, s, "1:stall")...) {
		start := time.Now()
		err := call.f()
		took := time.Since(start)
		if !isTimeout(err) {
			t.Errorf("%s on a stalled server: got %v, want a timeout", call.name, err)
		}
		// A liveness check, not a speed claim: the call did not hang.
		if took > 5*time.Second {
			t.Errorf("%s on a stalled server returned after %v", call.name, took)
		}
	}
	srv.Resume()
	if _, err := setup.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:stall")); err != nil {
		t.Fatalf("spend after the server resumed: %v", err)
	}
}

// TestClusterStalled: on a Cluster whose nodes stop answering, every call
// fails at its deadline too, even from a client that has not yet learnt
// the server's command table, which go-redis would fetch with a deadline
// of its own.
func TestClusterStalled(t *testing.T) {
	addrs := testenv.RedisCluster(t)
	client := clusterClient(t)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: 100 * time.Millisecond})
	setup := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	one, three := batchOf("1:stall"), batchOf("1:stall", "2:stall", "3:stall")
	// The client learns the Cluster's slots, and nothing else.
	if _, err := setup.Apply(ctx, limiter.Check, time.Now(), three); err != nil {
		t.Fatal(err)
	}
	pauseCluster(t, addrs)
	for _, call := range append([]storeCall{
		{"spend", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), one)) }},
		{"spend across slots", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), three)) }},
		{"refund", func() error { return errOf(s.Apply(ctx, limiter.Refund, time.Now(), one)) }},
		{"check", func() error { return errOf(s.Apply(ctx, limiter.Check, time.Now(), three)) }},
		{"reset", func() error { return s.Reset(ctx, []string{"1:stall", "2:stall"}) }},
		{"ping", func() error { return s.Ping(ctx) }},
	}, leaseCalls(ctx, s, "1:stall")...) {
		start := time.Now()
		err := call.f()
		took := time.Since(start)
		if !isTimeout(err) {
			t.Errorf("%s on a stalled Cluster: got %v, want a timeout", call.name, err)
		}
		// A liveness check, not a speed claim: go-redis's own deadline for
		// its command table is 5 s.
		if took > 3*time.Second {
			t.Errorf("%s on a stalled Cluster returned after %v", call.name, took)
		}
	}
}

// pauseCluster stops the processes of the shared Cluster (SIGSTOP) until
// the test ends.
func pauseCluster(t *testing.T, addrs []string) {
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		info, err := c.InfoMap(context.Background(), "server").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(info["Server"]["process_id"])
		if err != nil {
			t.Fatalf("the process id of %s: %v", addr, err)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resuming %s: %v", addr, err)
			}
		})
	}
}

// TestStoppedServer: a server that is gone gives errors, and the store
// works again once it is back.
func TestStoppedServer(t *testing.T) {
	srv := testenv.RedisServer(t)
	s := redisstore.New(clientOn(t, srv), redisstore.Options{Timeout: patient})
	ctx := context.Background()
	if _, err := s.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:stop")); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	for _, call := range append([]storeCall{
		{"spend", func() error { return errOf(s.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:stop"))) }},
		{"refund", func() error { return errOf(s.Apply(ctx, limiter.Refund, time.Now(), batchOf("1:stop"))) }},
		{"check", func() error { return errOf(s.Apply(ctx, limiter.Check, time.Now(), batchOf("1:stop"))) }},
		{"reset", func() error { return s.Reset(ctx, []string{"1:stop"}) }},
		{"ping", func() error { return s.Ping(ctx) }},
	}, leaseCalls(ctx, s, "1:stop")...) {
		err := call.f()
		if err == nil {
			t.Fatalf("%s on a stopped server succeeded", call.name)
		}
		if !strings.HasPrefix(err.Error(), "redis "+call.name+": ") {
			t.Errorf("%s: the error %q does not name the operation", call.name, err)
		}
	}
	srv.Start()
	// After repeated dial failures go-redis fails fast, without dialling,
	// until a probe it makes every second connects again.
	batch := batchOf("1:stop")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := s.Apply(ctx, limiter.Spend, time.Now(), batch)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spend 10 s after the server came back: %v", err)
		}
	}
	if batch[0].TAT != 0 {
		t.Fatalf("a restarted empty server reported TAT %d", batch[0].TAT)
	}
}

// clientOn returns a client of a private server, made as production makes
// it.
func clientOn(t *testing.T, srv *testenv.RedisProcess) redis.UniversalClient {
	opts, err := redisstore.ParseURL("redis://" + srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewUniversalClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// errOf drops what a call reports besides its error.
func errOf(_ bool, err error) error { return err }

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// TestNewNeedsContextTimeouts: a client that ignores context deadlines would
// let a stalled server hang every decision, so New refuses it.
func TestNewNeedsContextTimeouts(t *testing.T) {
	for _, client := range []redis.UniversalClient{
		redis.NewClient(&redis.Options{}),
		redis.NewClusterClient(&redis.ClusterOptions{}),
	} {
		func() {
			defer client.Close()
			defer func() {
				if recover() == nil {
					t.Errorf("New accepted a %T without ContextTimeoutEnabled", client)
				}
			}()
			redisstore.New(client, redisstore.Options{})
		}()
	}
}

// TestStoredForm: a TAT is stored as the decimal digits of its
// microseconds, which any reader parses exactly, and its key expires
// ExpiryMargin after the bucket is full again, rounded up to the
// millisecond Redis keeps.
func TestStoredForm(t *testing.T) {
	client := testenv.Redis(t)
	p := prefix(t, client)
	const margin = 5 * time.Second
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient, ExpiryMargin: margin})
	ctx := context.Background()
	// 1 per 7 s: the TAT lands on no whole millisecond.
	rate := limiter.Params{Burst: 3, Count: 3, Period: 21*time.Second + 1234*time.Microsecond}.Rate()
	now := time.Now()
	batch := []limiter.Bucket{{Key: []byte("1:form"), Rate: rate, Cost: 2}}
	if _, err := s.Apply(ctx, limiter.Spend, now, batch); err != nil {
		t.Fatal(err)
	}
	tat, _ := limiter.SpendStep(batch[0].TAT, now.UnixMicro(), rate, 2)
	raw, err := client.Get(ctx, p+"1:form").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(tat, 10); raw != want {
		t.Fatalf("stored %q, want %q", raw, want)
	}
	at, err := client.Do(ctx, "PEXPIRETIME", p+"1:form").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := (tat + margin.Microseconds() + 999) / 1000; at != want {
		t.Fatalf("the key expires at %d ms, want %d (TAT %d µs + %v, rounded up)", at, want, tat, margin)
	}
	// A TAT with trailing zeros, which a float format would shorten.
	round := time.Unix(now.Unix()+1, 0)
	batch = []limiter.Bucket{{Key: []byte("1:round"), Rate: limiter.Params{Burst: 1, Count: 1, Period: time.Second}.Rate(), Cost: 1}}
	if _, err := s.Apply(ctx, limiter.Spend, round, batch); err != nil {
		t.Fatal(err)
	}
	if raw, err := client.Get(ctx, p+"1:round").Result(); err != nil || raw != strconv.FormatInt(round.UnixMicro()+1_000_000, 10) {
		t.Fatalf("stored %q (%v), want %d", raw, err, round.UnixMicro()+1_000_000)
	}
}
