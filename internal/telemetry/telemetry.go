// Package telemetry holds the service's Prometheus metrics, its request
// ids and its OpenTelemetry traces, made in one place and wired by cmd.
// The front ends see only the narrow observer interfaces they declare,
// which *Front implements, so that none of them imports another to count,
// and the hooks of Traces, nil when tracing is off.
package telemetry

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/loader"
)

// result is a result that decisions are counted by, an index of
// resultLabels, so that a series is found without hashing its label.
type result uint8

// The results decisions are counted by.
const (
	resultAllowed result = iota
	resultNearLimit
	resultDenied
	resultShadowDenied
	resultDegraded
)

// resultLabels are the results' label values.
var resultLabels = [...]string{
	resultAllowed:      "allowed",
	resultNearLimit:    "near_limit",
	resultDenied:       "denied",
	resultShadowDenied: "shadow_denied",
	resultDegraded:     "degraded",
}

// Config says what the gauges report on.
type Config struct {
	// Registry receives every metric, the Go and process collectors
	// included; a private one when nil.
	Registry *prometheus.Registry
	// Stats reads the limiter's counters; nil reports zeros.
	Stats func() limiter.Stats
	// Status reports the loader's snapshot; nil reports none loaded.
	Status func() loader.Status
	// Now reads the clock, for the snapshot's age; time.Now when nil.
	Now func() time.Time
	// PrimaryChanges reads how often the store has seen its primary
	// replaced (redisstore's Topology); nil reports 0, as for a store
	// without one.
	PrimaryChanges func() int64
}

// Telemetry is the service's metrics and request ids. Labels never hold a
// bucket id or a raw path, so the number of series is bounded by the
// limits table and the routes.
type Telemetry struct {
	decisionsTotal *prometheus.CounterVec
	settledTokens  *prometheus.CounterVec
	quotaUnits     *prometheus.CounterVec
	leasesTotal    *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	storeDuration  *prometheus.HistogramVec
	unmatched      *prometheus.CounterVec
	handler        http.Handler
	// codes are the status codes as label values, made once.
	codes [600]string
	// observers, stores and leases hold the series already looked up, as
	// Front's counters do: a vector's lookup hashes every label value on
	// every call, and these are on every request. They grow with the
	// series they hold, which the label values bound. Their keys hold as
	// few strings as they can, each hashed on every look-up.
	observers seriesCache[requestSeries, prometheus.Observer]
	stores    seriesCache[storeSeries, prometheus.Observer]
	leases    seriesCache[string, *[len(leaseEvents)]prometheus.Counter]

	// requestPrefix and requestSeq make request ids unique across restarts
	// and cheap to generate.
	requestPrefix string
	requestSeq    atomic.Uint64
}

// decisionSeries names a series of ratelimitd_decisions_total of one
// front end.
type decisionSeries struct {
	limit string
	op    limiter.Op
	// acquire counts an acquire's decisions, as op acquire.
	acquire bool
	result  result
}

// requestSeries names a series of ratelimitd_http_request_duration_seconds.
type requestSeries struct {
	route  string
	method method
	// status is -1 for one that has no label of its own.
	status int
}

// storeSeries names a series of ratelimitd_store_duration_seconds.
type storeSeries struct {
	op     limiter.Op
	failed bool
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

// New registers the metrics. Before the first load of the snapshot, its
// age counts from New's call, so that an alert on the age fires when
// loading never succeeds.
func New(cfg Config) *Telemetry {
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Stats == nil {
		cfg.Stats = func() limiter.Stats { return limiter.Stats{} }
	}
	if cfg.Status == nil {
		cfg.Status = func() loader.Status { return loader.Status{} }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PrimaryChanges == nil {
		cfg.PrimaryChanges = func() int64 { return 0 }
	}
	started := cfg.Now()
	reg := cfg.Registry
	t := &Telemetry{
		decisionsTotal: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_decisions_total",
			Help: "Bucket decisions by operation, limit, result and front end: allowed, near_limit (allowed with at least 80% of the burst used), " +
				"denied, shadow_denied (denied by a shadow limit, which lets the request through) or degraded (allowed while the store " +
				"failed). For refunds, allowed means tokens were given back; for settles, that the settle was applied (all but blocked buckets). The front end is http (REST), grpc (Envoy's ShouldRateLimit) or forward_auth (the gateways' forward auth).",
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
		// Units, not decisions: a quota is spent by the unit (tokens,
		// bytes), and its usage per window is the increase over it.
		quotaUnits: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_quota_spent_units_total",
			Help: "Units that allowed spends took from the buckets of calendar quotas, by limit and unit, on both front ends. " +
				"Refunds and settles are not counted here (settles are in ratelimitd_settled_tokens_total).",
		}, []string{"limit", "unit"})),
		leasesTotal: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_leases_total",
			Help: "Leases of concurrency limits by limit and event: acquired, released, renewed, or expired (counted when the store " +
				"drops it: the sweep of the replica that acquired or last renewed it, within 0.25 s of its expiry, or an acquire on its " +
				"bucket), each counted once per bucket of the lease. Leases held per limit are acquired - released - expired, summed " +
				"over the replicas: an expired lease counts as held until its sweep; a stopped replica's counters and unswept leases, " +
				"and leases freed by a bucket reset and never released, are off the sum (docs/operations.md).",
		}, []string{"limit", "event"})),
		duration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimitd_http_request_duration_seconds",
			Help:    "HTTP request latencies by route pattern, method and status code.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route", "method", "code"})),
		// Buckets from 50 µs: a local Redis answers a script call in a
		// few hundred microseconds, the in-process store in a few.
		storeDuration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimitd_store_duration_seconds",
			Help:    "Latency of the bucket store's calls for decisions, by operation and result (ok or error); a timed-out call counts as an error at its timeout.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"op", "result"})),
		unmatched: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_unmatched_descriptors_total",
			Help: "Descriptors that matched no rule, and so were answered OK without a bucket, by front end: grpc (ShouldRateLimit) or forward_auth.",
		}, []string{"frontend"})),
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	for i := range t.codes {
		t.codes[i] = strconv.Itoa(i)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	t.requestPrefix = hex.EncodeToString(b[:]) + "-"

	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_store_errors_total",
		Help: "Calls to the bucket store that failed.",
	}, func() float64 { return float64(cfg.Stats().StoreErrors) }))
	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_store_primary_changes_total",
		Help: "Times the Redis store saw its primary replaced by another (a Sentinel failover, a Cluster replica promoted), " +
			"each also logged; a failover may forget the writes of the last replication lag unless RATELIMIT_REDIS_WAIT_REPLICAS is set.",
	}, func() float64 { return float64(cfg.PrimaryChanges()) }))
	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_lease_renewals_not_found_total",
		Help: "Renewals of leases the store did not hold (answered 404): expired or released before the renewal, " +
			"or forgotten by a failover of the store.",
	}, func() float64 { return float64(cfg.Stats().RenewalsNotFound) }))
	register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_denied_cache_hits_total",
		Help: "Denials answered from the local cache of empty buckets, without the store.",
	}, func() float64 { return float64(cfg.Stats().DeniedCacheHit) }))
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimitd_snapshot_age_seconds",
		Help: "Seconds since the snapshot of limits and overrides was last confirmed against the database; " +
			"before the first load, seconds since the start.",
	}, func() float64 {
		synced := cfg.Status().SyncedAt
		if synced.IsZero() {
			synced = started
		}
		return cfg.Now().Sub(synced).Seconds()
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
	for _, entity := range []string{limiter.EntityLimit, limiter.EntityOverride, limiter.EntityRule} {
		register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_snapshot_left_out",
			Help: "Stored rows the snapshot leaves out, by entity (limit, override, rule), because this version cannot use them " +
				"or they depend on a limit left out; /v1/status lists them with the reason. Everything else is in force.",
			ConstLabels: prometheus.Labels{"entity": entity},
		}, func() float64 {
			n := 0
			for _, r := range cfg.Status().LeftOut {
				if r.Entity == entity {
					n++
				}
			}
			return float64(n)
		}))
	}
	register(reg, collectors.NewGoCollector())
	register(reg, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return t
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

// Handler serves the registry in the Prometheus text format.
func (t *Telemetry) Handler() http.Handler { return t.handler }

// RequestID makes a request id unique across restarts, in one allocation.
// One sequence covers every front end, so that an id names one request of
// the process.
func (t *Telemetry) RequestID() string {
	var b [32]byte
	return string(t.AppendRequestID(b[:0]))
}

// AppendRequestID appends a request id, as RequestID makes it, to b.
func (t *Telemetry) AppendRequestID(b []byte) []byte {
	b = append(b, t.requestPrefix...)
	return strconv.AppendUint(b, t.requestSeq.Add(1), 36)
}

// ObserveRequest observes one HTTP request. route is the route's pattern
// ("" when none matched), never the path, which can hold anything.
func (t *Telemetry) ObserveRequest(route, method string, status int, took time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	if status < 0 || status >= len(t.codes) {
		status = -1
	}
	k := requestSeries{route: route, method: methodOf(method), status: status}
	t.observers.get(k, func() prometheus.Observer {
		code := "unknown"
		if k.status >= 0 {
			code = t.codes[k.status]
		}
		return t.duration.WithLabelValues(k.route, methodLabels[k.method], code)
	}).Observe(took.Seconds())
}

// ObserveStore observes one call of the bucket store; it is
// limiter.Config.ObserveStore.
func (t *Telemetry) ObserveStore(op limiter.Op, took time.Duration, err error) {
	k := storeSeries{op: op, failed: err != nil}
	t.stores.get(k, func() prometheus.Observer {
		result := "ok"
		if k.failed {
			result = "error"
		}
		return t.storeDuration.WithLabelValues(k.op.String(), result)
	}).Observe(took.Seconds())
}

// Front returns the observer of one front end, whose decisions are counted
// under its name ("http" for REST, "grpc" for Envoy's ShouldRateLimit,
// "forward_auth" for the gateways), so
// that one series per limit and result shows both.
func (t *Telemetry) Front(name string) *Front { return &Front{Telemetry: t, name: name} }

// Front observes the requests and decisions of one front end.
type Front struct {
	*Telemetry
	name string
	// counters hold the series of this front end's decisions already
	// looked up, as Telemetry's caches do.
	counters seriesCache[decisionSeries, prometheus.Counter]
}

// ObserveDecisions counts the decisions of a result.
func (f *Front) ObserveDecisions(op limiter.Op, res limiter.Result) {
	f.observe(decisionSeries{op: op}, res)
}

// ObserveAcquire counts the decisions of an acquire, as op acquire.
func (f *Front) ObserveAcquire(res limiter.Result) { f.observe(decisionSeries{acquire: true}, res) }

// observe counts the decisions of res in the series of k's op.
func (f *Front) observe(k decisionSeries, res limiter.Result) {
	for i := range res.Decisions {
		d := &res.Decisions[i]
		k.limit, k.result = d.Limit, resultOf(d, res.Degraded)
		f.counters.get(k, func() prometheus.Counter {
			op := k.op.String()
			if k.acquire {
				op = "acquire"
			}
			return f.decisionsTotal.WithLabelValues(op, k.limit, resultLabels[k.result], f.name)
		}).Inc()
	}
}

// ObserveUnits counts the units a decision moved that its decisions alone
// do not tell: what a settle gave back and charged, and what a spend took
// from calendar quotas. A decision that changed nothing (denied, blocked
// or unlimited, or an answer degraded by a store failure) counts nothing.
func (f *Front) ObserveUnits(op limiter.Op, reqs []limiter.Request, res limiter.Result) {
	switch {
	case res.Degraded:
	case op == limiter.Settle:
		f.observeSettle(reqs, res)
	case op == limiter.Spend && res.Allowed:
		for i := range res.Decisions {
			d := &res.Decisions[i]
			if d.Calendar != "" && d.Allowed && d.Source != limiter.SourceUnlimited && reqs[i].Cost > 0 {
				f.quotaUnits.WithLabelValues(d.Limit, d.Unit).Add(float64(reqs[i].Cost))
			}
		}
	}
}

// observeSettle counts the tokens a settle gave back and charged.
func (f *Front) observeSettle(reqs []limiter.Request, res limiter.Result) {
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
		f.settledTokens.WithLabelValues(d.Limit, d.Unit, kind).Add(float64(n))
	}
}

// leaseEvents are the events of ratelimitd_leases_total.
var leaseEvents = [...]limiter.LeaseEvent{limiter.LeaseAcquired, limiter.LeaseReleased, limiter.LeaseRenewed, limiter.LeaseExpired}

// ObserveLease counts n events of leases of a limit; it is
// limiter.Config.ObserveLease. The first event of a limit makes the series
// of every event, at 0, so that held = acquired - released - expired is
// defined (PromQL drops a limit that lacks one of its terms) and the first
// increase of each counts.
func (t *Telemetry) ObserveLease(limit string, e limiter.LeaseEvent, n int64) {
	series := t.leases.get(limit, func() *[len(leaseEvents)]prometheus.Counter {
		var s [len(leaseEvents)]prometheus.Counter
		for i, ev := range leaseEvents {
			s[i] = t.leasesTotal.WithLabelValues(limit, ev.String())
		}
		return &s
	})
	for i, ev := range leaseEvents {
		if ev == e {
			series[i].Add(float64(n))
		}
	}
}

// ObserveUnmatched counts descriptors that matched no rule.
func (f *Front) ObserveUnmatched(n int) { f.unmatched.WithLabelValues(f.name).Add(float64(n)) }

// resultOf is the result a decision is counted by. Near the limit means,
// as in Envoy's ratelimit, that at least 80% of the burst is used.
func resultOf(d *limiter.Decision, degraded bool) result {
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

// method is a method label, an index of methodLabels. The label is
// bounded: a client may send any token.
type method uint8

// methodLabels are the method labels, the last for any other method.
var methodLabels = [...]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions, "other"}

// methodOf is the label of a request's method.
func methodOf(m string) method {
	for i, l := range methodLabels[:len(methodLabels)-1] {
		if m == l {
			return method(i)
		}
	}
	return method(len(methodLabels) - 1)
}
