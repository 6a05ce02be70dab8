// Package limiter is the domain of ratelimitd: limits and their bucket id
// formats, bucket keys, the pure GCRA step, the in-memory snapshot of limits
// and overrides, the Store interface that keeps theoretical arrival times
// (TATs), and the Limiter that answers batches of decisions.
//
// It imports only the standard library and golang.org/x/net, so that the
// algorithm can be read and tested without any backend.
package limiter
