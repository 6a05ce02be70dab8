package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/ratelimitd/ratelimitd"
)

// Contract checks responses against an OpenAPI document: that their route
// and status are documented, and that their headers and body fit. Tests
// pass every response they receive through it, so that openapi.yaml is
// checked against the real service, not against itself.
type Contract struct {
	router routers.Router
}

// NewContract loads and validates an OpenAPI document.
func NewContract(spec []byte) (*Contract, error) {
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	return &Contract{router: router}, nil
}

// Check validates one response to req and returns the documented route it
// answered ("GET /v1/limits/{name}"), "" when it is a 404 or 405 of no
// documented operation, which the document has nothing to say about.
func (c *Contract) Check(req *http.Request, status int, header http.Header, body []byte) (string, error) {
	// The document's server is "/": the router matches the path alone.
	pathOnly := req.Clone(req.Context())
	pathOnly.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	// A path parameter holds one segment, but the admin page's files may
	// nest and the page itself has an empty path: every file is the one
	// operation /admin/{path}.
	if strings.HasPrefix(req.URL.Path, "/admin/") {
		pathOnly.URL = &url.URL{Path: "/admin/file"}
	}
	// A 405 answers an operation that does not exist (the router may still
	// match the path of another one, as /v1/limits matches
	// /v1/limits/{name}).
	if status == http.StatusMethodNotAllowed {
		return "", nil
	}
	route, params, err := c.router.FindRoute(pathOnly)
	if err != nil {
		if status == http.StatusNotFound {
			return "", nil
		}
		return "", fmt.Errorf("answered %d but is not in openapi.yaml: %w", status, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: pathOnly, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	name := req.Method + " " + route.Path
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		return name, fmt.Errorf("the %d response does not match openapi.yaml: %w", status, err)
	}
	return name, nil
}

// CheckRequest validates a request, whose body is body, against the
// document: its route, parameters and body. Its security is the service's
// to check, not the document's.
func (c *Contract) CheckRequest(req *http.Request, body []byte) error {
	pathOnly := req.Clone(req.Context())
	pathOnly.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	pathOnly.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := c.router.FindRoute(pathOnly)
	if err != nil {
		return fmt.Errorf("%s %s is not in openapi.yaml: %w", req.Method, req.URL.Path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: pathOnly, PathParams: params, Route: route,
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
		return fmt.Errorf("the request does not match openapi.yaml: %w", err)
	}
	return nil
}

// OpenAPI returns the contract of openapi.yaml.
func OpenAPI(t testing.TB) *Contract {
	c, err := openAPI()
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	return c
}

// openAPI is the contract of openapi.yaml, loaded once per test binary.
var openAPI = sync.OnceValues(func() (*Contract, error) { return NewContract(ratelimitd.OpenAPI()) })

// Validating returns a transport that checks responses from next against
// openapi.yaml and fails t on any that the contract does not describe: an
// unknown route or status, a missing header, a body off its schema. It
// checks every response when every is 1, else the first of each method,
// path and status and one in every after that, so that checking does not
// take the CPU that a test under load measures.
func Validating(t testing.TB, next http.RoundTripper, every int) http.RoundTripper {
	c := OpenAPI(t)
	var (
		seen  sync.Map // "METHOD path status" -> struct{}
		count atomic.Int64
	)
	return RoundTripper(func(req *http.Request) (*http.Response, error) {
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

// RoundTripper is a function that serves as an http.RoundTripper.
type RoundTripper func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f RoundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
