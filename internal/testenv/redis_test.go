package testenv_test

import (
	"context"
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
