package memstore

import "time"

// Expiry returns when the sweeper drops a bucket: at its TAT, or at the
// end of its latest lease.
func (s *Store) Expiry(key string) (time.Time, bool) {
	sh := s.shard([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if tat, ok := sh.tats[key]; ok {
		return time.UnixMicro(*tat), true
	}
	if ls, ok := sh.leases[key]; ok {
		return time.UnixMicro(ls.latest()), true
	}
	return time.Time{}, false
}

// RecordExpiry returns when the sweeper drops the record of lease id: when
// the lease ends.
func (s *Store) RecordExpiry(id string) (time.Time, bool) {
	rs := s.record(id)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rec, ok := rs.m[id]
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMicro(rec.Expires), true
}
