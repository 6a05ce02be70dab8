// Package edge is where every HTTP request to the service enters, whichever
// front serves its route: it bounds the header block (431) and the body
// (413), gives the request its id, times and traces it, turns a panic into
// a 500, and answers every error a route returns as problem+json. A route
// gets all of it by being registered: New takes every route of the
// service, and the Edge is the only handler the HTTP server has, so that
// no route can be served beside it.
//
// It is on the decisions' hot path, so it allocates nothing of its own:
// the working memory of a request is pooled, and the answer's headers,
// the request id first, are set with one string and one slice when the
// answer begins.
package edge

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// MaxHeaderBytes bounds a request's header block. A larger one is answered
// 431 as any other error is, with a problem.
const MaxHeaderBytes = 64 << 10

// ServerHeaderBytes is what the HTTP server is to read of a request's
// line and headers (http.Server.MaxHeaderBytes) before it gives up and
// answers 431 itself, in plain text: far past MaxHeaderBytes, so that the
// edge answers all but the most abusive blocks. What it costs is the
// memory of a request's headers while they are read.
const ServerHeaderBytes = 4 << 20

// DefaultMaxBody bounds the body of a route that sets no bound of its own.
const DefaultMaxBody = 1 << 20

// Observer gives requests their ids, one sequence for the whole service,
// and times them by route; *telemetry.Front is one.
type Observer interface {
	// AppendRequestID appends a new request id to b, so that the id
	// shares the allocation of the answer's other headers.
	AppendRequestID(b []byte) []byte
	// ObserveRequest counts a request by its route's pattern ("" when
	// none matched), never by its path, which can hold anything.
	ObserveRequest(route, method string, status int, took time.Duration)
}

// Config wires an Edge.
type Config struct {
	// Observer is required.
	Observer Observer
	// Logger receives server errors with their request ids;
	// slog.Default() when nil.
	Logger *slog.Logger
	// Trace, when set, starts the span of a request and returns the
	// request carrying the span and what ends it, given the route's
	// pattern ("" when none matched) and the answer's status; nil, tracing
	// off, costs a request nothing.
	Trace func(r *http.Request) (*http.Request, func(route string, status int))
}

// Route is one route of the service.
type Route struct {
	// Method is the only method the route answers (405 for others, with
	// Allow); "" lets the route answer every method.
	Method string
	// Path is the path the route serves, exactly as the request names
	// it; one ending in "/" serves every path below it too, and the
	// longest such Path wins.
	Path string
	// MaxBody bounds the body in bytes; 0 is DefaultMaxBody.
	MaxBody int64
	// Serve answers a request, writing the answer to x. An error is
	// answered by the edge as a problem, unless the answer has begun.
	Serve func(x *Exchange, r *http.Request) error
}

// Edge serves every route of the service. It is an http.Handler.
type Edge struct {
	cfg    Config
	log    *slog.Logger
	exact  map[string]*Route
	prefix []*Route // longest Path first
	pool   sync.Pool
}

// New builds the Edge of routes. Two routes of one Path are a programming
// error, and panic.
func New(cfg Config, routes ...Route) *Edge {
	e := &Edge{cfg: cfg, log: cfg.Logger, exact: map[string]*Route{}}
	if e.log == nil {
		e.log = slog.Default()
	}
	for i := range routes {
		rt := &routes[i]
		if rt.MaxBody == 0 {
			rt.MaxBody = DefaultMaxBody
		}
		if _, dup := e.exact[rt.Path]; dup {
			panic("edge: two routes of " + rt.Path)
		}
		e.exact[rt.Path] = rt
		if strings.HasSuffix(rt.Path, "/") {
			e.prefix = append(e.prefix, rt)
		}
	}
	slices.SortFunc(e.prefix, func(a, b *Route) int { return len(b.Path) - len(a.Path) })
	e.pool.New = func() any { return new(Exchange) }
	return e
}

// find returns the route of path, nil for none.
func (e *Edge) find(path string) *Route {
	if rt := e.exact[path]; rt != nil {
		return rt
	}
	for _, rt := range e.prefix {
		if strings.HasPrefix(path, rt.Path) {
			return rt
		}
	}
	return nil
}

// epoch is what requests are timed from: time.Since(epoch) reads the
// monotonic clock alone, where time.Now also reads the wall clock, which
// a duration has no use for.
var epoch = time.Now()

// ServeHTTP implements http.Handler.
func (e *Edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Since(epoch)
	var endSpan func(string, int)
	if e.cfg.Trace != nil {
		r, endSpan = e.cfg.Trace(r)
	}
	rt := e.find(r.URL.Path)
	x := e.pool.Get().(*Exchange)
	x.reset(w, rt)
	x.values = e.cfg.Observer.AppendRequestID(x.values)
	x.mark("X-Request-Id")
	body := r.Body
	if err := e.serve(x, r, rt); err != nil {
		x.err = err
	}
	r.Body = body
	if x.err != nil {
		e.fail(x, r)
	} else if x.status == 0 {
		// The route wrote nothing: net/http would answer 200 without
		// the headers.
		x.WriteHeader(http.StatusOK)
	}
	e.cfg.Observer.ObserveRequest(x.route, r.Method, x.status, time.Since(epoch)-start)
	if endSpan != nil {
		endSpan(x.route, x.status)
	}
	// A pooled Exchange keeps nothing of the request: the body's reader
	// would pin the request, and what it reads from, until the Exchange
	// serves another.
	x.w, x.err, x.body = nil, nil, limited{}
	e.pool.Put(x)
}

// serve checks what every route shares, in this order: the header block,
// the route and its method, and the body's declared length; then it runs
// the route, with the body bounded, and turns a panic into an error. A
// route checks its token before it reads the body, so that a body of
// undeclared length is refused past the bound only for those who may
// use the route.
func (e *Edge) serve(x *Exchange, r *http.Request, rt *Route) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v\n%s", v, debug.Stack())
		}
	}()
	if headerBytes(r.Header) > MaxHeaderBytes {
		return problem.Errorf(http.StatusRequestHeaderFieldsTooLarge, "the request's headers are larger than %d bytes", MaxHeaderBytes)
	}
	if rt == nil {
		return problem.Errorf(http.StatusNotFound, "no such route")
	}
	if rt.Method != "" && r.Method != rt.Method {
		x.Header().Set("Allow", rt.Method)
		return problem.Errorf(http.StatusMethodNotAllowed, "only %s is allowed here", rt.Method)
	}
	if r.ContentLength > rt.MaxBody {
		return problem.TooLarge(rt.MaxBody)
	}
	if r.Body != nil && r.Body != http.NoBody {
		x.body = limited{rc: r.Body, left: rt.MaxBody, max: rt.MaxBody}
		r.Body = &x.body
	}
	return rt.Serve(x, r)
}

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

// fail answers x.err as application/problem+json. Anything that is not a
// client's mistake or an unavailable backend is internal: masked in the
// answer, logged with its chain under the request id.
func (e *Edge) fail(x *Exchange, r *http.Request) {
	if x.status != 0 {
		// Too late to answer: the log has it.
		e.log.Error("request failed after its answer began", "request_id", x.RequestID(), "path", x.route, "err", x.err)
		return
	}
	p := &problem.Problem{RequestID: x.setHeaders()}
	body, ok := problem.From(x.err, p)
	if !ok {
		problem.Internal(p)
	}
	switch {
	case p.Status == http.StatusServiceUnavailable:
		// An unavailable backend fails every request until it returns;
		// the limiter, the loader and the token keeper log the outage
		// once, so each refused request is only worth a debug line.
		e.log.Debug("request failed", "request_id", p.RequestID, "path", x.route, "status", p.Status, "err", x.err)
	case p.Status >= 500:
		e.log.Error("request failed", "request_id", p.RequestID, "method", r.Method, "path", x.route, "status", p.Status, "err", x.err)
	}
	problem.Write(x, x.err, p, body)
}

// Exchange is one request's passage through the edge: the answer's
// writer, which sets the headers the route added when the answer begins,
// and the route's way to add them without allocating. It is valid until
// the route returns.
type Exchange struct {
	w      http.ResponseWriter
	status int
	// route is the pattern the request is counted and traced by.
	route string
	// values holds the values of the answer's headers end to end, the
	// request id first, and marks where each ends.
	values []byte
	marks  []headerMark
	// id is the request id, once a string of it was made.
	id   string
	set  bool
	err  error
	body limited
}

// headerMark ends the value of a header in Exchange.values.
type headerMark struct {
	// key is in canonical form: setHeaders sets it as it is.
	key string
	end int
}

// Bounds of what a pooled Exchange keeps between requests.
const maxPooledValues = 4 << 10

func (x *Exchange) reset(w http.ResponseWriter, rt *Route) {
	if cap(x.values) > maxPooledValues {
		x.values = nil
	}
	x.w, x.status, x.route, x.id, x.set, x.err = w, 0, "", "", false, nil
	x.values, x.marks = x.values[:0], x.marks[:0]
	if rt != nil {
		x.route = rt.Path
	}
}

// Values returns the memory of the answer's header values, to which a
// route appends a value before it calls AddHeader with the result.
func (x *Exchange) Values() []byte { return x.values }

// AddHeader adds a header to the answer: key, in canonical form, whose
// value was appended to what Values returned, giving values.
func (x *Exchange) AddHeader(key string, values []byte) {
	x.values = values
	x.mark(key)
}

// AddRateLimit adds the RateLimit-Policy, RateLimit and Retry-After
// headers of a decision's result, as problem.AppendRateLimit words them
// for every front.
func (x *Exchange) AddRateLimit(op limiter.Op, res limiter.Result) {
	b, ends := problem.AppendRateLimit(x.values, op, res)
	// Each value ends where its mark says, in the one array they share.
	if ends.Policy > 0 {
		x.AddHeader(problem.HeaderPolicy, b[:ends.Policy])
		x.AddHeader(problem.HeaderRateLimit, b[:ends.RateLimit])
	}
	if ends.RetryAfter > 0 {
		x.AddHeader(problem.HeaderRetryAfter, b[:ends.RetryAfter])
	}
}

func (x *Exchange) mark(key string) {
	x.marks = append(x.marks, headerMark{key: key, end: len(x.values)})
}

// RequestID returns the request's id, which the answer's X-Request-Id
// and every log line about the request carry.
func (x *Exchange) RequestID() string {
	if x.id == "" {
		x.id = string(x.values[:x.marks[0].end])
	}
	return x.id
}

// SetRoute names the pattern the request is counted and traced by, for
// a route that serves several patterns (the admin API's router), once it
// knows which one matched.
func (x *Exchange) SetRoute(pattern string) { x.route = pattern }

// Fail records err as the request's error, answered as one the route
// returns, for a route whose framework keeps a handler's errors to
// itself.
func (x *Exchange) Fail(err error) { x.err = err }

// setHeaders sets the added headers once and returns the request id. Each
// value is a slice of its own capacity, so that adding to one header
// cannot overwrite another.
func (x *Exchange) setHeaders() string {
	if x.set {
		return x.RequestID()
	}
	x.set = true
	h := x.w.Header()
	all := string(x.values)
	values := make([]string, len(x.marks))
	start := 0
	for i, m := range x.marks {
		values[i] = all[start:m.end]
		h[m.key] = values[i : i+1 : i+1]
		start = m.end
	}
	x.id = values[0]
	return x.id
}

// Header implements http.ResponseWriter.
func (x *Exchange) Header() http.Header { return x.w.Header() }

// WriteHeader implements http.ResponseWriter: the first status sets the
// added headers.
func (x *Exchange) WriteHeader(status int) {
	if x.status == 0 && status >= 200 {
		x.status = status
		x.setHeaders()
	}
	x.w.WriteHeader(status)
}

// Write implements http.ResponseWriter.
func (x *Exchange) Write(b []byte) (int, error) {
	if x.status == 0 {
		x.WriteHeader(http.StatusOK)
	}
	return x.w.Write(b)
}

// Unwrap gives http.ResponseController the server's writer, for flushes
// and deadlines.
func (x *Exchange) Unwrap() http.ResponseWriter { return x.w }

// limited is a request body that fails past max bytes, as
// http.MaxBytesReader does, without an allocation of its own: the server
// ends a body at its declared length, but one of undeclared length, or a
// caller in this process, may send more.
type limited struct {
	rc        io.ReadCloser
	left, max int64
}

// Read implements io.Reader: it reads one byte more than the bound allows,
// to learn whether the body goes past it.
func (l *limited) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.rc.Read(p)
	if int64(n) <= l.left {
		l.left -= int64(n)
		return n, err
	}
	n = int(l.left)
	l.left = 0
	return n, &http.MaxBytesError{Limit: l.max}
}

// Close implements io.Closer.
func (l *limited) Close() error { return l.rc.Close() }
