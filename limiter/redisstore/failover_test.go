package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// newClient returns a client for a RATELIMIT_REDIS_URL, made as
// production makes it, closed when the test ends.
func newClient(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	opts, err := redisstore.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewUniversalClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// hourly buckets refill one token an hour: nothing refills during a test.
var hourly = limiter.Params{Burst: 2, Count: 1, Period: time.Hour}

// TestWaitReplicas: with WaitReplicas, a write that takes tokens or holds
// units is answered once the replica has it, and fails with
// ErrNotReplicated while the replica does not answer; denials, checks,
// reads and writes that give back are answered as they are. On a single
// node and on a Cluster, where WAIT must reach the master of the slot.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	t.Run("node", func(t *testing.T) {
		t.Parallel()
		primary := testenv.RedisServer(t)
		replica := testenv.RedisReplica(t, primary)
		testWaitReplicas(t, newClient(t, "redis://"+primary.Addr()), primary, replica, false, testenv.RandomName("rltest:")+":")
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		rc := testenv.NewRedisReplicatedCluster(t)
		prefix := "{" + testenv.RandomName("rltest") + "}:"
		primary, replica := rc.Shard(t, prefix)
		testWaitReplicas(t, newClient(t, rc.URL()), primary, replica, true, prefix)
	})
}

func testWaitReplicas(t *testing.T, client redis.UniversalClient, primary, replica *testenv.RedisProcess, cluster bool, prefix string) {
	ctx := context.Background()
	// Long enough for a replica on a loaded machine; the calls that time
	// out take it each.
	const waitTimeout = time.Second
	logs := &testenv.LockedBuffer{}
	waiting := redisstore.New(client, redisstore.Options{Prefix: prefix, Timeout: patient, WaitReplicas: 1, WaitTimeout: waitTimeout,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	plain := redisstore.New(client, redisstore.Options{Prefix: prefix, Timeout: patient})
	if got := waiting.Topology().WaitReplicas; got != 1 {
		t.Errorf("Topology().WaitReplicas = %d, want 1", got)
	}
	apply := func(s limiter.Store, op limiter.Op, key string, cost, reserved int64) (bool, error) {
		return s.Apply(ctx, op, time.Now(), []limiter.Bucket{{Key: []byte(key), Rate: hourly.Rate(), Cost: cost, Reserved: reserved}})
	}
	lease := func(key string) []limiter.LeaseBucket {
		return []limiter.LeaseBucket{{Key: []byte(key), Burst: 5, Cost: 1}}
	}
	acquire := func(s limiter.Store, key string) (limiter.LeaseRecord, bool, error) {
		rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: time.Now().Add(time.Hour).UnixMicro(), MaxTTL: time.Hour}
		ok, err := s.Acquire(ctx, time.Now(), &rec, lease(key))
		return rec, ok, err
	}
	renew := func(s limiter.Store, id string) error {
		_, err := s.Renew(ctx, time.Now(), id, func(limiter.LeaseRecord) (int64, error) { return time.Now().Add(time.Hour).UnixMicro(), nil })
		return err
	}

	// The replica answers: a spend and an acquire are on it when they are
	// answered.
	if ok, err := apply(waiting, limiter.Spend, "1:acked", 1, 0); !ok || err != nil {
		t.Fatalf("a spend while the replica answers: %v %v", ok, err)
	}
	rec, ok, err := acquire(waiting, "2:acked")
	if !ok || err != nil {
		t.Fatalf("an acquire while the replica answers: %v %v", ok, err)
	}
	for _, key := range []string{prefix + "1:acked", prefix + "2:acked", redisstore.RecordKey(prefix, rec.ID)} {
		if !onReplica(t, replica, cluster, key) {
			t.Errorf("%s was answered before the replica had it", key)
		}
	}

	replica.Pause()
	defer replica.Resume()
	notReplicated := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, redisstore.ErrNotReplicated) || !errors.Is(err, limiter.ErrNotDurable) {
			t.Errorf("%s while the replica does not answer: %v, want ErrNotReplicated", what, err)
		}
	}
	answered := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s while the replica does not answer: %v, want no error", what, err)
		}
	}
	_, err = apply(waiting, limiter.Spend, "1:lost", 1, 0)
	notReplicated("a spend", err)
	if n, err := client.Exists(ctx, prefix+"1:lost").Result(); n != 1 || err != nil {
		t.Errorf("the spend that failed is not on the primary: %d %v", n, err)
	}
	_, err = apply(waiting, limiter.Settle, "1:charged", 3, 1)
	notReplicated("a settle that charges", err)
	_, _, err = acquire(waiting, "2:lost")
	notReplicated("an acquire", err)
	notReplicated("a renewal", renew(waiting, rec.ID))

	// The spend of 1:lost and the charge of 1:charged were made on the
	// primary: a spend of two more on either is denied, and a denial
	// waits for nothing.
	ok, err = apply(waiting, limiter.Spend, "1:lost", 2, 0)
	answered("a denied spend", err)
	if ok {
		t.Error("a spend beyond the burst was allowed")
	}
	// Reads send no WAIT: it would last the whole timeout.
	waits := waitCalls(t, primary)
	_, err = apply(waiting, limiter.Check, "1:lost", 1, 0)
	answered("a check", err)
	answered("a read of held units", waiting.Held(ctx, time.Now(), lease("2:acked")))
	if n := waitCalls(t, primary) - waits; n != 0 {
		t.Errorf("a check and a read of held units sent %d WAIT", n)
	}
	_, err = apply(waiting, limiter.Refund, "1:lost", 1, 0)
	answered("a refund", err)
	_, err = apply(waiting, limiter.Settle, "1:charged", 0, 1)
	answered("a settle that gives back", err)
	_, err = waiting.Release(ctx, time.Now(), rec.ID)
	answered("a release", err)
	// Without the option, nothing waits for the replica.
	_, err = apply(plain, limiter.Spend, "1:plain", 1, 0)
	answered("a spend without WaitReplicas", err)
	_, _, err = acquire(plain, "2:plain")
	answered("an acquire without WaitReplicas", err)

	replica.Resume()
	if ok, err := apply(waiting, limiter.Spend, "1:again", 1, 0); !ok || err != nil {
		t.Fatalf("a spend once the replica answers again: %v %v", ok, err)
	}
	// The episode is logged once when it starts and once when it ends,
	// not for each of the writes it failed.
	for msg, want := range map[string]int{"the replicas do not acknowledge writes in time": 1, "the replicas acknowledge writes again": 1} {
		if n := strings.Count(logs.String(), msg); n != want {
			t.Errorf("%d log lines with %q, want %d; the log:\n%s", n, msg, want, logs.String())
		}
	}
}

// waitCalls returns how many WAIT commands the server has run.
func waitCalls(t *testing.T, server *testenv.RedisProcess) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.InfoMap(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", server.Addr(), err)
	}
	calls, _, _ := strings.Cut(strings.TrimPrefix(info["Commandstats"]["cmdstat_wait"], "calls="), ",")
	n, _ := strconv.ParseInt(calls, 10, 64)
	return n
}

// onReplica reports whether key is on the replica; a Cluster's replica
// serves reads only on a connection that asked for READONLY.
func onReplica(t *testing.T, replica *testenv.RedisProcess, cluster bool, key string) bool {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: replica.Addr(), ContextTimeoutEnabled: true, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cluster {
		if err := c.ReadOnly(ctx).Err(); err != nil {
			t.Fatalf("READONLY on %s: %v", replica.Addr(), err)
		}
	}
	n, err := c.Exists(ctx, key).Result()
	if err != nil {
		t.Fatalf("EXISTS on the replica %s: %v", replica.Addr(), err)
	}
	return n == 1
}

// TestSentinelFailover: a Node on a Sentinel's primary follows the
// replica the Sentinels promote when the primary dies, without a new
// client; its Topology and log say so; and what the replicas acknowledged
// before is there after: a spend and a lease. The new primary's replica,
// the other, acknowledges the writes after.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	set := testenv.NewRedisSentinel(t)
	logs := &testenv.LockedBuffer{}
	s := redisstore.New(newClient(t, set.URL()), redisstore.Options{Prefix: testenv.RandomName("rltest:") + ":", Timeout: time.Second,
		WaitReplicas: 1, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	ctx := context.Background()
	spend := func(key string, cost int64) (bool, error) {
		return s.Apply(ctx, limiter.Spend, time.Now(), []limiter.Bucket{{Key: []byte(key), Rate: hourly.Rate(), Cost: cost}})
	}
	if ok, err := spend("1:before", 2); !ok || err != nil {
		t.Fatalf("a spend before the failover: %v %v", ok, err)
	}
	rec := acquire(t, s, time.Now(), time.Hour, limiter.LeaseBucket{Key: []byte("2:before"), Burst: 1, Cost: 1})
	if got := s.Topology(); !slices.Equal(got.Primaries, []string{set.Primary.Addr()}) || got.Changes != 0 || !got.ChangedAt.IsZero() {
		t.Fatalf("the topology before the failover: %+v, want the primary %s and no change", got, set.Primary.Addr())
	}

	killed := time.Now()
	set.Primary.Stop()
	took := followFailover(t, func() error { return errOf(spend("1:after", 1)) })
	t.Logf("the store answered again %v after its primary was killed", took.Round(time.Millisecond))

	got := s.Topology()
	if len(got.Primaries) != 1 || got.Primaries[0] != set.Replicas[0].Addr() && got.Primaries[0] != set.Replicas[1].Addr() ||
		got.Changes != 1 || got.ChangedAt.Before(killed) {
		t.Fatalf("the topology after the failover: %+v, want a replica, one change after %v", got, killed)
	}
	checkSwitchLogged(t, logs, set.Primary.Addr(), got.Primaries[0])
	// The bucket spent before is still empty, and the lease still held.
	if ok, err := spend("1:before", 1); ok || err != nil {
		t.Errorf("a spend on the bucket emptied before the failover: %v %v, want denied", ok, err)
	}
	if _, err := s.Renew(ctx, time.Now(), rec.ID, func(limiter.LeaseRecord) (int64, error) { return time.Now().Add(time.Hour).UnixMicro(), nil }); err != nil {
		t.Errorf("renewing the lease acquired before the failover: %v", err)
	}
}

// TestClusterFailover: a Cluster store follows the replica promoted when
// the master of its slot dies, without a new client and without a Ping
// (which reloads the client's map of slots): go-redis alone would go on
// calling the dead master until its periodic reload, a minute later.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	rc := testenv.NewRedisReplicatedCluster(t)
	prefix := "{" + testenv.RandomName("rltest") + "}:"
	primary, replica := rc.Shard(t, prefix)
	logs := &testenv.LockedBuffer{}
	s := redisstore.New(newClient(t, rc.URL()), redisstore.Options{Prefix: prefix, Timeout: time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	spend := func() error {
		return errOf(s.Apply(context.Background(), limiter.Spend, time.Now(), []limiter.Bucket{{Key: []byte("1:a"), Rate: hourly.Rate(), Cost: 1}}))
	}
	if err := spend(); err != nil {
		t.Fatalf("a spend before the failover: %v", err)
	}
	killed := time.Now()
	primary.Stop()
	took := followFailover(t, spend)
	t.Logf("the store answered again %v after the master of its slot was killed", took.Round(time.Millisecond))
	// The store sees the replacement at the first call that its client's
	// map of slots sends to the new master: the map may change while a
	// call is under way, so that call may have been the one that
	// succeeded, or the next.
	for i := 0; i < 10 && s.Topology().Changes == 0; i++ {
		if err := spend(); err != nil {
			t.Fatalf("a spend after the failover: %v", err)
		}
	}
	if got := s.Topology(); got.Changes != 1 || got.ChangedAt.Before(killed) || !slices.Contains(got.Primaries, replica.Addr()) || slices.Contains(got.Primaries, primary.Addr()) {
		t.Errorf("the topology after the failover: %+v, want one change to %s", got, replica.Addr())
	}
	checkSwitchLogged(t, logs, primary.Addr(), replica.Addr())
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping after the failover: %v", err)
	}
	if got := s.Topology(); len(got.Primaries) != 3 || !slices.Contains(got.Primaries, replica.Addr()) || slices.Contains(got.Primaries, primary.Addr()) {
		t.Errorf("the primaries a Ping found after the failover: %v", got.Primaries)
	}
}

// followFailover calls f until it succeeds, which it must within 30 s, and
// returns how long that took.
func followFailover(t *testing.T, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the store does not answer 30s after its primary was killed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkSwitchLogged fails the test unless the log has one line for the
// switch from one primary to the other.
func checkSwitchLogged(t *testing.T, logs *testenv.LockedBuffer, from, to string) {
	t.Helper()
	want := `"msg":"the store's primary changed","from":"` + from + `","to":"` + to + `"`
	if n := strings.Count(logs.String(), want); n != 1 {
		t.Errorf("%d log lines with %s, want 1; the log:\n%s", n, want, logs.String())
	}
}
