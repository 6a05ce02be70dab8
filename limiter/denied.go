package limiter

import (
	"sync"
	"sync/atomic"
)

const deniedShards = 64

// deniedCache remembers buckets known to be empty, so that a client hammering
// an exhausted bucket is answered from memory without a store call. It keeps
// a lower bound of each bucket's TAT: TATs only move forward, except by
// refunds and resets, so a request the cached TAT denies is denied by the
// store too. An entry lives until the bucket would hold one token again.
//
// Refunds and resets made through this process forget their buckets here,
// and a TAT read from the store before such a forget is not remembered
// after it: a spend that raced with a refund would otherwise put back the
// TAT the refund lowered. Answers of concurrent spends may come back out of
// order, so an entry keeps the latest TAT it was told. Refunds and resets
// made through another replica are not seen: this process may go on
// denying such a bucket until its entry ends, which is no later than the
// moment the bucket would have had a token without the refund. Parameters are
// not cached; a raised limit takes effect at once.
type deniedCache struct {
	perShard int
	shards   [deniedShards]deniedShard
	hits     atomic.Uint64
}

type deniedShard struct {
	// n mirrors len(m), so that the common case, a shard with no empty
	// bucket, costs an atomic load instead of a lock.
	n atomic.Int32
	// forgets counts the refunds and resets of the shard's buckets (see
	// epoch); it changes under mu.
	forgets atomic.Uint64
	mu      sync.Mutex
	m       map[string]deniedEntry
}

type deniedEntry struct {
	// tat is the bucket's TAT as last seen, in Unix microseconds.
	tat int64
	// until is when the bucket would hold a token again.
	until int64
}

func newDeniedCache(size int) *deniedCache {
	c := &deniedCache{perShard: max(1, size/deniedShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]deniedEntry)
	}
	return c
}

func (c *deniedCache) shard(key []byte) *deniedShard {
	return &c.shards[shardOf(key)%deniedShards]
}

// deny sets out and reports true when the cached TAT proves that a spend of
// cost is denied at now.
func (c *deniedCache) deny(key []byte, now int64, r Rate, cost int64, out *Outcome) bool {
	if c == nil {
		return false
	}
	sh := c.shard(key)
	if sh.n.Load() == 0 {
		return false
	}
	sh.mu.Lock()
	e, ok := sh.m[string(key)]
	if ok && e.until <= now {
		sh.delete(key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok {
		return false
	}
	_, o := SpendStep(e.tat, now, r, cost)
	if o.Allowed {
		return false
	}
	*out = o
	c.hits.Add(1)
	return true
}

// epoch is read before the store call whose TAT is then remembered: a
// forget of the bucket's shard in between makes remember drop the TAT. A
// forget of another bucket of the shard drops it too, which only costs a
// store call later.
func (c *deniedCache) epoch(key []byte) uint64 {
	if c == nil {
		return 0
	}
	return c.shard(key).forgets.Load()
}

// remember records that a bucket's TAT is tat at now, as read by a store
// call made after epoch: kept while the bucket has no whole token, dropped
// otherwise. A full shard drops an arbitrary entry, which only costs a
// store call later.
func (c *deniedCache) remember(key []byte, tat, now int64, r Rate, epoch uint64) {
	sh := c.shard(key)
	until := tat - r.Offset() + r.Interval
	if until <= now {
		if sh.n.Load() > 0 {
			sh.mu.Lock()
			sh.delete(key)
			sh.mu.Unlock()
		}
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.forgets.Load() != epoch {
		return
	}
	e, ok := sh.m[string(key)]
	if ok && e.tat >= tat {
		return
	}
	if !ok && len(sh.m) >= c.perShard {
		for k := range sh.m {
			delete(sh.m, k)
			break
		}
	}
	sh.m[string(key)] = deniedEntry{tat: tat, until: until}
	sh.n.Store(int32(len(sh.m)))
}

// forget drops a bucket after a refund or reset, which the caller has made
// in the store. It takes the lock even for an empty shard: a remember of a
// TAT read before the refund must either come before it, and be dropped
// here, or see the new epoch.
func (c *deniedCache) forget(key []byte) {
	if c == nil {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	sh.forgets.Add(1)
	sh.delete(key)
	sh.mu.Unlock()
}

// delete drops key; the caller holds the lock.
func (sh *deniedShard) delete(key []byte) {
	delete(sh.m, string(key))
	sh.n.Store(int32(len(sh.m)))
}
