package rls_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// kindsEnv serves ShouldRateLimit over a real Limiter and store whose
// snapshot is built here: the database refuses a rule of a concurrency
// limit, which a decision must still answer cleanly should it meet one,
// and cannot hold calendar quotas yet.
type kindsEnv struct {
	client rlsv3.RateLimitServiceClient
	clock  *testenv.Clock
	reg    *prometheus.Registry
}

func newKindsEnv(t *testing.T, now time.Time, limits []limiter.Limit, rs []limiter.Rule) *kindsEnv {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	for i, l := range limits {
		l.Enum = i + 1
		if err := b.PutLimit(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rs {
		if err := b.PutRule(r); err != nil {
			t.Fatal(err)
		}
	}
	clock := testenv.NewClock(now)
	store := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(store.Close)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lim := limiter.New(limiter.Config{Store: store, Now: clock.Now, Logger: log})
	lim.SetSnapshot(b.Snapshot(1))
	reg := prometheus.NewRegistry()
	gs := rls.New(rls.Config{Limiter: lim, Observer: telemetry.New(telemetry.Config{Registry: reg}).Front("grpc"), Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gs.Stop(ctx)
	})
	return &kindsEnv{client: rlsv3.NewRateLimitServiceClient(conn), clock: clock, reg: reg}
}

func (e *kindsEnv) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.client.ShouldRateLimit(ctx, req)
}

// TestConcurrencyLimitOfARule: a decision that meets a rule of a
// concurrency limit, which only leases may hold, is an INVALID_ARGUMENT
// naming the descriptor and the rule, and decides nothing of the others.
func TestConcurrencyLimitOfARule(t *testing.T) {
	e := newKindsEnv(t, time.Now(), []limiter.Limit{
		{Name: "Calls", IDFormat: limiter.String, Kind: limiter.KindConcurrency, Params: limiter.Params{Burst: 2, Count: 2, Period: time.Minute}},
		perHour("Plain", 1),
	}, []limiter.Rule{
		{ID: "r-calls", Domain: "d", Limit: "Calls", Descriptor: entriesOf("calls", "")},
		{ID: "r-plain", Domain: "d", Limit: "Plain", Descriptor: entriesOf("plain", "")},
	})
	_, err := e.call(request("d", desc("plain", "a"), desc("calls", "a")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `descriptors[1]: limit "Calls" (rule r-calls): is a concurrency limit`) {
		t.Fatalf("a rule of a concurrency limit: %v", err)
	}
	// Plain's one request was not spent by the refused call.
	if res, err := e.call(request("d", desc("plain", "a"))); err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the refusal: %v %v", res, err)
	}
}

// TestQuotaOfARule: a calendar quota answers current_limit in its
// calendar's unit, whatever its window's length (a day of 25 hours is
// still 1000 per DAY), and headers whose window is that length; its
// spends count into the quota metric.
func TestQuotaOfARule(t *testing.T) {
	paris, msg := limiter.LoadZone("Europe/Paris")
	if msg != "" {
		t.Fatal(msg)
	}
	// 2026-10-25 lasts 25 hours in Paris; 22:00 is two hours before its end.
	e := newKindsEnv(t, time.Date(2026, 10, 25, 22, 0, 0, 0, paris), []limiter.Limit{
		{Name: "Daily", IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "Europe/Paris", Unit: "tokens",
			Params: limiter.Params{Burst: 1000, Count: 1000}},
	}, []limiter.Rule{{ID: "r", Domain: "d", Limit: "Daily", Descriptor: entriesOf("user", "")}})

	res, err := e.call(request("d", hits(desc("user", "bob"), 400)))
	if err != nil {
		t.Fatal(err)
	}
	st := res.GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != 1000 ||
		st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || st.GetLimitRemaining() != 600 ||
		st.GetDurationUntilReset().AsDuration() != 2*time.Hour {
		t.Fatalf("status %v", st)
	}
	headers := map[string]string{}
	for _, h := range res.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	if headers["RateLimit-Policy"] != `"Daily";q=1000;w=90000` || headers["RateLimit"] != `"Daily";r=600;t=7200` {
		t.Errorf("headers %v", headers)
	}

	e.clock.Advance(time.Hour)
	res, err = e.call(request("d", hits(desc("user", "bob"), 601)))
	if err != nil {
		t.Fatal(err)
	}
	if st := res.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() != time.Hour {
		t.Fatalf("over the quota: %v", st)
	}
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	spent := 0.0
	for _, f := range families {
		if f.GetName() == "ratelimitd_quota_spent_units_total" {
			for _, m := range f.GetMetric() {
				spent += m.GetCounter().GetValue()
			}
		}
	}
	if spent != 400 {
		t.Errorf("quota units spent %v, want 400", spent)
	}
}
