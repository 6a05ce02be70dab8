package testenv_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

func TestRedis(t *testing.T) {
	c := testenv.Redis(t)
	key := testenv.RandomName("testenv:")
	ctx := context.Background()
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisServerLifecycle: each fault a test can inject shows to a client
// as it would in production, and the server comes back on its address.
func TestRedisServerLifecycle(t *testing.T) {
	srv := testenv.RedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	// A server that should answer gets seconds to do it, on a loaded
	// machine; one that should not is given up on sooner.
	ping := func(wait time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	const answers, silent = 10 * time.Second, 200 * time.Millisecond
	if err := ping(answers); err != nil {
		t.Fatalf("a started server does not answer: %v", err)
	}
	srv.Pause()
	if err := ping(silent); err == nil {
		t.Fatal("a paused server answered")
	}
	srv.Resume()
	if err := ping(answers); err != nil {
		t.Fatalf("a resumed server does not answer: %v", err)
	}
	srv.Stop()
	if err := ping(silent); err == nil {
		t.Fatal("a stopped server answered")
	}
	srv.Stop() // stopping twice is harmless
	srv.Start()
	if err := ping(answers); err != nil {
		t.Fatalf("a restarted server does not answer: %v", err)
	}
	srv.Pause() // the cleanup kills a paused server too
}

func TestRedisCluster(t *testing.T) {
	addrs := testenv.RedisCluster(t)
	if len(addrs) != 3 {
		t.Fatalf("got %d addresses, want 3", len(addrs))
	}
	if again := testenv.RedisCluster(t); strings.Join(again, ",") != strings.Join(addrs, ",") {
		t.Fatalf("a second call started another cluster: %v, then %v", addrs, again)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	covered := int64(0)
	for _, sh := range shards {
		for _, r := range sh.Slots {
			covered += r.End - r.Start + 1
		}
		if len(sh.Nodes) != 1 || sh.Nodes[0].Role != "master" {
			t.Errorf("a shard has nodes %+v, want a master alone", sh.Nodes)
		}
	}
	if len(shards) != 3 || covered != 16384 {
		t.Fatalf("%d shards cover %d slots, want 3 covering 16384", len(shards), covered)
	}
}

// TestRedisSentinel: the Sentinels promote a replica when the primary is
// killed, and name it from then on.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	s := testenv.NewRedisSentinel(t)
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0], ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	primary := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		addr, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil {
			return err.Error()
		}
		return net.JoinHostPort(addr[0], addr[1])
	}
	if got := primary(); got != s.Primary.Addr() {
		t.Fatalf("the Sentinels name %s, want the primary %s", got, s.Primary.Addr())
	}
	if !strings.HasPrefix(s.URL(), "redis+sentinel://"+s.Sentinels[0]+",") || !strings.HasSuffix(s.URL(), "/"+s.MasterName) {
		t.Errorf("URL %s", s.URL())
	}
	killed := time.Now()
	s.Primary.Stop()
	for p := primary(); p != s.Replicas[0].Addr() && p != s.Replicas[1].Addr(); p = primary() {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no replica promoted within 30s of the primary's death: the Sentinels name %s", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the Sentinels named a replica %v after the primary was killed", time.Since(killed).Round(time.Millisecond))
}

// TestRedisReplicatedCluster: every shard is a primary and its replica,
// and a primary killed is replaced by its replica.
func TestRedisReplicatedCluster(t *testing.T) {
	t.Parallel()
	rc := testenv.NewRedisReplicatedCluster(t)
	if len(rc.Primaries) != 3 || len(rc.Replicas) != 3 {
		t.Fatalf("%d primaries and %d replicas, want 3 and 3", len(rc.Primaries), len(rc.Replicas))
	}
	primary, replica := rc.Shard(t, "{shard}key")
	survivor := rc.Primaries[0]
	if survivor == primary {
		survivor = rc.Primaries[1]
	}
	c := redis.NewClient(&redis.Options{Addr: survivor.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	killed := time.Now()
	primary.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		shards, err := c.ClusterShards(ctx).Result()
		cancel()
		promoted := false
		for _, sh := range shards {
			for _, n := range sh.Nodes {
				promoted = promoted || n.Role == "master" && n.Health == "online" && net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) == replica.Addr()
			}
		}
		if err == nil && promoted {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("the replica %s not promoted within 30s of its primary's death: %v %+v", replica.Addr(), err, shards)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the cluster promoted the replica %v after its primary was killed", time.Since(killed).Round(time.Millisecond))
}
