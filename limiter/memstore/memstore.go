// Package memstore keeps bucket TATs in the process: the embedded default,
// for a single node. Buckets are spread over shards, each behind its own
// mutex, so that decisions on different buckets rarely wait for each other;
// a batch locks its shards in ascending order, which makes it atomic without
// a global lock and without deadlocks.
package memstore

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

const shardCount = 256

// DefaultSweepInterval is how often full buckets are evicted when Options
// leaves it zero.
const DefaultSweepInterval = 10 * time.Second

// Options configure a Store.
type Options struct {
	// Now reads the clock of the sweeper; time.Now when nil.
	Now func() time.Time
	// SweepInterval is how often every shard is swept of buckets that are
	// full again; DefaultSweepInterval when zero.
	SweepInterval time.Duration
}

// Store is an in-process limiter.Store. Close stops its sweeper.
type Store struct {
	seed   maphash.Seed
	shards [shardCount]shard
	now    func() time.Time
	stop   chan struct{}
	done   chan struct{}
	// records finds a lease's buckets by its id (lease.go).
	records [shardCount]recordShard
}

type shard struct {
	mu sync.Mutex
	// tats holds Unix microseconds; a bucket that is full is absent, or
	// present with a TAT in the past until the sweeper or a write drops it.
	// The values are pointers so that a spend finds its bucket once and
	// writes through the pointer.
	tats map[string]*int64
	// leases holds the lease buckets of concurrency limits (lease.go).
	leases map[string]*leaseSet
}

var _ limiter.Store = (*Store)(nil)

// New returns an empty store and starts its sweeper.
func New(opts Options) *Store {
	s := &Store{seed: maphash.MakeSeed(), now: opts.Now, stop: make(chan struct{}), done: make(chan struct{})}
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].tats = make(map[string]*int64)
		s.shards[i].leases = make(map[string]*leaseSet)
		s.records[i].m = make(map[string]*limiter.LeaseRecord)
	}
	interval := opts.SweepInterval
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	go s.sweepEvery(interval)
	return s
}

// Close stops the sweeper. The store keeps answering.
func (s *Store) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
		<-s.done
	}
}

// Apply implements limiter.Store.
func (s *Store) Apply(_ context.Context, op limiter.Op, now time.Time, batch []limiter.Bucket) (bool, error) {
	nowUS := now.UnixMicro()
	locked := s.lock(batch)
	commit := limiter.StepBatch(op, nowUS, batch)
	if commit {
		for i := range batch {
			if b := &batch[i]; b.Next != b.TAT {
				s.put(b.Key, b.Next, nowUS)
			}
		}
	}
	s.unlock(batch, locked)
	return commit, nil
}

// ApplyMany implements limiter.Store: each batch in turn, as Apply.
func (s *Store) ApplyMany(ctx context.Context, now time.Time, batches []limiter.Batch) {
	for i := range batches {
		b := &batches[i]
		b.Written, b.Err = s.Apply(ctx, b.Op, now, b.Buckets)
	}
}

// Reset implements limiter.Store.
func (s *Store) Reset(_ context.Context, keys []string) error {
	for _, k := range keys {
		sh := &s.shards[maphash.String(s.seed, k)%shardCount]
		sh.mu.Lock()
		delete(sh.tats, k)
		delete(sh.leases, k)
		sh.mu.Unlock()
	}
	return nil
}

// Ping implements limiter.Store; an in-process store always answers.
func (s *Store) Ping(context.Context) error { return nil }

// Len returns the number of buckets held, full ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.tats)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket that is full at now, and the records of
// expired leases. The leases themselves are dropped, and counted, by an
// acquire on their bucket or by Expire, which goes with the last lease of
// a bucket: a sweep here would drop them uncounted.
func (s *Store) Sweep(now time.Time) {
	nowUS := now.UnixMicro()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, tat := range sh.tats {
			if *tat <= nowUS {
				delete(sh.tats, k)
			}
		}
		sh.mu.Unlock()
		rs := &s.records[i]
		rs.mu.Lock()
		for id, rec := range rs.m {
			if rec.Expires <= nowUS {
				delete(rs.m, id)
			}
		}
		rs.mu.Unlock()
	}
}

func (s *Store) sweepEvery(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(s.now())
		}
	}
}

func (s *Store) shardIndex(key []byte) int {
	return int(maphash.Bytes(s.seed, key) % shardCount)
}

func (s *Store) shard(key []byte) *shard { return &s.shards[s.shardIndex(key)] }

// shardSet is a set of shard indexes, one bit each.
type shardSet [shardCount / 64]uint64

// lock locks the shards of the batch in ascending order and reads every
// TAT into the batch; unlock releases them.
func (s *Store) lock(batch []limiter.Bucket) shardSet {
	if len(batch) == 1 {
		// The common case, spelled out: lockKeys is not inlined.
		sh := s.shard(batch[0].Key)
		sh.mu.Lock()
		batch[0].TAT = sh.get(batch[0].Key)
		return shardSet{}
	}
	set := lockKeys(s, batch, func(b *limiter.Bucket) []byte { return b.Key })
	for i := range batch {
		batch[i].TAT = s.shard(batch[i].Key).get(batch[i].Key)
	}
	return set
}

func (s *Store) unlock(batch []limiter.Bucket, set shardSet) {
	if len(batch) == 1 {
		s.shard(batch[0].Key).mu.Unlock()
		return
	}
	unlockKeys(s, batch, set, func(b *limiter.Bucket) []byte { return b.Key })
}

// lockKeys locks the shards of the items' keys in ascending order, which
// makes a batch atomic without a global lock and without deadlocks. A
// single item, the common case, skips the set.
func lockKeys[T any](s *Store, items []T, key func(*T) []byte) shardSet {
	var set shardSet
	if len(items) == 1 {
		s.shard(key(&items[0])).mu.Lock()
		return set
	}
	for i := range items {
		n := s.shardIndex(key(&items[i]))
		set[n/64] |= 1 << (n % 64)
	}
	set.each(func(n int) { s.shards[n].mu.Lock() })
	return set
}

// unlockKeys releases what lockKeys locked.
func unlockKeys[T any](s *Store, items []T, set shardSet, key func(*T) []byte) {
	if len(items) == 1 {
		s.shard(key(&items[0])).mu.Unlock()
		return
	}
	set.each(func(n int) { s.shards[n].mu.Unlock() })
}

// get returns the TAT of key, 0 when absent; the caller holds the lock.
func (sh *shard) get(key []byte) int64 {
	if p, ok := sh.tats[string(key)]; ok {
		return *p
	}
	return 0
}

// put stores a TAT, or drops the bucket when it is full; the caller holds
// the shard's lock.
func (s *Store) put(key []byte, tat, nowUS int64) {
	sh := s.shard(key)
	if tat <= nowUS {
		delete(sh.tats, string(key))
		return
	}
	if p, ok := sh.tats[string(key)]; ok {
		*p = tat
		return
	}
	p := new(int64)
	*p = tat
	sh.tats[string(key)] = p
}

func (set *shardSet) each(f func(int)) {
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			f(w*64 + b)
			word &^= 1 << b
		}
	}
}
