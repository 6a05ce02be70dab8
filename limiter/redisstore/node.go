package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Node is a limiter.Store on a single Redis node or a Sentinel's primary,
// where every key of a batch is on one server and every call is atomic. It
// is safe for concurrent use.
type Node struct {
	config
	client redis.UniversalClient
	queue  *queue
	// leases answer the LeaseStore methods (lease.go).
	leases
	// calls holds the script calls the queue gave back, so that a
	// decision reuses their memory.
	calls sync.Pool
}

var _ limiter.Store = (*Node)(nil)

// NewNode returns a Node on client, a *redis.Client or a failover client;
// New says what it needs of it. It adds a hook to the client that sees the
// address of every connection it opens (Topology).
func NewNode(client redis.UniversalClient, opts Options) *Node {
	contextTimeouts := true
	if c, ok := client.(*redis.Client); ok {
		contextTimeouts = c.Options().ContextTimeoutEnabled
	}
	s := &Node{config: newConfig(opts, contextTimeouts), client: client}
	s.queue = &queue{client: client, wait: s.wait}
	client.AddHook(dialHook{s.primaries})
	s.leases = leases{cfg: &s.config, client: client, slot: oneSlot,
		send: func(ctx context.Context, runs []scriptRun, wait *replicaWait) ([]*redis.Cmd, error) {
			return evalPipelined(ctx, client, leaseScript, redis.NewCmd, runs, nil, wait)
		}}
	s.calls.New = func() any { return &scriptCall{parts: make([]part, 1), done: make(chan struct{}, 1)} }
	return s
}

// Apply implements limiter.Store.
func (s *Node) Apply(ctx context.Context, op limiter.Op, now time.Time, batch []limiter.Bucket) (bool, error) {
	nowUS := now.UnixMicro()
	if len(batch) == 0 {
		return limiter.StepBatch(op, nowUS, batch), nil
	}
	c := s.calls.Get().(*scriptCall)
	pt := &c.parts[0]
	c.bound(ctx, s.timeout)
	pt.run = s.run(pt.run, op, nowUS, batch)
	mine, err := s.queue.do(c)
	if err == nil {
		err = pt.err
	}
	var commit bool
	if err == nil {
		commit, err = decide(op, nowUS, pt.reply, pt.run.keys, batch, pt.unreplicated)
	}
	if mine {
		// The call keeps its buffers and timer, not what they point to.
		clear(pt.run.keys)
		clear(pt.run.args)
		c.ctx, c.err, pt.reply, pt.err, pt.unreplicated = nil, nil, nil, nil, nil
		s.calls.Put(c)
	}
	return commit, named(op.String(), err)
}

// Reset implements limiter.Store.
func (s *Node) Reset(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return s.bounded(ctx, "reset", func(ctx context.Context) error {
		return s.client.Del(ctx, s.fullKeys(keys)...).Err()
	})
}

// Ping implements limiter.Store.
func (s *Node) Ping(ctx context.Context) error {
	return s.bounded(ctx, "ping", func(ctx context.Context) error { return s.client.Ping(ctx).Err() })
}
