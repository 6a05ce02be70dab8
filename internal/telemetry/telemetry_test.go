package telemetry

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/loader"
)

// scrape returns the registry's text exposition.
func scrape(t *testing.T, tel *Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// wantLines fails unless every line is in the exposition.
func wantLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, "\n"+l+"\n") {
			t.Errorf("no line %q in\n%s", l, text)
		}
	}
}

func TestFrontsCountIntoOneSeriesByFrontend(t *testing.T) {
	tel := New(Config{})
	p := limiter.Params{Burst: 10, Count: 10, Period: time.Second}
	res := limiter.Result{Decisions: []limiter.Decision{
		{Limit: "A", Outcome: limiter.Outcome{Allowed: true, Remaining: 9}, Params: p},
		{Limit: "A", Outcome: limiter.Outcome{Allowed: true, Remaining: 1}, Params: p}, // 90% used: near the limit
		{Limit: "B", Params: p},
		{Limit: "S", Shadow: true, Params: p},
	}}
	tel.Front("http").ObserveDecisions(limiter.Spend, res)
	tel.Front("grpc").ObserveDecisions(limiter.Spend, res)
	tel.Front("grpc").ObserveDecisions(limiter.Spend, limiter.Result{Degraded: true, Decisions: []limiter.Decision{{Limit: "A", Outcome: limiter.Outcome{Allowed: true}, Params: p}}})
	tel.Front("grpc").ObserveUnmatched(3)
	wantLines(t, scrape(t, tel),
		`ratelimitd_decisions_total{frontend="http",limit="A",op="spend",result="allowed"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="A",op="spend",result="near_limit"} 1`,
		`ratelimitd_decisions_total{frontend="grpc",limit="B",op="spend",result="denied"} 1`,
		`ratelimitd_decisions_total{frontend="grpc",limit="S",op="spend",result="shadow_denied"} 1`,
		`ratelimitd_decisions_total{frontend="grpc",limit="A",op="spend",result="degraded"} 1`,
		`ratelimitd_unmatched_descriptors_total{frontend="grpc"} 3`,
	)
}

func TestSettledTokensByKind(t *testing.T) {
	tel := New(Config{})
	f := tel.Front("http")
	reqs := []limiter.Request{{Reserved: 10, Cost: 4}, {Reserved: 1, Cost: 6}, {Reserved: 0, Cost: 50}, {Reserved: 3, Cost: 3}}
	res := limiter.Result{Decisions: []limiter.Decision{
		{Limit: "T", Unit: "tokens", Outcome: limiter.Outcome{Allowed: true}},
		{Limit: "T", Unit: "tokens", Outcome: limiter.Outcome{Allowed: true}},
		{Limit: "T", Unit: "tokens", Outcome: limiter.Outcome{Allowed: true, Capped: true}},
		{Limit: "T", Unit: "tokens", Outcome: limiter.Outcome{Allowed: true}},
	}}
	f.ObserveUnits(limiter.Settle, reqs, res)
	// A degraded answer changed nothing, and counts nothing.
	f.ObserveUnits(limiter.Settle, reqs, limiter.Result{Degraded: true, Decisions: res.Decisions})
	wantLines(t, scrape(t, tel),
		`ratelimitd_settled_tokens_total{kind="returned",limit="T",unit="tokens"} 6`,
		`ratelimitd_settled_tokens_total{kind="charged",limit="T",unit="tokens"} 5`,
		`ratelimitd_settled_tokens_total{kind="capped",limit="T",unit="tokens"} 50`,
	)
}

func TestRequestsAreLabelledByBoundedValues(t *testing.T) {
	tel := New(Config{})
	tel.ObserveRequest("", "BREW", 999, time.Millisecond)
	tel.ObserveRequest("/v1/limits/:name", "GET", 200, time.Millisecond)
	wantLines(t, scrape(t, tel),
		`ratelimitd_http_request_duration_seconds_count{code="unknown",method="other",route="unmatched"} 1`,
		`ratelimitd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/limits/:name"} 1`,
	)
	a, b := tel.RequestID(), tel.RequestID()
	if a == b || !strings.HasPrefix(b, tel.requestPrefix) {
		t.Errorf("request ids %q and %q", a, b)
	}
}

func TestSnapshotGauges(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	status := loader.Status{}
	tel := New(Config{Now: func() time.Time { return now }, Status: func() loader.Status { return status }})
	now = now.Add(90 * time.Second)
	// Never loaded: the age counts from the start.
	wantLines(t, scrape(t, tel), `ratelimitd_snapshot_age_seconds 90`)
	status = loader.Status{SyncedAt: now.Add(-2 * time.Second), Version: 7, Limits: 3, Overrides: 2}
	wantLines(t, scrape(t, tel),
		`ratelimitd_snapshot_age_seconds 2`,
		`ratelimitd_snapshot_version 7`,
		`ratelimitd_snapshot_limits 3`,
		`ratelimitd_snapshot_overrides 2`,
	)
}

func TestTwoTelemetriesShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := New(Config{Registry: reg}), New(Config{Registry: reg})
	a.Front("grpc").ObserveUnmatched(1)
	b.Front("grpc").ObserveUnmatched(1)
	wantLines(t, scrape(t, a), `ratelimitd_unmatched_descriptors_total{frontend="grpc"} 2`)
}

func TestStoreDuration(t *testing.T) {
	tel := New(Config{})
	tel.ObserveStore(limiter.Spend, 300*time.Microsecond, nil)
	tel.ObserveStore(limiter.Spend, 250*time.Millisecond, errors.New("i/o timeout"))
	wantLines(t, scrape(t, tel),
		`ratelimitd_store_duration_seconds_bucket{op="spend",result="ok",le="0.0005"} 1`,
		`ratelimitd_store_duration_seconds_count{op="spend",result="error"} 1`,
		`ratelimitd_store_duration_seconds_bucket{op="spend",result="error",le="0.1"} 0`,
	)
}

// TestLeaseSeriesComeTogether: the first event of a limit's leases makes
// the series of every event, so that acquired - released - expired is
// defined from the first lease on.
func TestLeaseSeriesComeTogether(t *testing.T) {
	tel := New(Config{})
	tel.ObserveLease("Calls", limiter.LeaseAcquired, 2)
	tel.ObserveLease("Calls", limiter.LeaseExpired, 1)
	tel.ObserveLease("Calls", limiter.LeaseAcquired, 1)
	wantLines(t, scrape(t, tel),
		`ratelimitd_leases_total{event="acquired",limit="Calls"} 3`,
		`ratelimitd_leases_total{event="released",limit="Calls"} 0`,
		`ratelimitd_leases_total{event="renewed",limit="Calls"} 0`,
		`ratelimitd_leases_total{event="expired",limit="Calls"} 1`,
	)
}

// TestQuotaUnits counts what allowed spends took from calendar quotas:
// not rate limits, unlimited buckets, denied or degraded batches, nor
// other operations.
func TestQuotaUnits(t *testing.T) {
	tel := New(Config{})
	f := tel.Front("grpc")
	quota := func(allowed bool, source limiter.Source) limiter.Decision {
		return limiter.Decision{Limit: "Q", Unit: "tokens", Calendar: limiter.CalendarDay, Source: source, Outcome: limiter.Outcome{Allowed: allowed}}
	}
	reqs := []limiter.Request{{Cost: 30}, {Cost: 7}, {Cost: 5}}
	allowed := limiter.Result{Allowed: true, Decisions: []limiter.Decision{
		quota(true, limiter.SourceDefault), quota(true, limiter.SourceUnlimited), {Limit: "R", Outcome: limiter.Outcome{Allowed: true}},
	}}
	f.ObserveUnits(limiter.Spend, reqs, allowed)
	f.ObserveUnits(limiter.Check, reqs, allowed)
	f.ObserveUnits(limiter.Refund, reqs, allowed)
	f.ObserveUnits(limiter.Spend, reqs, limiter.Result{Degraded: true, Allowed: true, Decisions: allowed.Decisions})
	f.ObserveUnits(limiter.Spend, reqs[:2], limiter.Result{Decisions: []limiter.Decision{quota(true, limiter.SourceDefault), quota(false, limiter.SourceDefault)}})
	text := scrape(t, tel)
	wantLines(t, text, `ratelimitd_quota_spent_units_total{limit="Q",unit="tokens"} 30`)
	if strings.Contains(text, `limit="R"`) {
		t.Errorf("a rate limit's units counted:\n%s", text)
	}
}
