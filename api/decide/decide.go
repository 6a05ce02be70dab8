// Package decide serves the routes that act on buckets: /v1/check,
// /v1/spend, /v1/refund, /v1/settle, /v1/buckets/reset, and the leases of
// concurrency limits, /v1/acquire, /v1/release and /v1/renew. They are the service's hot
// path, so they are routes of the edge (package edge) written over the
// Limiter without the admin API's router, and this is the only package
// that holds code written for speed: a decoder for the common form of a
// body, an encoder for the answer, pooled working memory and the
// RateLimit headers. The benchmarks here measure what each saves: the
// strict decoder alone costs the common body about three times the
// allocations.
package decide

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// maxBody bounds a body: 100 buckets with the longest ids fit well within.
const maxBody = 1 << 20

// Limiter answers decisions, resets buckets and keeps leases;
// *limiter.Limiter is one.
type Limiter interface {
	Decide(ctx context.Context, op limiter.Op, reqs []limiter.Request, dst []limiter.Decision) (limiter.Result, error)
	Reset(ctx context.Context, reqs []limiter.Request) (int, error)
	Acquire(ctx context.Context, reqs []limiter.Request, ttl time.Duration) (limiter.LeaseResult, error)
	Release(ctx context.Context, id string) (bool, error)
	Renew(ctx context.Context, id string, ttl time.Duration) (limiter.Lease, error)
	// DecideMany answers the requests of /v1/decisions, each as its
	// single method would.
	DecideMany(ctx context.Context, calls []limiter.Call, dst []limiter.Decision) []limiter.Decision
	// FailOpen is the store failure policy, which a release or renewal
	// that cannot reach the store follows as a decision does.
	FailOpen() bool
	// Snapshot holds the limits that a refused body's buckets are checked
	// against, so that one 422 lists every bad field.
	Snapshot() *limiter.Snapshot
}

// Authenticator knows the API tokens; *auth.Keeper is one.
type Authenticator interface {
	Authenticate(secret string) (auth.Principal, bool)
}

// Observer counts what these routes decide, in the service's one
// registry; *telemetry.Front is one.
type Observer interface {
	ObserveDecisions(op limiter.Op, res limiter.Result)
	// ObserveAcquire counts the decisions of an acquire.
	ObserveAcquire(res limiter.Result)
	// ObserveUnits counts the units a decision moved, which its
	// decisions alone do not tell: those a settle gave back or charged,
	// and those a spend took from calendar quotas.
	ObserveUnits(op limiter.Op, reqs []limiter.Request, res limiter.Result)
}

// Config wires a Handler.
type Config struct {
	Limiter  Limiter
	Auth     Authenticator
	Observer Observer
	// Now reads the clock, for the expiry of overrides when a refused
	// body's buckets are checked and for a renewal answered without the
	// store; time.Now when nil. It is the Limiter's clock.
	Now func() time.Time
}

// route is one path this package serves. A new route is one more entry.
type route struct {
	path string
	// scopes may call it; admin always may.
	scopes []auth.Scope
	serve  func(h *Handler, w http.ResponseWriter, r *http.Request, sc *scratch) error
}

// form is what a body's buckets hold beside limit and bucket_id.
type form uint8

const (
	// bare buckets hold nothing else: a reset.
	bare form = iota
	// costed buckets may hold a cost: a check, spend or refund.
	costed
	// settled buckets hold an actual and may hold a reserved amount.
	settled
)

// formOf is the form of op's buckets.
func formOf(op limiter.Op) form {
	if op == limiter.Settle {
		return settled
	}
	return costed
}

func decideOp(op limiter.Op) func(*Handler, http.ResponseWriter, *http.Request, *scratch) error {
	return func(h *Handler, w http.ResponseWriter, r *http.Request, sc *scratch) error {
		return h.decide(w, r, sc, op)
	}
}

// routes lists every route. A check spends nothing, and support staff look
// buckets up with it; a reset is support work. Leases are taken and given
// back by the services that decide.
var routes = []route{
	{"/v1/check", []auth.Scope{auth.Decide, auth.Support}, decideOp(limiter.Check)},
	{"/v1/spend", []auth.Scope{auth.Decide}, decideOp(limiter.Spend)},
	{"/v1/refund", []auth.Scope{auth.Decide}, decideOp(limiter.Refund)},
	{"/v1/settle", []auth.Scope{auth.Decide}, decideOp(limiter.Settle)},
	{"/v1/buckets/reset", []auth.Scope{auth.Support}, (*Handler).reset},
	{"/v1/acquire", []auth.Scope{auth.Decide}, (*Handler).acquire},
	{"/v1/release", []auth.Scope{auth.Decide}, (*Handler).release},
	{"/v1/renew", []auth.Scope{auth.Decide}, (*Handler).renew},
	{routeDecisions, []auth.Scope{auth.Decide}, (*Handler).decisions},
}

// Paths are the paths the Handler serves, each with the POST method only.
func Paths() []string {
	out := make([]string, len(routes))
	for i, r := range routes {
		out[i] = r.path
	}
	return out
}

// Handler serves the bucket routes.
type Handler struct {
	cfg Config
	// scratch pools the working memory of requests (*scratch).
	scratch sync.Pool
}

// New builds the Handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg}
	if h.cfg.Now == nil {
		h.cfg.Now = time.Now
	}
	h.scratch.New = func() any { return new(scratch) }
	return h
}

// Routes are the Handler's routes, each POST only with a body of at most
// maxBody, for the edge to serve.
func (h *Handler) Routes() []edge.Route {
	out := make([]edge.Route, len(routes))
	for i := range routes {
		rt := &routes[i]
		out[i] = edge.Route{Method: http.MethodPost, Path: rt.path, MaxBody: maxBody,
			Serve: func(x *edge.Exchange, r *http.Request) error { return h.serve(x, r, rt) }}
	}
	return out
}

// serve checks the token, then the media type, so that nobody learns
// anything about a route they may not use, and runs the route with pooled
// working memory. An error is answered by the edge: a route returns none
// once it has begun its answer.
func (h *Handler) serve(x *edge.Exchange, r *http.Request, rt *route) error {
	// Indexed, not Get: the server gives header keys in canonical form.
	if _, err := problem.Authorize(h.cfg.Auth, first(r.Header["Authorization"]), rt.scopes...); err != nil {
		return err
	}
	if msg := input.MediaProblem(first(r.Header["Content-Type"]), "application/json"); msg != "" {
		return problem.Errorf(http.StatusUnsupportedMediaType, "%s", msg)
	}
	sc := h.scratch.Get().(*scratch)
	sc.reset(x)
	err := rt.serve(h, x, r, sc)
	sc.release()
	h.scratch.Put(sc)
	return err
}

// first is the first of a header's values, "" for none.
func first(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
}

// decide answers a check, spend, refund or settle. A decision is always a 200,
// whatever it says; an error (422, 503) never carries one.
func (h *Handler) decide(w http.ResponseWriter, r *http.Request, sc *scratch, op limiter.Op) error {
	reqs, err := h.read(r, sc, formOf(op), nil)
	if err != nil {
		return err
	}
	res, err := h.cfg.Limiter.Decide(r.Context(), op, reqs, sc.decisions)
	if cap(res.Decisions) > cap(sc.decisions) {
		sc.decisions = res.Decisions[:0]
	}
	if err != nil {
		return err
	}
	sc.x.AddRateLimit(op, res)
	sc.out = append(h.appendDecision(sc, sc.out, op, reqs, res), '\n')
	sc.answer(w)
	return nil
}

// appendDecision counts a decision's buckets and appends its answer to b.
func (h *Handler) appendDecision(sc *scratch, b []byte, op limiter.Op, reqs []limiter.Request, res limiter.Result) []byte {
	h.cfg.Observer.ObserveDecisions(op, res)
	h.cfg.Observer.ObserveUnits(op, reqs, res)
	sc.fill(op, res)
	return sc.result.appendJSON(b)
}

// reset makes buckets full again.
func (h *Handler) reset(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	reqs, err := h.read(r, sc, bare, nil)
	if err != nil {
		return err
	}
	n, err := h.cfg.Limiter.Reset(r.Context(), reqs)
	if err != nil {
		return err
	}
	sc.out = strconv.AppendInt(append(sc.out, `{"reset":`...), int64(n), 10)
	sc.out = append(sc.out, "}\n"...)
	sc.answer(w)
	return nil
}

var jsonType = []string{"application/json"}

// answer writes a 200 with the JSON body of sc.out; the edge adds the
// headers of sc.x. A client gone before it reads the answer has nothing to learn,
// so a failed write is not an error.
func (sc *scratch) answer(w http.ResponseWriter) {
	w.Header()["Content-Type"] = jsonType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(sc.out)
}

// read reads and decodes the body; more, when set, reads the members of
// its top level beside buckets. A body of the wrong shape is a 400; one
// with invalid values a 422 that also names the buckets the Limiter would
// refuse, so that one answer lists every bad field and nothing is spent.
func (h *Handler) read(r *http.Request, sc *scratch, f form, more func(input.Object, *input.Errors)) ([]limiter.Request, error) {
	if err := readBody(r, sc); err != nil {
		return nil, err
	}
	reqs, ok := decodeFast(sc.body, sc.reqs, f, sc)
	if ok {
		sc.reqs = reqs
		return reqs, nil
	}
	b, err := input.Parse(sc.body)
	if err != nil {
		return nil, err
	}
	sc.reqs, err = h.readStrict(b, sc.reqs[:0], f, more)
	return sc.reqs, err
}

// readStrict reads the buckets of a parsed body, appending them to dst.
// One with invalid values is a 422 that also names the buckets the
// Limiter would refuse, so that one answer lists every bad field and
// nothing is spent.
func (h *Handler) readStrict(b *input.Body, dst []limiter.Request, f form, more func(input.Object, *input.Errors)) ([]limiter.Request, error) {
	start := len(dst)
	reqs, errs, err := readBuckets(b, dst, f, more)
	if err != nil {
		return reqs, err
	}
	if !errs.Empty() {
		h.bucketErrors(reqs[start:], errs)
		return reqs, errs.Err()
	}
	return reqs, nil
}

// readBody reads the body into sc.body.
func readBody(r *http.Request, sc *scratch) error {
	var err error
	sc.body, err = input.Read(r, sc.body)
	return err
}

// bucketErrors adds to errs what the Limiter would say of the requests
// whose limit and bucket id are valid so far: unknown limits, bad bucket
// ids and repeated buckets.
func (h *Handler) bucketErrors(reqs []limiter.Request, errs *input.Errors) {
	snap := h.cfg.Limiter.Snapshot()
	if snap == nil {
		return
	}
	now := h.cfg.Now()
	first := map[string]int{}
	for i, r := range reqs {
		prefix := input.Index("buckets", i)
		if errs.Has(prefix+".limit") || errs.Has(prefix+".bucket_id") {
			continue
		}
		res, err := snap.Resolve(r.Limit, r.BucketID, now)
		var fe limiter.FieldError
		if errors.As(err, &fe) {
			errs.Add(prefix+"."+fe.Field, fe.Message)
			continue
		}
		if j, ok := first[res.Key]; ok {
			errs.Add(prefix, "same bucket as buckets["+strconv.Itoa(j)+"]")
			continue
		}
		first[res.Key] = i
	}
}
