package redisstore

// Redis Cluster lets a script touch the keys of one hash slot only, so on a
// Cluster a batch is split into one group per slot and the script runs once
// per group, all groups in one pipeline (go-redis sends each node its part
// at the same time). What remains atomic:
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
//   - When a group fails with an error and none denies, Spend refunds the
//     groups that were spent and returns the error; the failed group may
//     or may not have been spent (conservative again), and its buckets
//     report TAT 0.
//   - Refund and Read work per slot: a refund that fails on one slot may
//     have been applied on others, and a read may see the slots at
//     slightly different instants.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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

// bySlot returns the positions of keys grouped by hash slot, in the order
// in which the slots first appear.
func bySlot(keys []string) [][]int {
	var slots []uint16
	var groups [][]int
	for i, k := range keys {
		slot := keySlot(k)
		j := slices.Index(slots, slot)
		if j < 0 {
			j = len(groups)
			slots = append(slots, slot)
			groups = append(groups, nil)
		}
		groups[j] = append(groups[j], i)
	}
	return groups
}

// group is the part of a batch in one hash slot, which one script call
// handles.
type group struct {
	keys []string
	// batch holds copies of the buckets; pos[j] is where batch[j] is in
	// the caller's batch.
	batch []limiter.Bucket
	pos   []int
}

// groups splits batch by hash slot.
func (s *Store) groups(batch []limiter.Bucket) []group {
	keys := s.keys(batch)
	var groups []group
	for _, pos := range bySlot(keys) {
		g := group{pos: pos}
		for _, i := range pos {
			g.keys = append(g.keys, keys[i])
			g.batch = append(g.batch, batch[i])
		}
		groups = append(groups, g)
	}
	return groups
}

// spendBySlot spends a batch on a Cluster, as the comment at the top
// of this file describes.
func (s *Store) spendBySlot(ctx context.Context, nowUS int64, batch []limiter.Bucket) error {
	groups := s.groups(batch)
	applied, errs := s.evalGroups(ctx, modeSpend, nowUS, batch, groups)
	denied := false
	var undo []limiter.Bucket
	for i, g := range groups {
		switch {
		case errs[i] == nil && applied[i]:
			undo = append(undo, written(g.batch, nowUS)...)
		case errs[i] == nil:
			denied = true
		}
	}
	err := slotErrors(errs)
	if !denied && err == nil {
		return nil
	}
	if len(undo) > 0 {
		if undoErr := s.evalBySlot(ctx, modeRefund, nowUS, undo); undoErr != nil && err != nil {
			err = fmt.Errorf("%w; giving back the tokens spent on the other slots failed too: %v", err, undoErr)
		}
	}
	if denied {
		return nil
	}
	return err
}

// written returns fresh copies of the buckets that an applied spend wrote:
// those SpendStep allows with a cost above 0. A shadow bucket it denied
// was not written and must not be refunded.
func written(batch []limiter.Bucket, nowUS int64) []limiter.Bucket {
	var out []limiter.Bucket
	for _, b := range batch {
		if _, o := limiter.SpendStep(b.TAT, nowUS, b.Rate, b.Cost); o.Allowed && b.Cost > 0 {
			b.TAT = 0
			out = append(out, b)
		}
	}
	return out
}

// evalBySlot runs a refund or a read on a Cluster, each slot on its own.
func (s *Store) evalBySlot(ctx context.Context, m mode, nowUS int64, batch []limiter.Bucket) error {
	_, errs := s.evalGroups(ctx, m, nowUS, batch, s.groups(batch))
	return slotErrors(errs)
}

// evalGroups runs the script on every group and records the TATs read in
// the caller's batch, 0 for the buckets of a group that failed.
// applied[i] and errs[i] are what group i's script call returned.
func (s *Store) evalGroups(ctx context.Context, m mode, nowUS int64, batch []limiter.Bucket, groups []group) (applied []bool, errs []error) {
	cmds := make([]*redis.Cmd, len(groups))
	s.pipeline(ctx, func(p redis.Pipeliner) {
		for i, g := range groups {
			cmds[i] = s.script.EvalSha(ctx, p, g.keys, s.args(m, nowUS, g.batch)...)
		}
	})
	// A node that lacks the script ran nothing: send it the script.
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		s.pipeline(ctx, func(p redis.Pipeliner) {
			for _, i := range again {
				cmds[i] = s.script.Eval(ctx, p, groups[i].keys, s.args(m, nowUS, groups[i].batch)...)
			}
		})
	}
	applied, errs = make([]bool, len(groups)), make([]error, len(groups))
	for i, cmd := range cmds {
		applied[i], errs[i] = s.result(cmd, groups[i].batch)
	}
	for i, g := range groups {
		for j, p := range g.pos {
			if errs[i] != nil {
				batch[p].TAT = 0
			} else {
				batch[p].TAT = g.batch[j].TAT
			}
		}
	}
	return applied, errs
}

// deleteBySlot deletes keys on a Cluster with one DEL per slot.
func (s *Store) deleteBySlot(ctx context.Context, keys []string) error {
	groups := bySlot(keys)
	cmds := make([]*redis.IntCmd, len(groups))
	s.pipeline(ctx, func(p redis.Pipeliner) {
		for i, pos := range groups {
			slotKeys := make([]string, len(pos))
			for j, k := range pos {
				slotKeys[j] = keys[k]
			}
			cmds[i] = p.Del(ctx, slotKeys...)
		}
	})
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	return slotErrors(errs)
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
// through a pipeline, even a single command: go-redis routes a lone
// command only after it has fetched the server's COMMAND table, and it
// fetches that with its own 5 s deadline, not the call's, until it once
// succeeds; a pipeline routes by slot alone, within the call's deadline.
func (s *Store) pipeline(ctx context.Context, fill func(redis.Pipeliner)) {
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		fill(p)
		return nil
	})
}
