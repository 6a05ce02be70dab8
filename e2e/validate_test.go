//go:build linux

package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// contract is openapi.yaml, loaded once.
var contract = sync.OnceValues(func() (*testenv.Contract, error) {
	return testenv.NewContract(ratelimitd.OpenAPI())
})

// validating returns a transport that checks responses from next against
// openapi.yaml and fails t on any that the contract does not describe: an
// unknown route or status, a missing header, a body off its schema. It
// checks every response when every is 1, else the first of each method,
// path and status and one in every after that, so that checking does not
// take the CPU that a test under load measures.
func validating(t testing.TB, next http.RoundTripper, every int) http.RoundTripper {
	c, err := contract()
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var (
		seen  sync.Map // "METHOD path status" -> struct{}
		count atomic.Int64
	)
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		res, err := next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		_, loaded := seen.LoadOrStore(req.Method+" "+req.URL.Path+" "+strconv.Itoa(res.StatusCode), struct{}{})
		if loaded && count.Add(1)%int64(every) != 0 {
			return res, nil
		}
		if _, err := c.Check(req, res.StatusCode, res.Header, body); err != nil {
			t.Errorf("%s %s: %v\nbody: %s", req.Method, req.URL.Path, err, body)
		}
		return res, nil
	})
}

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
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		res, err := next.RoundTrip(req)
		if d, ok := req.Context().Value(timingKey{}).(*time.Duration); ok {
			*d = time.Since(start)
		}
		return res, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
