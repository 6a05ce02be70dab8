// Package redisstore keeps bucket TATs in Redis, so that every replica of
// the service shares them: a limiter.Store on go-redis v9, for a single
// node, a Sentinel-managed primary or a Redis Cluster.
//
// Each call runs one Lua script that reads every bucket of the batch,
// applies limiter.SpendStep or limiter.RefundStep and writes the new TATs,
// atomically and in one round trip, which the calls made at the same time
// share on a single node: they are pipelined (pipeline.go). A TAT is
// stored as a decimal string of Unix microseconds under Prefix + bucket
// key, and the key expires when its bucket is full again (plus
// ExpiryMargin), so an idle bucket costs no memory.
//
// On a Redis Cluster a script can only touch one hash slot, so a batch
// whose keys span slots is split into one script call per slot, sent in
// one pipeline. Each slot stays atomic, and a spend across slots still
// never admits more than a limit allows: when one slot denies, the slots
// already spent are refunded, and until then concurrent requests on those
// buckets may be denied spuriously. cluster.go states the details. A
// Prefix with a hash tag keeps every batch in one slot, and atomic.
package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Defaults of Options.
const (
	// DefaultTimeout bounds a call when Options leaves Timeout zero: a
	// decision that waits longer on Redis is worse than one made by the
	// fail mode.
	DefaultTimeout = 250 * time.Millisecond
	// DefaultExpiryMargin is how long a key outlives its full bucket when
	// Options leaves ExpiryMargin zero; it covers the clock skew between
	// replicas, which compute TATs, and Redis, which expires keys.
	DefaultExpiryMargin = time.Second
)

// Options configure a Store.
type Options struct {
	// Prefix is prepended to every key, so that ratelimitd can share a
	// server ("rl:" in production) and tests can share one (a random
	// prefix each). A prefix with a hash tag, such as "{rl}:", puts every
	// bucket in one Cluster slot: batches stay atomic, and one node holds
	// and serves all buckets.
	Prefix string
	// Timeout bounds each call; a call that would wait longer returns an
	// error, never a silent allow. DefaultTimeout when zero or negative.
	Timeout time.Duration
	// ExpiryMargin is how long after its bucket is full again a key
	// expires. DefaultExpiryMargin when zero or negative.
	ExpiryMargin time.Duration
}

// Store is a limiter.Store on Redis. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	// cluster is client when it is a Cluster client, which routes keys by
	// slot, else nil.
	cluster *redis.ClusterClient
	// pipe sends the script calls of a client that is not a Cluster's.
	pipe     *pipeliner
	script   *redis.Script
	prefix   string
	timeout  time.Duration
	marginUS int64
}

var _ limiter.Store = (*Store)(nil)

// New returns a Store on client: a *redis.Client (single node or Sentinel
// failover) or a *redis.ClusterClient, typically made from ParseURL's
// options. The client must have ContextTimeoutEnabled, as ParseURL sets:
// without it go-redis does not apply context deadlines to the socket and
// Timeout could not bound a call, so New panics on a client it can tell
// lacks it. Closing the client is the caller's business.
func New(client redis.UniversalClient, opts Options) *Store {
	s := &Store{
		client:   client,
		script:   redis.NewScript(batchLua),
		prefix:   opts.Prefix,
		timeout:  opts.Timeout,
		marginUS: opts.ExpiryMargin.Microseconds(),
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.marginUS <= 0 {
		s.marginUS = DefaultExpiryMargin.Microseconds()
	}
	contextTimeouts := true
	switch c := client.(type) {
	case *redis.ClusterClient:
		s.cluster = c
		contextTimeouts = c.Options().ContextTimeoutEnabled
	case *redis.Client:
		contextTimeouts = c.Options().ContextTimeoutEnabled
	}
	if !contextTimeouts {
		panic("redisstore: the Redis client needs ContextTimeoutEnabled, or Options.Timeout cannot bound a call")
	}
	if s.cluster == nil {
		s.pipe = &pipeliner{client: client, script: s.script}
	}
	return s
}

// Spend implements limiter.Store.
func (s *Store) Spend(ctx context.Context, now time.Time, batch []limiter.Bucket) error {
	return s.bounded(ctx, "spend", batch, func(ctx context.Context) error {
		if s.cluster != nil {
			return s.spendBySlot(ctx, now.UnixMicro(), batch)
		}
		_, err := s.eval(ctx, modeSpend, now.UnixMicro(), batch)
		return err
	})
}

// Refund implements limiter.Store.
func (s *Store) Refund(ctx context.Context, now time.Time, batch []limiter.Bucket) error {
	return s.bounded(ctx, "refund", batch, func(ctx context.Context) error {
		if s.cluster != nil {
			return s.evalBySlot(ctx, modeRefund, now.UnixMicro(), batch)
		}
		_, err := s.eval(ctx, modeRefund, now.UnixMicro(), batch)
		return err
	})
}

// Read implements limiter.Store.
func (s *Store) Read(ctx context.Context, batch []limiter.Bucket) error {
	return s.bounded(ctx, "read", batch, func(ctx context.Context) error {
		if s.cluster != nil {
			return s.evalBySlot(ctx, modeRead, 0, batch)
		}
		_, err := s.eval(ctx, modeRead, 0, batch)
		return err
	})
}

// Reset implements limiter.Store.
func (s *Store) Reset(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = s.prefix + k
	}
	var err error
	if s.cluster != nil {
		err = s.deleteBySlot(ctx, full)
	} else {
		err = s.client.Del(ctx, full...).Err()
	}
	if err != nil {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// Ping implements limiter.Store. On a Cluster every master must answer,
// since any of them may hold a bucket.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if s.cluster != nil {
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}

// bounded runs f on a non-empty batch under the store's timeout and names
// the operation in its error.
func (s *Store) bounded(ctx context.Context, op string, batch []limiter.Bucket, f func(context.Context) error) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := f(ctx); err != nil {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	return nil
}
