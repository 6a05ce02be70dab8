package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// errNoLeases stands in until leases on Redis land. TODO(leases): replace.
var errNoLeases = errors.New("redisstore: leases are not implemented yet")

// Acquire implements limiter.LeaseStore.
func (s *Node) Acquire(context.Context, time.Time, *limiter.LeaseRecord, []limiter.LeaseBucket) (bool, error) {
	return false, errNoLeases
}

// Held implements limiter.LeaseStore.
func (s *Node) Held(context.Context, time.Time, []limiter.LeaseBucket) error { return errNoLeases }

// Release implements limiter.LeaseStore.
func (s *Node) Release(context.Context, time.Time, string) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, errNoLeases
}

// Renew implements limiter.LeaseStore.
func (s *Node) Renew(context.Context, time.Time, string, func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, errNoLeases
}

// Acquire implements limiter.LeaseStore.
func (s *Cluster) Acquire(context.Context, time.Time, *limiter.LeaseRecord, []limiter.LeaseBucket) (bool, error) {
	return false, errNoLeases
}

// Held implements limiter.LeaseStore.
func (s *Cluster) Held(context.Context, time.Time, []limiter.LeaseBucket) error { return errNoLeases }

// Release implements limiter.LeaseStore.
func (s *Cluster) Release(context.Context, time.Time, string) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, errNoLeases
}

// Renew implements limiter.LeaseStore.
func (s *Cluster) Renew(context.Context, time.Time, string, func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, errNoLeases
}
