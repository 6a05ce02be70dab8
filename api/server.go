// Package api is the HTTP interface of ratelimitd: the REST API described
// by openapi.yaml, the operational endpoints and the admin page's files. It
// consumes small interfaces and never knows which database or store is
// behind them.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/loader"
)

// maxImportBody bounds an import's body; every other admin body has the
// edge's default bound.
const maxImportBody = 10 << 20

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
	// Logger receives server errors with their request ids;
	// slog.Default() when nil.
	Logger *slog.Logger
	// Now reads the clock, for expiry checks and ages; time.Now when nil.
	Now func() time.Time
}

// Server serves the API through the edge (package edge), which its
// Routes are given to.
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
	e.Use(named)
	s.echo = e
	s.routes()
	return s
}

// Routes are the API's routes for the edge: every path that no other
// front serves, under the edge's default bound on bodies, and imports,
// whose bodies may be larger. Echo's router finds the route.
func (s *Server) Routes() []edge.Route {
	return []edge.Route{
		{Path: "/", Serve: s.serve},
		{Path: "/v1/import", MaxBody: maxImportBody, Serve: s.serve},
	}
}

// serve answers a request with echo's own ServeHTTP. A HEAD request is
// routed as a GET (RFC 9110, section 9.3.2), so every GET route answers
// HEAD too: net/http leaves the body out, since its response writer still
// holds the HEAD request. Echo hands a handler's error to handleError,
// which gives it back to the edge through x.
func (s *Server) serve(x *edge.Exchange, r *http.Request) error {
	if r.Method == http.MethodHead {
		get := *r
		get.Method = http.MethodGet
		r = &get
	}
	s.echo.ServeHTTP(x, r)
	return nil
}

// exchange is the request's passage through the edge, which serve gives
// echo as its response writer.
func exchange(c echo.Context) *edge.Exchange {
	return c.Response().Writer.(*edge.Exchange)
}

// named is the middleware of every route: it names the route's pattern,
// for the edge's metrics and traces.
func named(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		exchange(c).SetRoute(c.Path())
		return next(c)
	}
}

// Patterns lists the registered routes as "METHOD /path/:param", in echo's
// notation, for the test that keeps openapi.yaml in step.
func (s *Server) Patterns() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
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
