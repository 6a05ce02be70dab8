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
	// Cost is what a spend, check or refund moves; for a settle, what the
	// request really used.
	Cost int64
	// Reserved is what a settled request took up front; settles only.
	Reserved int64
	// Shadow marks a bucket of a shadow limit: it is spent when it allows
	// its cost, but its denial does not stop the rest of the batch.
	Shadow bool
	// Now is the bucket's clock in Unix µs, 0 for the batch's now: a
	// calendar quota's is the end of its window (calendar.go).
	Now int64
	// TAT is set by the Store: the bucket's TAT in Unix microseconds as it
	// was before the call, 0 for a bucket it does not hold.
	TAT int64
	// Next and Outcome are set by the Store, by StepBatch: the TAT after
	// the call and the decision on the bucket.
	Next    int64
	Outcome Outcome
}

// Batch is one of the independent batches of Store.ApplyMany: what one
// call of Apply takes, and what it answers.
type Batch struct {
	// Op is Check, Spend, Refund or Settle.
	Op      Op
	Buckets []Bucket
	// Written and Err are set by the store, as Apply returns them.
	Written bool
	Err     error
}

// Store keeps the TATs of buckets. A call handles a whole batch, so that a
// remote store needs one round trip per request, and decides it with
// StepBatch on the TATs it read, which fills in each Bucket's TAT, Next
// and Outcome; a store that runs the step elsewhere (a Lua script) must
// compute exactly what StepBatch does, which the storetest suite checks on
// every implementation.
type Store interface {
	// Apply runs op on batch at now and reports whether it wrote the
	// batch, as StepBatch decides. A Spend, Refund or Settle is one atomic
	// step: concurrent spends never admit more than the limits allow, and
	// a spend that any bucket outside shadow limits denies writes nothing.
	// A Check only reads.
	Apply(ctx context.Context, op Op, now time.Time, batch []Bucket) (bool, error)
	// ApplyMany runs every batch as Apply would at now, in one call: each
	// batch all or nothing on its own and independent of the others (a
	// batch denied or failed leaves the others alone), and each seeing
	// what the batches before it wrote to its buckets, as if they were
	// separate calls in that order. It sets each batch's Written and Err.
	// A store whose buckets live on several servers runs each server's
	// share in order, the servers at once (Redis Cluster): order is what
	// the calls on one bucket see, and a batch across servers is as
	// atomic as Apply makes it.
	ApplyMany(ctx context.Context, now time.Time, batches []Batch)
	// Reset forgets the buckets, which makes them full (a lease bucket:
	// empty, its leases gone).
	Reset(ctx context.Context, keys []string) error
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
	// Every store keeps the leases of concurrency limits too; Reset
	// forgets a lease bucket's leases.
	LeaseStore
}
