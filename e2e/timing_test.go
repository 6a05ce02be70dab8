//go:build linux

package e2e

import (
	"context"
	"net/http"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// timingKey is the context key of a *time.Duration that timed fills.
type timingKey struct{}

// withTiming returns a context in which a request made through a timed
// transport records, in *d, the time until its response's headers came.
func withTiming(ctx context.Context, d *time.Duration) context.Context {
	return context.WithValue(ctx, timingKey{}, d)
}

// timed measures requests whose context asks for it (withTiming): the
// latency the service gave, without the time the client spends decoding
// and checking the body.
func timed(next http.RoundTripper) http.RoundTripper {
	return testenv.RoundTripper(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		res, err := next.RoundTrip(req)
		if d, ok := req.Context().Value(timingKey{}).(*time.Duration); ok {
			*d = time.Since(start)
		}
		return res, err
	})
}
