package redisstore

import "github.com/ratelimitd/ratelimitd/limiter"

// KeySlot exposes keySlot to the tests of the package's API.
func KeySlot(key string) uint16 { return keySlot(key) }

// RecordKey returns the key of the record of lease id under prefix.
func RecordKey(prefix, id string) string {
	l := leases{cfg: &config{prefix: prefix}}
	return l.recordKey(id)
}

// MaxInFlight exposes maxInFlight: a test that holds that many round trips
// knows that the next calls queue.
const MaxInFlight = maxInFlight

// QueueState returns how many calls wait in the queues of s, a Node or a
// Cluster (one queue per master), and how many round trips they have under
// way.
func QueueState(s limiter.Store) (queued, inFlight int) {
	var qs []*queue
	switch s := s.(type) {
	case *Node:
		qs = append(qs, s.queue)
	case *Cluster:
		s.mu.Lock()
		for _, q := range s.queues {
			qs = append(qs, q)
		}
		s.mu.Unlock()
	}
	for _, q := range qs {
		q.mu.Lock()
		queued += len(q.pending)
		inFlight += q.inFlight
		q.mu.Unlock()
	}
	return queued, inFlight
}

// PooledTrip takes the memory of a round trip from the pool of n's queue
// and returns how many keys and parts it has room for, or false when the
// pool had none; the memory stays out of the pool.
func PooledTrip(n *Node) (keys, parts int, ok bool) {
	buf, _ := n.queue.trips.Get().(*roundTrip)
	if buf == nil {
		return 0, 0, false
	}
	return cap(buf.keys), cap(buf.parts), true
}
