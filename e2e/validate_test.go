//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/ratelimitd/ratelimitd"
)

// contract is openapi.yaml as a router of its operations, loaded once.
var contract = sync.OnceValues(func() (routers.Router, error) {
	doc, err := openapi3.NewLoader().LoadFromData(ratelimitd.OpenAPI())
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	// openapi.yaml describes YAML documents (the export, the contract
	// itself) as strings, their text; kin-openapi would otherwise parse
	// them and hold a mapping against {type: string}.
	openapi3filter.RegisterBodyDecoder("application/yaml", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(r)
		return string(b), err
	})
	return legacy.NewRouter(doc)
})

// validating returns a transport that checks responses from next against
// openapi.yaml and fails t on any that the contract does not describe: an
// unknown route or status, a missing header, a body off its schema. It
// checks every response when every is 1, else the first of each route
// and status and one in every after that.
func validating(t testing.TB, next http.RoundTripper, every int) http.RoundTripper {
	var (
		seen  sync.Map // "METHOD route status" -> struct{}
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
		if err := checkResponse(req, res, body, func(key string) bool {
			_, loaded := seen.LoadOrStore(key, struct{}{})
			return !loaded || count.Add(1)%int64(every) == 0
		}); err != nil {
			t.Errorf("%s %s: %v\nbody: %s", req.Method, req.URL.Path, err, body)
		}
		return res, nil
	})
}

// checkResponse validates one response against openapi.yaml when sample
// says so for its "METHOD route status".
func checkResponse(req *http.Request, res *http.Response, body []byte, sample func(key string) bool) error {
	router, err := contract()
	if err != nil {
		return fmt.Errorf("openapi.yaml: %w", err)
	}
	// openapi.yaml's server is "/": the legacy router matches the path
	// alone.
	pathOnly := req.Clone(req.Context())
	pathOnly.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	route, params, err := router.FindRoute(pathOnly)
	if err != nil {
		return fmt.Errorf("answered %d but is not in openapi.yaml: %w", res.StatusCode, err)
	}
	if !sample(req.Method + " " + route.Path + " " + strconv.Itoa(res.StatusCode)) {
		return nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: pathOnly, PathParams: params, Route: route},
		Status:                 res.StatusCode,
		Header:                 res.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		return fmt.Errorf("the %d response does not match openapi.yaml: %w", res.StatusCode, err)
	}
	return nil
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
