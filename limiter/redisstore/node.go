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
// New says what it needs of it.
func NewNode(client redis.UniversalClient, opts Options) *Node {
	contextTimeouts := true
	if c, ok := client.(*redis.Client); ok {
		contextTimeouts = c.Options().ContextTimeoutEnabled
	}
	s := &Node{config: newConfig(opts, contextTimeouts), client: client, queue: &queue{client: client}}
	s.leases = leases{cfg: &s.config, client: client, slot: oneSlot}
	s.calls.New = func() any { return &scriptCall{parts: make([]part, 1), done: make(chan struct{}, 1)} }
	return s
}

// Apply implements limiter.Store.
func (s *Node) Apply(ctx context.Context, op limiter.Op, now time.Time, batch []limiter.Bucket) (bool, error) {
	b := [1]limiter.Batch{{Op: op, Buckets: batch}}
	s.ApplyMany(ctx, now, b[:])
	return b[0].Written, b[0].Err
}

// ApplyMany implements limiter.Store. The batches go to the queue as one
// call of a part each, so that they share script calls with each other
// and with the calls in flight, one after the other in their order
// (queue.go): one round trip for all of them.
func (s *Node) ApplyMany(ctx context.Context, now time.Time, batches []limiter.Batch) {
	nowUS := now.UnixMicro()
	c := s.calls.Get().(*scriptCall)
	n := 0
	for i := range batches {
		b := &batches[i]
		if len(b.Buckets) == 0 {
			b.Written, b.Err = limiter.StepBatch(b.Op, nowUS, b.Buckets), nil
			continue
		}
		if n == len(c.parts) {
			c.parts = append(c.parts, part{})
		}
		pt := &c.parts[n]
		pt.run = s.run(pt.run, b.Op, nowUS, b.Buckets)
		n++
	}
	if n == 0 {
		s.calls.Put(c)
		return
	}
	// The call's parts are its batches'; those beyond keep their memory
	// for a later call.
	all := c.parts
	c.parts = c.parts[:n]
	c.bound(ctx, s.timeout)
	mine, err := s.queue.do(c)
	j := 0
	for i := range batches {
		b := &batches[i]
		if len(b.Buckets) == 0 {
			continue
		}
		pt := &c.parts[j]
		j++
		err := err
		if err == nil {
			err = pt.err
		}
		if err == nil {
			b.Written, err = decide(b.Op, nowUS, pt.reply, pt.run.keys, b.Buckets)
		}
		b.Err = named(b.Op.String(), err)
	}
	if mine {
		// The call keeps its buffers and timer, not what they point to.
		for i := range c.parts {
			pt := &c.parts[i]
			clear(pt.run.keys)
			clear(pt.run.args)
			pt.reply, pt.err = nil, nil
		}
		c.parts, c.ctx, c.err = all, nil, nil
		s.calls.Put(c)
	}
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
