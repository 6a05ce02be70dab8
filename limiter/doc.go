// Package limiter is the engine of ratelimitd: limits and the names of
// their bucket id formats, bucket keys, the pure GCRA step, the in-memory
// snapshot of limits and overrides, the Store interface that keeps
// theoretical arrival times (TATs), and the Limiter that answers batches
// of decisions.
//
// It imports only the standard library, so that the algorithm can be read
// and tested without any backend. Reading bucket ids (limiter/bucketid)
// and descriptors (limiter/rules) lives in leaf packages that import this
// one; a snapshot is handed what it needs of them as Parsers.
package limiter
