// Package redisstore keeps bucket TATs in Redis, so that every replica of
// the service shares them: limiter.Stores on go-redis v9, Node for a single
// node or a Sentinel-managed primary, Cluster for a Redis Cluster.
//
// Each call's batch is read, decided by the step of limiter.StepBatch and
// written by one Lua script, atomically; the store then computes each
// bucket's decision from the TATs the script read, with limiter.StepBatch
// itself, and checks that it agrees with the script. The calls made at the
// same time share script calls and round trips (queue.go): one script call
// runs the batches of many calls one after the other, each as atomic as
// alone. A TAT is stored as a decimal string of Unix microseconds under
// Prefix + bucket key, and the key expires when its bucket is full again
// (plus ExpiryMargin), so an idle bucket costs no memory. The leases of
// concurrency limits are kept beside them by a script of their own
// (lease.go).
//
// On a Redis Cluster a script can only touch one hash slot, so a batch
// whose keys span slots is split into one part per slot, each part going
// into its slot's script call, all of them sent in one pipeline. Each slot
// stays atomic, and a spend across slots still never admits more than a
// limit allows: when one slot denies, the slots already spent are
// refunded, and until then concurrent requests on those buckets may be
// denied spuriously. cluster.go states the details. A Prefix with a hash
// tag keeps every batch in one slot, and atomic.
//
// Replication is asynchronous: a failover that promotes a replica forgets
// the writes the replica had not received, and with them decisions already
// answered. Options.WaitReplicas makes the writes that take tokens wait for
// the replicas' acknowledgement (failover.go), and a store tells where its
// writes go and when that changed (Topology).
package redisstore

import (
	"context"
	"fmt"
	"log/slog"
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
	// DefaultWaitTimeout bounds the wait for the replicas when Options
	// asks for one and leaves WaitTimeout zero: a replica in the same
	// region acknowledges within milliseconds, so one that takes longer is
	// behind or gone.
	DefaultWaitTimeout = 50 * time.Millisecond
)

// Options configure a store.
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
	// WaitReplicas, when above 0, makes every round trip whose writes
	// take tokens or hold units (spends, settles that charge, acquires,
	// renewals) wait until that many replicas have acknowledged them, so
	// that a decision answered survives a failover; failover.go says what
	// happens when they do not acknowledge in time. 0 waits for none: a
	// failover may then forget the writes of the last replication lag.
	WaitReplicas int
	// WaitTimeout bounds that wait, in whole milliseconds (Redis's WAIT);
	// DefaultWaitTimeout when zero or negative. It should be well below
	// Timeout, which bounds the whole call.
	WaitTimeout time.Duration
	// Logger receives the changes of primary, and the starts and ends of
	// the replicas' lateness; slog.Default() when nil.
	Logger *slog.Logger
}

// Store is a limiter.Store on Redis that also tells where its writes go.
type Store interface {
	limiter.Store
	// Topology reports the primaries the store writes to, and how often
	// it has seen one replaced.
	Topology() Topology
}

// New returns the store for client, typically made from ParseURL's
// options: a Cluster for a *redis.ClusterClient, else a Node. The client
// must have ContextTimeoutEnabled, as ParseURL sets: without it go-redis
// does not apply context deadlines to the socket and Timeout could not
// bound a call, so New panics on a client it can tell lacks it. Closing the
// client is the caller's business.
func New(client redis.UniversalClient, opts Options) Store {
	if c, ok := client.(*redis.ClusterClient); ok {
		return NewCluster(c, opts)
	}
	return NewNode(client, opts)
}

// config is what both stores share.
type config struct {
	prefix   string
	timeout  time.Duration
	marginUS int64
	// marginArg is marginUS as the script's argument, converted once.
	marginArg any
	// wait is nil unless Options.WaitReplicas asks for replicas.
	wait *replicaWait
	// primaries are those the store has seen its writes go to.
	primaries *primaries
}

func newConfig(opts Options, contextTimeouts bool) config {
	if !contextTimeouts {
		panic("redisstore: the Redis client needs ContextTimeoutEnabled, or Options.Timeout cannot bound a call")
	}
	c := config{prefix: opts.Prefix, timeout: opts.Timeout, marginUS: opts.ExpiryMargin.Microseconds(),
		primaries: &primaries{log: opts.Logger}}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.marginUS <= 0 {
		c.marginUS = DefaultExpiryMargin.Microseconds()
	}
	c.marginArg = c.marginUS
	if c.primaries.log == nil {
		c.primaries.log = slog.Default()
	}
	if opts.WaitReplicas > 0 {
		c.wait = newReplicaWait(opts.WaitReplicas, opts.WaitTimeout, c.primaries.log)
	}
	return c
}

// Topology implements Store.
func (c *config) Topology() Topology {
	t := c.primaries.topology()
	if c.wait != nil {
		t.WaitReplicas = int(c.wait.replicas)
	}
	return t
}

// bounded runs f under the store's timeout and names the operation in its
// error.
func (c *config) bounded(ctx context.Context, op string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return named(op, f(ctx))
}

// named names the operation in err, unless err is nil.
func named(op string, err error) error {
	if err != nil {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	return nil
}

// fullKeys returns keys under the prefix.
func (c *config) fullKeys(keys []string) []string {
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = c.prefix + k
	}
	return full
}
