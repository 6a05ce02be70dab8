package redisstore

import "github.com/ratelimitd/ratelimitd/limiter"

// KeySlot exposes keySlot to the tests of the package's API.
func KeySlot(key string) uint16 { return keySlot(key) }

// MaxInFlight exposes maxInFlight: a test that holds that many round trips
// knows that the next calls queue.
const MaxInFlight = maxInFlight

// QueueState returns how many calls wait in the queue of s, a Node or a
// Cluster, and how many round trips it has under way.
func QueueState(s limiter.Store) (queued, inFlight int) {
	var q *queue
	switch s := s.(type) {
	case *Node:
		q = s.queue
	case *Cluster:
		q = s.queue
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending), q.inFlight
}
