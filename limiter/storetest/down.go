package storetest

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Down is a store that cannot be reached: every call fails with Err, for
// the tests of the fail modes.
type Down struct{ Err error }

var _ limiter.Store = Down{}

// Apply implements limiter.Store.
func (d Down) Apply(context.Context, limiter.Op, time.Time, []limiter.Bucket) (bool, error) {
	return false, d.Err
}

// ApplyMany implements limiter.Store.
func (d Down) ApplyMany(_ context.Context, _ time.Time, batches []limiter.Batch) {
	for i := range batches {
		batches[i].Written, batches[i].Err = false, d.Err
	}
}

// Reset implements limiter.Store.
func (d Down) Reset(context.Context, []string) error { return d.Err }

// Ping implements limiter.Store.
func (d Down) Ping(context.Context) error { return d.Err }

// Acquire implements limiter.LeaseStore.
func (d Down) Acquire(context.Context, time.Time, *limiter.LeaseRecord, []limiter.LeaseBucket) (bool, error) {
	return false, d.Err
}

// Held implements limiter.LeaseStore.
func (d Down) Held(context.Context, time.Time, []limiter.LeaseBucket) error { return d.Err }

// Release implements limiter.LeaseStore.
func (d Down) Release(context.Context, time.Time, string) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, d.Err
}

// Renew implements limiter.LeaseStore.
func (d Down) Renew(context.Context, time.Time, string, func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	return limiter.LeaseRecord{}, d.Err
}

// Expire implements limiter.LeaseStore: it fails.
func (d Down) Expire(_ context.Context, _ time.Time, keys []string) ([]int64, error) {
	return make([]int64, len(keys)), d.Err
}
