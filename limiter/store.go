package limiter

import (
	"context"
	"time"
)

// Bucket is one bucket of a batch as a Store sees it.
type Bucket struct {
	// Key names the bucket, for example "3:12345678". The bytes belong to
	// the caller and are valid only during the call: a store that keeps a
	// key copies it, as inserting string(Key) into a map does.
	Key  []byte
	Rate Rate
	Cost int64
	// Shadow marks a bucket of a shadow limit: it is spent when it allows
	// its cost, but its denial does not stop the rest of the batch.
	Shadow bool
	// TAT is set by the Store: the bucket's TAT in Unix microseconds as it
	// was before the call, 0 for a bucket it does not hold.
	TAT int64
}

// Store keeps the TATs of buckets. Each method handles a whole batch in one
// call, so that a remote store needs one round trip per request, and each
// records in Bucket.TAT what it read. Callers compute the decisions from
// those TATs with SpendStep and RefundStep, which is why a store must apply
// exactly those steps. Every implementation passes the storetest suite.
type Store interface {
	// Spend reads every bucket and, when SpendStep allows every bucket that
	// is not Shadow, stores the new TAT of every bucket it allows, all as
	// one atomic step: concurrent spends never admit more than the limits
	// allow. When any other bucket is denied, nothing is written.
	Spend(ctx context.Context, now time.Time, batch []Bucket) error
	// Refund applies RefundStep to every bucket.
	Refund(ctx context.Context, now time.Time, batch []Bucket) error
	// Read records the TAT of every bucket and changes nothing.
	Read(ctx context.Context, batch []Bucket) error
	// Reset forgets the buckets, which makes them full.
	Reset(ctx context.Context, keys []string) error
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
}
