package redisstore

// Redis Cluster lets a script touch the keys of one hash slot only, so on a
// Cluster a batch is split into one group per slot. Each master has a queue
// of its own, so that a stalled master holds up only the calls that wait
// for it; a master's queue joins the groups of the calls in flight by
// slot, one script call per slot, and sends them in one pipeline. A batch
// on several masters waits for each master's round trip, made at the same
// time. What remains atomic:
//
//   - Within a slot, everything: a group is read, decided and written in one
//     step, as on a single node. A batch whose keys share a slot, such as a
//     single bucket or any batch under a Prefix with a hash tag, is as
//     atomic as on a single node.
//   - Across slots, a spend keeps the guarantee that matters: it never
//     admits more than a limit allows. Each group is spent conditionally,
//     on its own buckets; the batch is allowed only if every group was.
//     When a group denies, the groups that were spent are refunded. Between
//     that spend and its refund their tokens are held, so a concurrent
//     request on those buckets can be denied spuriously, never admitted
//     beyond a limit. If the refund fails too (timeout, node down), those
//     tokens stay spent until the buckets refill: conservative. A denial is
//     returned as a denial even then, since failing open on an error would
//     admit the batch.
//   - When a group fails with an error and none denies, a spend refunds the
//     groups that were spent and returns the error; the failed group may
//     or may not have been spent (conservative again), and its buckets
//     report TAT 0.
//   - Refunds, settles and checks work per slot: a refund or settle that
//     fails on one slot may have been applied on others, and a check may
//     see the slots at slightly different instants.
//
// Many batches in one call (ApplyMany) go the same way, each master's
// groups in one call of its queue in the order of the batches, so that
// the batches on one slot run in that order, as on a single node. The
// masters run at once, so batches on different masters are in no order
// with each other, which no bucket can tell: a bucket lives on one
// master. A spend across slots ends its round trip, and the batches after
// it go in the next, so that they see its tokens given back where a slot
// denied it, as they would one after the other.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Cluster is a limiter.Store on a Redis Cluster. It is safe for concurrent
// use.
type Cluster struct {
	config
	client *redis.ClusterClient
	// leases answer the LeaseStore methods (lease.go).
	leases

	mu sync.Mutex
	// queues holds a queue per master address, made when a call first
	// goes there: as many as the Cluster has had masters.
	queues map[string]*queue
}

var _ limiter.Store = (*Cluster)(nil)

// NewCluster returns a Cluster on client; New says what it needs of it.
func NewCluster(client *redis.ClusterClient, opts Options) *Cluster {
	s := &Cluster{config: newConfig(opts, client.Options().ContextTimeoutEnabled), client: client, queues: map[string]*queue{}}
	s.leases = leases{cfg: &s.config, client: client, slot: keySlot}
	return s
}

// Apply implements limiter.Store, as the comment at the top of this file
// describes.
func (s *Cluster) Apply(ctx context.Context, op limiter.Op, now time.Time, batch []limiter.Bucket) (bool, error) {
	b := [1]limiter.Batch{{Op: op, Buckets: batch}}
	s.ApplyMany(ctx, now, b[:])
	return b[0].Written, b[0].Err
}

// ApplyMany implements limiter.Store, as the comment at the top of this
// file describes for each batch. The batches' groups go to their masters'
// queues, one call per master holding its groups in the batches' order,
// all masters at once.
func (s *Cluster) ApplyMany(ctx context.Context, now time.Time, batches []limiter.Batch) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.applyMany(ctx, now.UnixMicro(), batches)
	for i := range batches {
		batches[i].Err = named(batches[i].Op.String(), batches[i].Err)
	}
}

// applyMany runs the batches in turn, as ApplyMany describes. A spend
// across slots that one slot denies gives its tokens back on the others
// after its round trip; so that the batches after it see it given back,
// as they would one after the other, such a spend ends a round trip, and
// the batches after it go in the next. Other batches, the common case,
// all go in one.
func (s *Cluster) applyMany(ctx context.Context, nowUS int64, batches []limiter.Batch) {
	groups := make([][]group, len(batches))
	start := 0
	for i := range batches {
		b := &batches[i]
		if len(b.Buckets) > 0 {
			groups[i] = s.groups(b.Op, b.Buckets)
		}
		if i == len(batches)-1 || b.Op == limiter.Spend && len(groups[i]) > 1 {
			s.applyGroups(ctx, nowUS, batches[start:i+1], groups[start:i+1])
			start = i + 1
		}
	}
}

// applyGroups sends the groups of the batches, groups[i] batch i's, in one
// round trip, decides each batch from its groups' replies, and gives back
// what spends denied or failed on some slot took on the others.
func (s *Cluster) applyGroups(ctx context.Context, nowUS int64, batches []limiter.Batch, groups [][]group) {
	var all []group
	for i := range batches {
		if b := &batches[i]; len(b.Buckets) == 0 {
			b.Written, b.Err = limiter.StepBatch(b.Op, nowUS, b.Buckets), nil
		}
		all = append(all, groups[i]...)
	}
	if len(all) == 0 {
		return
	}
	parts, err := s.send(ctx, nowUS, all)
	// undo are the refunds of spends denied or failed on some slots;
	// undone[k] is the batch of undo[k].
	var (
		undo   []limiter.Batch
		undone []int
	)
	for i := range batches {
		b := &batches[i]
		if len(b.Buckets) == 0 {
			continue
		}
		if err != nil {
			b.Written, b.Err = false, err
			continue
		}
		var back []limiter.Bucket
		n := len(groups[i])
		b.Written, back, b.Err = decideGroups(b.Op, nowUS, b.Buckets, groups[i], parts[:n])
		parts = parts[n:]
		if len(back) > 0 {
			undo = append(undo, limiter.Batch{Op: limiter.Refund, Buckets: back})
			undone = append(undone, i)
		}
	}
	if len(undo) == 0 {
		return
	}
	s.applyMany(ctx, nowUS, undo)
	for k, u := range undo {
		if b := &batches[undone[k]]; u.Err != nil && b.Err != nil {
			b.Err = fmt.Errorf("%w; giving back the tokens spent on the other slots failed too: %v", b.Err, u.Err)
		}
	}
}

// decideGroups decides a batch from the replies of its groups, one per
// slot, and returns the buckets a spend denied or failed on some slot
// has to give back on the others.
func decideGroups(op limiter.Op, nowUS int64, batch []limiter.Bucket, groups []group, parts []part) (bool, []limiter.Bucket, error) {
	if len(groups) == 1 {
		// One slot: as atomic as on a single node.
		if parts[0].err != nil {
			return false, nil, parts[0].err
		}
		written, err := decide(op, nowUS, parts[0].reply, parts[0].run.keys, batch)
		return written, nil, err
	}
	errs := make([]error, len(groups))
	denied := false
	var undo []limiter.Bucket
	for i, g := range groups {
		pt := &parts[i]
		written, err := false, pt.err
		if err == nil {
			written, err = decide(op, nowUS, pt.reply, pt.run.keys, g.batch)
		}
		errs[i] = err
		for j, p := range g.pos {
			batch[p].TAT = 0
			if err == nil {
				batch[p].TAT = g.batch[j].TAT
			}
		}
		switch {
		case err != nil || op != limiter.Spend:
		case written:
			for _, b := range g.batch {
				if b.Next != b.TAT {
					undo = append(undo, limiter.Bucket{Key: b.Key, Rate: b.Rate, Cost: b.Cost, Now: b.Now})
				}
			}
		default:
			denied = true
		}
	}
	// The decisions on the whole batch, from the TATs the slots read.
	commit := limiter.StepBatch(op, nowUS, batch)
	err := slotErrors(errs)
	if op != limiter.Spend || !denied && err == nil {
		return commit && err == nil, nil, err
	}
	if denied {
		// A denial stands even when a slot failed: failing open on the
		// error would admit the batch.
		err = nil
	}
	return false, undo, err
}

// send runs the groups' script calls, each through the queue of the master
// that serves its slot, all masters at once, and returns the groups' parts
// with their replies or errors. A call given up on while queued (its
// context ended) stays its queue's: its groups get the context's error,
// and nothing of the call is read.
func (s *Cluster) send(ctx context.Context, nowUS int64, groups []group) ([]part, error) {
	type nodeCall struct {
		q      *queue
		call   *scriptCall
		groups []int
		err    error
	}
	var calls []*nodeCall
	for i, g := range groups {
		run := s.run(scriptRun{}, g.op, nowUS, g.batch)
		q, err := s.queueFor(ctx, run.keys[0])
		if err != nil {
			return nil, err
		}
		j := slices.IndexFunc(calls, func(c *nodeCall) bool { return c.q == q })
		if j < 0 {
			j = len(calls)
			call := &scriptCall{done: make(chan struct{}, 1)}
			// ctx is bounded: its deadline is the call's.
			call.bound(ctx, s.timeout)
			calls = append(calls, &nodeCall{q: q, call: call})
		}
		c := calls[j]
		c.call.parts = append(c.call.parts, part{slot: g.slot, run: run})
		c.groups = append(c.groups, i)
	}
	var wg sync.WaitGroup
	for _, c := range calls[1:] {
		wg.Go(func() { _, c.err = c.q.do(c.call) })
	}
	_, calls[0].err = calls[0].q.do(calls[0].call)
	wg.Wait()
	parts := make([]part, len(groups))
	for _, c := range calls {
		for j, i := range c.groups {
			if c.err != nil {
				parts[i].err = c.err
				continue
			}
			parts[i] = c.call.parts[j]
		}
	}
	return parts, nil
}

// queueFor returns the queue of the master that serves key's slot.
func (s *Cluster) queueFor(ctx context.Context, key string) (*queue, error) {
	master, err := s.client.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := master.Options().Addr
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[addr]
	if q == nil {
		q = &queue{client: s.client}
		s.queues[addr] = q
	}
	return q, nil
}

// Reset implements limiter.Store, with one DEL per slot.
func (s *Cluster) Reset(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return s.bounded(ctx, "reset", func(ctx context.Context) error {
		full := s.fullKeys(keys)
		groups := bySlot(full, keySlot)
		cmds := make([]*redis.IntCmd, len(groups))
		s.pipeline(ctx, func(p redis.Pipeliner) {
			for i, pos := range groups {
				slotKeys := make([]string, len(pos))
				for j, k := range pos {
					slotKeys[j] = full[k]
				}
				cmds[i] = p.Del(ctx, slotKeys...)
			}
		})
		errs := make([]error, len(cmds))
		for i, cmd := range cmds {
			errs[i] = cmd.Err()
		}
		return slotErrors(errs)
	})
}

// Ping implements limiter.Store: every master must answer, since any of
// them may hold a bucket.
func (s *Cluster) Ping(ctx context.Context) error {
	return s.bounded(ctx, "ping", func(ctx context.Context) error {
		return s.client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	})
}

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// keySlot returns the Cluster hash slot of key: the CRC16 of the key
// modulo 16384, where only the hash tag is hashed when the key has one, the
// text between the first '{' and the first '}' after it, if not empty.
func keySlot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return crc16(key) % slotCount
}

// crc16 is the CRC-16/XMODEM of Redis Cluster: polynomial 0x1021, initial
// value 0, no reflection.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// bySlot returns the positions of keys grouped by their slot as slot
// gives it (keySlot on a Cluster), in the order in which the slots first
// appear.
func bySlot(keys []string, slot func(string) uint16) [][]int {
	var slots []uint16
	var groups [][]int
	for i, k := range keys {
		at := slot(k)
		j := slices.Index(slots, at)
		if j < 0 {
			j = len(groups)
			slots = append(slots, at)
			groups = append(groups, nil)
		}
		groups[j] = append(groups[j], i)
	}
	return groups
}

// group is the part of a batch in one hash slot, which one script call
// handles.
type group struct {
	// op is the batch's.
	op   limiter.Op
	slot uint16
	// batch holds copies of the buckets; pos[j] is where batch[j] is in
	// the caller's batch.
	batch []limiter.Bucket
	pos   []int
}

// groups splits a batch of op by hash slot.
func (s *Cluster) groups(op limiter.Op, batch []limiter.Bucket) []group {
	keys := make([]string, len(batch))
	for i := range batch {
		keys[i] = s.prefix + string(batch[i].Key)
	}
	var groups []group
	for _, pos := range bySlot(keys, keySlot) {
		g := group{op: op, slot: keySlot(keys[pos[0]]), pos: pos}
		for _, i := range pos {
			g.batch = append(g.batch, batch[i])
		}
		groups = append(groups, g)
	}
	return groups
}

// slotErrors returns nil when no slot failed, else the first error, on
// one line and with how many slots failed.
func slotErrors(errs []error) error {
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil && first == nil {
			first = err
		}
		if err != nil {
			failed++
		}
	}
	switch failed {
	case 0:
		return nil
	case len(errs):
		return first
	}
	return fmt.Errorf("%d of %d slots failed: %w", failed, len(errs), first)
}

// pipeline sends the commands that fill queues in one pipeline; each
// command carries its own result and error. Every Cluster call goes
// through a pipeline, even a single command (evalPipelined too): go-redis routes a lone
// command only after it has fetched the server's COMMAND table, and it
// fetches that with its own 5 s deadline, not the call's, until it once
// succeeds; a pipeline routes by slot alone, within the call's deadline.
func (s *Cluster) pipeline(ctx context.Context, fill func(redis.Pipeliner)) {
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		fill(p)
		return nil
	})
}
