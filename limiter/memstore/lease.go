package memstore

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// leaseSet is what a lease bucket holds: its live leases by id, and
// perhaps expired ones that the next operation on the bucket drops. A
// concurrency limit's burst bounds the leases of a bucket, so the scans
// below are short.
type leaseSet struct {
	held   int64
	leases map[string]hold
}

type hold struct {
	cost    int64
	expires int64
}

// recordShard holds the records of the leases whose id hashes to it.
type recordShard struct {
	mu sync.Mutex
	m  map[string]*limiter.LeaseRecord
}

// prune drops the expired leases of a set and returns how many.
func (ls *leaseSet) prune(nowUS int64) int64 {
	n := int64(0)
	for id, h := range ls.leases {
		if h.expires <= nowUS {
			delete(ls.leases, id)
			ls.held -= h.cost
			n++
		}
	}
	return n
}

// read fills in what b holds at now, counting only live leases.
func (ls *leaseSet) read(b *limiter.LeaseBucket, nowUS int64) {
	b.Held, b.Earliest, b.Latest = 0, 0, 0
	if ls == nil {
		return
	}
	for _, h := range ls.leases {
		if h.expires <= nowUS {
			continue
		}
		b.Held += h.cost
		if b.Earliest == 0 || h.expires < b.Earliest {
			b.Earliest = h.expires
		}
		b.Latest = max(b.Latest, h.expires)
	}
}

// latest returns the expiry of the set's last lease, 0 when it has none.
func (ls *leaseSet) latest() int64 {
	l := int64(0)
	for _, h := range ls.leases {
		l = max(l, h.expires)
	}
	return l
}

func leaseKey(b *limiter.LeaseBucket) []byte { return b.Key }

// recordKey is a bucket key of a lease record, for lockKeys.
func recordKey(k *string) []byte { return []byte(*k) }

// Acquire implements limiter.LeaseStore.
func (s *Store) Acquire(_ context.Context, now time.Time, rec *limiter.LeaseRecord, batch []limiter.LeaseBucket) (bool, error) {
	nowUS := now.UnixMicro()
	set := lockKeys(s, batch, leaseKey)
	for i := range batch {
		b := &batch[i]
		sh := s.shard(b.Key)
		ls := sh.leases[string(b.Key)]
		b.Expired = 0
		if ls != nil {
			b.Expired = ls.prune(nowUS)
		}
		ls.read(b, nowUS)
	}
	ok := limiter.LeaseStep(nowUS, rec.Expires, batch)
	if ok {
		rec.Keys, rec.Costs = rec.Keys[:0], rec.Costs[:0]
		for i := range batch {
			b := &batch[i]
			if !b.Takes() {
				continue
			}
			sh := s.shard(b.Key)
			ls := sh.leases[string(b.Key)]
			if ls == nil {
				ls = &leaseSet{leases: map[string]hold{}}
				sh.leases[string(b.Key)] = ls
			}
			ls.leases[rec.ID] = hold{cost: b.Cost, expires: rec.Expires}
			ls.held += b.Cost
			rec.Keys = append(rec.Keys, string(b.Key))
			rec.Costs = append(rec.Costs, b.Cost)
		}
	}
	unlockKeys(s, batch, set, leaseKey)
	if ok {
		// No one can release or renew the lease before this returns its
		// id, so the record may follow the buckets.
		r := *rec
		rs := s.record(rec.ID)
		rs.mu.Lock()
		rs.m[rec.ID] = &r
		rs.mu.Unlock()
	}
	return ok, nil
}

// Held implements limiter.LeaseStore.
func (s *Store) Held(_ context.Context, now time.Time, batch []limiter.LeaseBucket) error {
	nowUS := now.UnixMicro()
	set := lockKeys(s, batch, leaseKey)
	for i := range batch {
		b := &batch[i]
		s.shard(b.Key).leases[string(b.Key)].read(b, nowUS)
	}
	unlockKeys(s, batch, set, leaseKey)
	return nil
}

// Release implements limiter.LeaseStore.
func (s *Store) Release(_ context.Context, now time.Time, id string) (limiter.LeaseRecord, error) {
	rs := s.record(id)
	rs.mu.Lock()
	rec, ok := rs.m[id]
	delete(rs.m, id)
	rs.mu.Unlock()
	if !ok || rec.Expires <= now.UnixMicro() {
		return limiter.LeaseRecord{}, limiter.ErrLeaseNotFound
	}
	keys := rec.Keys
	set := lockKeys(s, keys, recordKey)
	for _, k := range keys {
		sh := s.shard([]byte(k))
		if ls := sh.leases[k]; ls != nil {
			if h, ok := ls.leases[id]; ok {
				delete(ls.leases, id)
				ls.held -= h.cost
			}
			if len(ls.leases) == 0 {
				delete(sh.leases, k)
			}
		}
	}
	unlockKeys(s, keys, set, recordKey)
	return *rec, nil
}

// Renew implements limiter.LeaseStore.
func (s *Store) Renew(_ context.Context, now time.Time, id string, expires func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	nowUS := now.UnixMicro()
	rs := s.record(id)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rec, ok := rs.m[id]
	if !ok || rec.Expires <= nowUS {
		return limiter.LeaseRecord{}, limiter.ErrLeaseNotFound
	}
	until, err := expires(*rec)
	if err != nil {
		return limiter.LeaseRecord{}, err
	}
	// The record's lock is held across the buckets': Release takes them
	// one after the other, never both, so this order cannot deadlock.
	keys := rec.Keys
	set := lockKeys(s, keys, recordKey)
	for _, k := range keys {
		if ls := s.shard([]byte(k)).leases[k]; ls != nil {
			if h, ok := ls.leases[id]; ok && h.expires > nowUS {
				ls.leases[id] = hold{cost: h.cost, expires: until}
			}
		}
	}
	unlockKeys(s, keys, set, recordKey)
	old := *rec
	rec.Expires = until
	return old, nil
}

// Expire implements limiter.LeaseStore. A bucket left without leases goes.
func (s *Store) Expire(_ context.Context, now time.Time, keys []string) ([]int64, error) {
	nowUS := now.UnixMicro()
	out := make([]int64, len(keys))
	for i, k := range keys {
		sh := &s.shards[maphash.String(s.seed, k)%shardCount]
		sh.mu.Lock()
		if ls := sh.leases[k]; ls != nil {
			out[i] = ls.prune(nowUS)
			if len(ls.leases) == 0 {
				delete(sh.leases, k)
			}
		}
		sh.mu.Unlock()
	}
	return out, nil
}

func (s *Store) record(id string) *recordShard {
	return &s.records[maphash.String(s.seed, id)%shardCount]
}
