// Package api is the HTTP interface of ratelimitd: the REST API described
// by openapi.yaml, the operational endpoints and the admin page's files. It
// consumes small interfaces and never knows which database or store is
// behind them.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/loader"
)

// Body limits: admin writes are small; imports may be large.
const (
	maxBody       = 1 << 20
	maxImportBody = 10 << 20
)

// Decider is what the admin API needs of the engine that answers
// decisions (package decide serves those): its health and its counters;
// *limiter.Limiter is one.
type Decider interface {
	Ping(ctx context.Context) error
	Stats() limiter.Stats
	// Snapshot is what POST /v1/rules/match matches against.
	Snapshot() *limiter.Snapshot
}

// Authenticator knows the API tokens without asking the database on every
// request; *auth.Keeper is one.
type Authenticator interface {
	Authenticate(secret string) (auth.Principal, bool)
	// Loaded reports whether the tokens have been read once.
	Loaded() bool
}

// Config wires a Server.
type Config struct {
	// The stores of each kind of resource; *db.DB is each of them. Their
	// errors wrap the limiter package's sentinels (ErrNotFound,
	// ErrConflict, ErrPrecondition, ErrUnavailable) or are a
	// *limiter.ValidationError, which is how they become statuses.
	Limits    Limits
	Overrides Overrides
	Rules     Rules
	Tokens    Tokens
	Files     Files
	// Limiter answers decisions from its snapshot and store; /readyz and
	// /metrics report on it.
	Limiter Decider
	// Auth authenticates bearer tokens.
	Auth Authenticator
	// Sync returns once the snapshot holds every change committed before
	// the call; writes wait for it before answering. Nil waits for none.
	Sync func(context.Context) error
	// Status reports the loader's snapshot; nil reports none loaded.
	Status func() loader.Status
	// Observer gives requests their ids and times them; *telemetry.Front
	// is one. Required.
	Observer Observer
	// Metrics serves /metrics; nil serves 404 there.
	Metrics http.Handler
	// OpenAPI is the contract served at /openapi.yaml.
	OpenAPI []byte
	// Web holds the admin page's files, served at /admin/; nil serves
	// none.
	Web fs.FS
	// StoreName and DatabaseName say what backs the service, for
	// /v1/status: "memory" or "redis", "sqlite" or "postgres".
	StoreName    string
	DatabaseName string
	// FailOpen is the store failure policy, reported by /v1/status.
	FailOpen bool
	// StoreTopology reports the store's primaries for /v1/status; nil for
	// a store without any (the in-process one).
	StoreTopology func() StoreTopology
	// Logger receives server errors with their request ids;
	// slog.Default() when nil.
	Logger *slog.Logger
	// Now reads the clock, for expiry checks and ages; time.Now when nil.
	Now func() time.Time
	// Trace, when set, starts the span of a request to a route, given its
	// pattern ("" when none matched), and returns the request carrying
	// the span and what ends it with the answer's status; nil traces
	// nothing.
	Trace func(r *http.Request, route string) (*http.Request, func(status int))
}

// StoreTopology is what the bucket store knows of the primaries its
// writes go to.
type StoreTopology struct {
	// Primaries are their host:port addresses.
	Primaries []string
	// PrimaryChanges counts the times the store saw a primary replaced
	// since the process started, the last at PrimaryChangedAt (zero
	// before any).
	PrimaryChanges   int64
	PrimaryChangedAt time.Time
	// WaitReplicas is how many replicas acknowledge each write that takes
	// before it is answered; 0 when none do.
	WaitReplicas int
}

// Observer gives requests their ids, one sequence for the whole service,
// and times them by route pattern, method and status.
type Observer interface {
	RequestID() string
	ObserveRequest(route, method string, status int, took time.Duration)
}

// Server serves the API. It is an http.Handler.
type Server struct {
	cfg  Config
	echo *echo.Echo
	log  *slog.Logger
	now  func() time.Time
}

// New builds the server and registers every route.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.cfg.Status == nil {
		s.cfg.Status = func() loader.Status { return loader.Status{} }
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, limitHeaders)
	s.echo = e
	s.routes()
	return s
}

// ServeHTTP implements http.Handler with echo's own ServeHTTP. A HEAD
// request is routed as a GET (RFC 9110, section 9.3.2), so every GET route
// answers HEAD too: net/http leaves the body out, since its response writer
// still holds the HEAD request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		get := *r
		get.Method = http.MethodGet
		r = &get
	}
	s.echo.ServeHTTP(w, r)
}

// maxHeaderBytes bounds a request's header block. net/http refuses larger
// blocks only past its own MaxHeaderBytes (1 MiB by default), with a
// plain-text 431 it writes itself; below that, this bound answers them as
// every other error is answered, with a problem.
const maxHeaderBytes = 64 << 10

// headerBytes is the size of a header block as sent, near enough: names,
// values, ": " and CRLF.
func headerBytes(h http.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// limitHeaders answers a request whose header block is over
// maxHeaderBytes with a 431 problem, whatever its route.
func limitHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if headerBytes(c.Request().Header) > maxHeaderBytes {
			return problem.Errorf(http.StatusRequestHeaderFieldsTooLarge, "the request's headers are larger than %d bytes", maxHeaderBytes)
		}
		return next(c)
	}
}

// Routes lists the registered routes as "METHOD /path/:param", in echo's
// notation, for the test that keeps openapi.yaml in step.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// observe is the middleware of every route: it gives the request an id,
// in the X-Request-Id header of the response and in every log line about
// it; renders a handler's error, so that the status is known; times the
// request and counts it by route pattern, method and status; and turns a
// panic into a 500 (counted as such), so that no input can stop the
// process.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		var endSpan func(int)
		if s.cfg.Trace != nil {
			var r *http.Request
			r, endSpan = s.cfg.Trace(c.Request(), c.Path())
			c.SetRequest(r)
		}
		c.Response().Header()[echo.HeaderXRequestID] = []string{s.cfg.Observer.RequestID()}
		start := time.Now()
		if err := recovered(c, next); err != nil {
			c.Error(err)
		}
		s.cfg.Observer.ObserveRequest(c.Path(), c.Request().Method, c.Response().Status, time.Since(start))
		if endSpan != nil {
			endSpan(c.Response().Status)
		}
		return nil
	}
}

// recovered runs the handler, and returns a panic as an error whose text
// holds the stack, which the log gets under the request id.
func recovered(c echo.Context, next echo.HandlerFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: stack()}
		}
	}()
	return next(c)
}

// jsonEncode writes v as JSON without HTML escaping: responses are data,
// not pages.
func jsonEncode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeJSON answers status with v as JSON.
// It encodes v before the status goes out, so that an encoding error is
// answered as the 500 it is, never as a half-written success.
func writeJSON(c echo.Context, status int, v any) error {
	var buf bytes.Buffer
	if err := jsonEncode(&buf, v); err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(status)
	_, err := c.Response().Write(buf.Bytes())
	return err
}

// panicError is a recovered panic, logged with its stack as an internal
// error.
type panicError struct {
	value any
	stack string
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v\n%s", e.value, e.stack) }

func stack() string { return string(debug.Stack()) }
