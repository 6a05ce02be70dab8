package api

import (
	"errors"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// The results decisions are counted by.
const (
	resultAllowed      = "allowed"
	resultNearLimit    = "near_limit"
	resultDenied       = "denied"
	resultShadowDenied = "shadow_denied"
	resultDegraded     = "degraded"
)

// metrics are the service's Prometheus metrics. Labels never hold a bucket
// id or a raw path, so their number is bounded by the limits table and the
// routes.
type metrics struct {
	decisionsTotal *prometheus.CounterVec
	settledTokens  *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	handler        http.Handler
	// codes are the status codes as label values, made once.
	codes [600]string
	// counters and observers hold the series already looked up: a vector's
	// lookup hashes every label value on every call, and these are on
	// every request. They grow with the series they hold, which the label
	// values bound.
	counters  seriesCache[decisionSeries, prometheus.Counter]
	observers seriesCache[requestSeries, prometheus.Observer]
}

// decisionSeries names a series of ratelimitd_decisions_total.
type decisionSeries struct {
	op       limiter.Op
	limit    string
	result   string
	frontend string
}

// requestSeries names a series of ratelimitd_http_request_duration_seconds.
type requestSeries struct {
	route, method, code string
}

// seriesCache maps label values to their series, for reading without a
// lock: a miss copies the map, which happens once per series.
type seriesCache[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

// get returns the series of k, asking lookup for it on a miss.
func (c *seriesCache[K, V]) get(k K, lookup func() V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]V
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if v, ok := old[k]; ok {
		return v
	}
	v := lookup()
	m := make(map[K]V, len(old)+1)
	maps.Copy(m, old)
	m[k] = v
	c.m.Store(&m)
	return v
}

// newMetrics registers the metrics in reg. now reads the clock for the
// snapshot's age; started stands in for the time of a snapshot that never
// loaded, so that an alert on the age fires when loading never succeeds.
func newMetrics(reg *prometheus.Registry, cfg Config, now func() time.Time, started time.Time) *metrics {
	m := &metrics{
		decisionsTotal: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_decisions_total",
			Help: "Bucket decisions by operation, limit, result and front end: allowed, near_limit (allowed with at least 80% of the burst used), " +
				"denied, shadow_denied (denied by a shadow limit, which lets the request through) or degraded (allowed while the store " +
				"failed). For refunds, allowed means tokens were given back; for settles, that the settle was applied (all but blocked buckets). The front end is http (REST) or grpc (Envoy's ShouldRateLimit).",
		}, []string{"op", "limit", "result", "frontend"})),
		// The unit is a label here, and not on the decisions, because
		// tokens of different units must never be summed: a dashboard
		// sums by unit. It adds no series, a limit having one unit.
		settledTokens: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_settled_tokens_total",
			Help: "Tokens that settles gave back (returned: reserved beyond actual) or charged (charged: actual beyond reserved), " +
				"by limit and unit. The excess of a settle that hit the cap of one burst of debt is counted as capped, not charged: " +
				"only part of it was charged.",
		}, []string{"limit", "unit", "kind"})),
		duration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimitd_http_request_duration_seconds",
			Help:    "HTTP request latencies by route pattern, method and status code.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route", "method", "code"})),
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	for i := range m.codes {
		m.codes[i] = strconv.Itoa(i)
	}
	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_store_errors_total",
		Help: "Calls to the bucket store that failed.",
	}, func() float64 { return float64(cfg.Limiter.Stats().StoreErrors) }))
	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_denied_cache_hits_total",
		Help: "Denials answered from the local cache of empty buckets, without the store.",
	}, func() float64 { return float64(cfg.Limiter.Stats().DeniedCacheHit) }))
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimitd_snapshot_age_seconds",
		Help: "Seconds since the snapshot of limits and overrides was last confirmed against the database; " +
			"before the first load, seconds since the start.",
	}, func() float64 {
		synced := cfg.Status().SyncedAt
		if synced.IsZero() {
			synced = started
		}
		return now().Sub(synced).Seconds()
	}))
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimitd_snapshot_version",
		Help: "The database change sequence number the snapshot includes.",
	}, func() float64 { return float64(cfg.Status().Version) }))
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimitd_snapshot_limits",
		Help: "Limits in the snapshot.",
	}, func() float64 { return float64(cfg.Status().Limits) }))
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimitd_snapshot_overrides",
		Help: "Enabled overrides in the snapshot, expired ones included until the next full load.",
	}, func() float64 { return float64(cfg.Status().Overrides) }))
	register(reg, collectors.NewGoCollector())
	register(reg, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// register adds c to reg and returns it. When an equal collector is
// registered already, as when two servers share a registry, that one is
// returned instead, so that both count into the same series.
func register[C prometheus.Collector](reg *prometheus.Registry, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if err != nil {
		// Only a programming error (a clash of names or labels) gets
		// here, and every test would see it.
		panic(err)
	}
	return c
}

// ObserveDecisions counts the decisions of a REST result.
func (s *Server) ObserveDecisions(op limiter.Op, res limiter.Result) {
	s.metrics.count(op, res, "http")
}

// ObserveSettle counts the tokens a settle gave back and charged. A
// settle that changed nothing (a blocked or unlimited bucket, or an answer
// degraded by a store failure) counts nothing.
func (s *Server) ObserveSettle(reqs []limiter.Request, res limiter.Result) {
	if res.Degraded {
		return
	}
	for i := range res.Decisions {
		d := &res.Decisions[i]
		if !d.Allowed || d.Source == limiter.SourceUnlimited {
			continue
		}
		reserved, actual := reqs[i].Reserved, reqs[i].Cost
		kind, n := "charged", actual-reserved
		switch {
		case n < 0:
			kind, n = "returned", -n
		case d.Capped:
			kind = "capped"
		case n == 0:
			continue
		}
		s.metrics.settledTokens.WithLabelValues(d.Limit, d.Unit, kind).Add(float64(n))
	}
}

// count counts the decisions of a result of a front end.
func (m *metrics) count(op limiter.Op, res limiter.Result, frontend string) {
	for i := range res.Decisions {
		d := &res.Decisions[i]
		k := decisionSeries{op: op, limit: d.Limit, result: resultLabel(d, res.Degraded), frontend: frontend}
		m.counters.get(k, func() prometheus.Counter {
			return m.decisionsTotal.WithLabelValues(k.op.String(), k.limit, k.result, k.frontend)
		}).Inc()
	}
}

// CountDecisions returns what counts the decisions of another front end
// (Envoy's gRPC, "grpc") into the metrics of REST's, so that one series
// per limit and result shows both.
func (s *Server) CountDecisions(frontend string) func(op limiter.Op, res limiter.Result) {
	return func(op limiter.Op, res limiter.Result) { s.metrics.count(op, res, frontend) }
}

// resultLabel is the result label of a decision. Near the limit means,
// as in Envoy's ratelimit, that at least 80% of the burst is used.
func resultLabel(d *limiter.Decision, degraded bool) string {
	switch {
	case !d.Allowed && d.Shadow:
		return resultShadowDenied
	case !d.Allowed:
		return resultDenied
	case degraded && d.Source != limiter.SourceUnlimited:
		return resultDegraded
	case d.Params.Burst > 0 && (d.Params.Burst-d.Remaining)*5 >= d.Params.Burst*4:
		return resultNearLimit
	}
	return resultAllowed
}

// ObserveRequest observes one HTTP request. route is the route's pattern
// ("" when none matched), never the path, which can hold anything.
func (s *Server) ObserveRequest(route, method string, status int, took time.Duration) {
	m := s.metrics
	if route == "" {
		route = "unmatched"
	}
	code := "unknown"
	if status >= 0 && status < len(m.codes) {
		code = m.codes[status]
	}
	k := requestSeries{route: route, method: methodLabel(method), code: code}
	m.observers.get(k, func() prometheus.Observer {
		return m.duration.WithLabelValues(k.route, k.method, k.code)
	}).Observe(took.Seconds())
}

// methodLabel bounds the method label: a client may send any token.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}

// metricsHandler serves the registry in the Prometheus text format.
func (s *Server) metricsHandler(c echo.Context) error {
	s.metrics.handler.ServeHTTP(c.Response(), c.Request())
	return nil
}
