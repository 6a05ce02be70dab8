package memstore

import "time"

// Expiry returns a bucket's TAT, after which the sweeper drops it.
func (s *Store) Expiry(key string) (time.Time, bool) {
	sh := s.shard([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tat, ok := sh.tats[key]
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMicro(*tat), true
}
