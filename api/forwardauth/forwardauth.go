// Package forwardauth answers the gateways' forward-auth calls, ANY
// /v1/forward-auth/{domain}: nginx's auth_request, Traefik's ForwardAuth,
// Caddy's forward_auth and HAProxy's Lua action ask once per request
// whether it may pass. The query string says which descriptors to make, as
// Envoy's rate_limits actions would, from the original request's
// attributes, which the gateway passes in headers, and from the client
// address, read through the trusted proxies (client/clientip). The
// descriptors are decided by package descriptor, as ShouldRateLimit's
// are, so that one set of rules serves Envoy and every other gateway; the
// answer is the same result rendered as a status and headers a gateway
// can act on.
package forwardauth

import (
	"errors"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/api/descriptor"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Authenticator knows the API tokens; *auth.Keeper is one.
type Authenticator interface {
	Authenticate(secret string) (auth.Principal, bool)
}

// Observer counts the route's decisions; *telemetry.Front is one, whose
// decisions are counted as the forward_auth front's. The edge counts the
// requests.
type Observer interface {
	ObserveDecisions(op limiter.Op, res limiter.Result)
	// ObserveUnits counts the units a spend took from calendar quotas.
	ObserveUnits(op limiter.Op, reqs []limiter.Request, res limiter.Result)
	// ObserveUnmatched counts descriptors that matched no rule.
	ObserveUnmatched(n int)
}

// Config wires a Handler.
type Config struct {
	Limiter  descriptor.Decider
	Auth     Authenticator
	Observer Observer
	// Clients finds the client address through the trusted proxies
	// (RATELIMIT_TRUSTED_PROXIES); nil trusts none.
	Clients *clientip.Resolver
	// Now reads the clock, for the dry run's look-up of overrides;
	// time.Now when nil. It is the Limiter's clock.
	Now func() time.Time
}

// The route patterns, as the metrics and traces name them, and the
// headers of the route's own.
const (
	prefix         = "/v1/forward-auth/"
	routeDecide    = "/v1/forward-auth/:domain"
	routeMatch     = "/v1/forward-auth/:domain/match"
	suffixMatch    = "/match"
	headerToken    = "X-Ratelimit-Authorization"
	headerDegraded = "X-Ratelimit-Degraded"
)

// Paths are the route patterns the Handler serves, in OpenAPI's notation,
// each with the methods it answers: the decision any method, the dry run
// POST.
func Paths() map[string][]string {
	return map[string][]string{
		"/v1/forward-auth/{domain}":       {http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions},
		"/v1/forward-auth/{domain}/match": {http.MethodPost},
	}
}

// Handler serves forward auth.
type Handler struct {
	cfg     Config
	scratch sync.Pool
	// plans holds the plans of the query strings seen, which a gateway
	// repeats on every call; replaced whole when one is added.
	plans atomic.Pointer[map[string]*plan]
}

// maxPlans bounds the query strings whose plans are kept: a gateway has a
// few, one per location or route. Past the bound, new ones are parsed on
// every call.
const maxPlans = 256

// New builds the Handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg}
	if h.cfg.Now == nil {
		h.cfg.Now = time.Now
	}
	if h.cfg.Clients == nil {
		h.cfg.Clients = &clientip.Resolver{}
	}
	h.scratch.New = func() any { return new(scratch) }
	return h
}

// scratch is the working memory of one call, pooled.
type scratch struct {
	batch   descriptor.Batch
	entries []limiter.DescriptorEntry
	// made[k] is the index of the d of descriptor k of the batch, whose
	// entries' sources are plan.descriptors[made[k]].
	made []int
}

// Routes are the routes to register with the edge: every path below
// /v1/forward-auth/, any method. A call's body is never read; the bound is
// the dry run's, which reads one.
func (h *Handler) Routes() []edge.Route {
	return []edge.Route{{Path: prefix, MaxBody: maxMatchBody, Serve: h.serve}}
}

// serve routes a call: the decision, or its dry run.
func (h *Handler) serve(x *edge.Exchange, r *http.Request) error {
	route := routeDecide
	if strings.HasSuffix(r.URL.Path, suffixMatch) {
		route = routeMatch
	}
	x.SetRoute(route)
	domain, ok := domainOf(r, route)
	if !ok {
		return problem.Errorf(http.StatusNotFound, "no such route; forward auth is /v1/forward-auth/{domain}")
	}
	if route == routeMatch {
		if r.Method != http.MethodPost {
			x.Header().Set("Allow", http.MethodPost)
			return problem.Errorf(http.StatusMethodNotAllowed, "only POST is allowed here")
		}
		return h.match(x, r, domain)
	}
	sc := h.scratch.Get().(*scratch)
	defer h.scratch.Put(sc)
	return h.decide(x, r, domain, sc)
}

// domainOf returns the domain of the path, decoded, false when the path
// is not one of the routes'.
func domainOf(r *http.Request, route string) (string, bool) {
	p := r.URL.EscapedPath()
	rest, _ := strings.CutPrefix(p, prefix)
	if route == routeMatch {
		rest = strings.TrimSuffix(rest, suffixMatch)
	}
	if rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	if !strings.Contains(rest, "%") {
		return rest, true
	}
	d, err := url.PathUnescape(rest)
	return d, err == nil
}

// authorize checks the call's token: the one of X-Ratelimit-Authorization
// when it is sent, else Authorization's. A gateway sends its token in the
// first, so that the client's own Authorization reaches the route
// untouched, for descriptors keyed on it.
func (h *Handler) authorize(r *http.Request) error {
	v, ok := r.Header[headerToken]
	if !ok {
		v = r.Header["Authorization"]
	}
	value := ""
	if len(v) > 0 {
		value = v[0]
	}
	_, err := problem.Authorize(h.cfg.Auth, value, auth.Decide)
	return err
}

// cachedPlan returns the plan of a query string parsed before, nil for
// none: such a query holds no token, which the cache never keeps.
func (h *Handler) cachedPlan(raw string) *plan {
	if plans := h.plans.Load(); plans != nil {
		return (*plans)[raw]
	}
	return nil
}

// planOf parses the plan of a query string that holds no token, and keeps
// it.
func (h *Handler) planOf(raw string) (*plan, error) {
	p, err := parsePlan(raw)
	if err != nil {
		return nil, err
	}
	next := map[string]*plan{}
	if plans := h.plans.Load(); plans != nil {
		if len(*plans) >= maxPlans {
			return p, nil
		}
		next = maps.Clone(*plans)
	}
	next[raw] = p
	// Another call may have added a plan meanwhile: it is parsed again
	// when next seen.
	h.plans.Store(&next)
	return p, nil
}

// decide answers a forward-auth call.
func (h *Handler) decide(x *edge.Exchange, r *http.Request, domain string, sc *scratch) error {
	p := h.cachedPlan(r.URL.RawQuery)
	if p == nil && tokenInQuery(r.URL.RawQuery) {
		return errTokenInQuery
	}
	if err := h.authorize(r); err != nil {
		return err
	}
	if p == nil {
		var err error
		if p, err = h.planOf(r.URL.RawQuery); err != nil {
			return err
		}
	}
	snap := h.cfg.Limiter.Snapshot()
	if snap == nil {
		return limiter.ErrNoSnapshot
	}
	a := attributes{r: r, clients: h.cfg.Clients}
	if err := sc.fill(snap, domain, p, &a); err != nil {
		return err
	}
	if sc.batch.Len() == 0 {
		// No descriptor was made: nothing to limit.
		answer(x, p, limiter.Result{Allowed: true})
		return nil
	}
	if n := sc.batch.Unmatched(); n > 0 {
		h.cfg.Observer.ObserveUnmatched(n)
	}
	res, err := sc.batch.Decide(r.Context(), h.cfg.Limiter)
	if err != nil {
		return sc.name(p, err)
	}
	if len(res.Decisions) > 0 {
		h.cfg.Observer.ObserveDecisions(limiter.Spend, res)
		h.cfg.Observer.ObserveUnits(limiter.Spend, sc.batch.Spent(), res)
	}
	answer(x, p, res)
	return nil
}

// fill makes the descriptors of a call and adds them to the batch. A d
// whose header is absent makes no descriptor, as Envoy's request_headers
// action makes none.
func (sc *scratch) fill(snap *limiter.Snapshot, domain string, p *plan, a *attributes) error {
	sc.made = sc.made[:0]
	if err := sc.batch.Reset(domain); err != nil {
		return &problem.Error{Status: http.StatusUnprocessableEntity, Detail: "the domain is invalid",
			Fields: []limiter.FieldError{{Field: "domain", Message: err.(*descriptor.Error).Message}}}
	}
next:
	for i, srcs := range p.descriptors {
		sc.entries = sc.entries[:0]
		for _, s := range srcs {
			var v string
			var err error
			switch s.kind {
			case fromLiteral:
				v = s.value
			case fromHeader:
				v, err = headerValue(a.r, s.header)
				if err == nil && v == "" {
					continue next
				}
			default:
				v, err = a.value(s.kind)
			}
			if err != nil {
				return attrProblem(err, i, s)
			}
			sc.entries = append(sc.entries, limiter.DescriptorEntry{Key: s.key, Value: v})
		}
		sc.made = append(sc.made, i)
		if err := sc.batch.Add(snap, sc.entries, 1); err != nil {
			return sc.name(p, err)
		}
	}
	return nil
}

// attrProblem is the 422 of an attribute that source s of d[i] needs.
func attrProblem(err error, i int, s source) error {
	var ae *attrError
	if !errors.As(err, &ae) {
		return err
	}
	return &problem.Error{Status: http.StatusUnprocessableEntity, Detail: "a header the descriptors need is missing or invalid",
		Fields: []limiter.FieldError{{Field: ae.header, Message: ae.message + " (read for " + strconv.Quote(s.text) + " of d[" + strconv.Itoa(i) + "])"}}}
}

// name words an error of the batch as a 422 naming what the call sent: a
// value is named by the header it came from, anything else by its d.
func (sc *scratch) name(p *plan, err error) error {
	var de *descriptor.Error
	if !errors.As(err, &de) {
		return err
	}
	if de.Descriptor < 0 || de.Descriptor >= len(sc.made) {
		return &problem.Error{Status: http.StatusUnprocessableEntity, Detail: "the descriptors cannot be decided",
			Fields: []limiter.FieldError{{Field: "d", Message: de.Message}}}
	}
	i := sc.made[de.Descriptor]
	field := "d[" + strconv.Itoa(i) + "]"
	msg := de.Message
	if de.Entry >= 0 {
		s := p.descriptors[i][de.Entry]
		msg = "the value of " + strconv.Quote(s.text) + ": " + msg
		switch s.kind {
		case fromHeader:
			field = s.header
		case fromMethod, fromPath, fromHost:
			// Read from the gateway's headers: which one said it all.
			field = attributeHeaders[s.kind]
		}
	}
	return &problem.Error{Status: http.StatusUnprocessableEntity, Detail: "the descriptors cannot be decided",
		Fields: []limiter.FieldError{{Field: field, Message: msg}}}
}

// attributeHeaders name the headers an attribute is read from.
var attributeHeaders = map[kind]string{
	fromMethod: headerForwardedMethod + " or " + headerOriginalMethod,
	fromPath:   headerForwardedURI + " or " + headerOriginalURI,
	fromHost:   headerForwardedHost + " or " + headerHost,
}

// answer writes the decision: 200 when allowed, the plan's deny status
// with a problem when denied, with the RateLimit headers of the most
// restrictive descriptor either way, and a header saying that the store
// failed and the fail mode let the call through.
func answer(x *edge.Exchange, p *plan, res limiter.Result) {
	x.AddRateLimit(limiter.Spend, res)
	if res.Degraded {
		x.AddHeader(headerDegraded, append(x.Values(), "true"...))
	}
	if res.Allowed {
		x.WriteHeader(http.StatusOK)
		return
	}
	limit := ""
	if i := res.MostRestrictive(limiter.Spend); i >= 0 {
		limit = res.Decisions[i].Limit
	}
	pr := &problem.Problem{Status: p.denyStatus, RequestID: x.RequestID(),
		Detail: "the request is over the limit " + strconv.Quote(limit) + "; retry after the time in Retry-After"}
	problem.Write(x, nil, pr, pr)
}
