package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// The caller's trace, as a W3C traceparent names it, and a bucket id and
// token that no span may hold.
const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + callerTrace + "-" + callerSpan + "-01"
	bucketID    = "192.0.2.77"
	secret      = "rlt_secret-that-no-span-holds"
)

// admin authenticates any token as admin.
type admin struct{}

func (admin) Authenticate(string) (auth.Principal, bool) {
	return auth.Principal{Scope: auth.Admin}, true
}
func (admin) Loaded() bool { return true }

// noRules knows no rule: every look-up is a 404.
type noRules struct{ api.Rules }

func (noRules) GetRule(context.Context, string) (limiter.Rule, error) {
	return limiter.Rule{}, limiter.ErrRuleNotFound
}

// traced is a Limiter whose store calls are traced into an in-memory
// exporter, over a snapshot with one limit, PerIP (burst 1), and a rule
// of domain edge that sends remote_address to it.
type traced struct {
	spans  *tracetest.InMemoryExporter
	traces telemetry.Traces
	lim    *limiter.Limiter
	tel    *telemetry.Telemetry
	log    *slog.Logger
}

func newTraced(t *testing.T) *traced {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := &traced{spans: spans, traces: telemetry.NewTraces(tp, "test"), tel: telemetry.New(telemetry.Config{}),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	tr.lim = limiter.New(limiter.Config{Store: ms, TraceStore: tr.traces.Store, Logger: tr.log})
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	if err := b.PutLimit(limiter.Limit{Name: "PerIP", Enum: 200, IDFormat: limiter.IPAddress,
		Params: limiter.Params{Burst: 1, Count: 1, Period: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRule(limiter.Rule{ID: "r1", Domain: "edge", Descriptor: []limiter.DescriptorEntry{{Key: "remote_address"}}, Limit: "PerIP"}); err != nil {
		t.Fatal(err)
	}
	tr.lim.SetSnapshot(b.Snapshot(1))
	return tr
}

// byName returns the recorded span called name, failing unless there is
// exactly one.
func byName(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans called %q in %v", len(found), name, names(spans))
	}
	return found[0]
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// attr returns the value of a span's attribute.
func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// wantChildOfCaller fails unless s continues the caller's trace as a
// child of the caller's span.
func wantChildOfCaller(t *testing.T, s tracetest.SpanStub) {
	t.Helper()
	if s.Parent.TraceID().String() != callerTrace || s.Parent.SpanID().String() != callerSpan || !s.Parent.IsRemote() ||
		s.SpanContext.TraceID().String() != callerTrace {
		t.Errorf("span %q: parent %s/%s, trace %s; want a child of the traceparent's %s/%s",
			s.Name, s.Parent.TraceID(), s.Parent.SpanID(), s.SpanContext.TraceID(), callerTrace, callerSpan)
	}
}

// wantStoreSpan fails unless the spans hold one store call of op, a
// child of parent, that names the limit PerIP and has result.
func wantStoreSpan(t *testing.T, spans tracetest.SpanStubs, op string, parent tracetest.SpanStub, result string) {
	t.Helper()
	s := byName(t, spans, "store "+op)
	if s.Parent.SpanID() != parent.SpanContext.SpanID() || s.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Errorf("the store call's parent is %s, want the request's span %s", s.Parent.SpanID(), parent.SpanContext.SpanID())
	}
	if got := attr(s, "ratelimitd.limits").AsStringSlice(); !slices.Equal(got, []string{"PerIP"}) {
		t.Errorf("ratelimitd.limits = %q, want [PerIP]", got)
	}
	if got := attr(s, "ratelimitd.op").AsString(); got != op {
		t.Errorf("ratelimitd.op = %q, want %q", got, op)
	}
	if got := attr(s, "ratelimitd.result").AsString(); got != result {
		t.Errorf("ratelimitd.result = %q, want %q", got, result)
	}
}

// wantNoSecrets fails when any attribute of any span holds the bucket id
// or the token.
func wantNoSecrets(t *testing.T, spans tracetest.SpanStubs) {
	t.Helper()
	for _, s := range spans {
		for _, kv := range s.Attributes {
			if v := kv.Value.String(); strings.Contains(v, bucketID) || strings.Contains(v, secret) {
				t.Errorf("span %q: attribute %s = %q holds the bucket id or the token", s.Name, kv.Key, v)
			}
		}
	}
}

func TestRESTSpendContinuesTheCallersTrace(t *testing.T) {
	tr := newTraced(t)
	h := edge.New(edge.Config{Observer: tr.tel.Front("http"), Logger: tr.log, Trace: tr.traces.HTTP},
		decide.New(decide.Config{Limiter: tr.lim, Auth: admin{}, Observer: tr.tel.Front("http")}).Routes()...)
	srv := httptest.NewServer(h)
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/spend", strings.NewReader(`{"buckets":[{"limit":"PerIP","bucket_id":"`+bucketID+`"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("traceparent", traceparent)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("spend: %d", res.StatusCode)
		}
	}
	srv.Close() // every span has ended once the handlers have returned
	spans := tr.spans.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("spans %v, want a request and a store call per spend", names(spans))
	}
	// The burst is 1: the first spend is allowed, the second denied.
	for i, result := range []string{"allowed", "denied"} {
		call := tracetest.SpanStubs{spans[2*i], spans[2*i+1]}
		server := byName(t, call, "POST /v1/spend")
		wantChildOfCaller(t, server)
		if server.SpanKind != trace.SpanKindServer || attr(server, "http.route").AsString() != "/v1/spend" ||
			attr(server, "http.request.method").AsString() != "POST" || attr(server, "http.response.status_code").AsInt64() != 200 {
			t.Errorf("request span %+v", server)
		}
		wantStoreSpan(t, call, "spend", server, result)
	}
	wantNoSecrets(t, spans)
}

func TestShouldRateLimitContinuesTheCallersTrace(t *testing.T) {
	tr := newTraced(t)
	gs := rls.New(rls.Config{Limiter: tr.lim, Observer: tr.tel.Front("grpc"), Logger: tr.log, StatsHandler: tr.traces.GRPC})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent, "authorization", "Bearer "+secret)
	res, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*extv3.RateLimitDescriptor{{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: bucketID}}}}})
	if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", res, err)
	}
	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	gs.Stop(stop) // every span has ended once the calls have returned
	cancel()
	spans := tr.spans.GetSpans()
	server := byName(t, spans, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName[1:])
	wantChildOfCaller(t, server)
	if server.SpanKind != trace.SpanKindServer {
		t.Errorf("the call's span is of kind %v", server.SpanKind)
	}
	wantStoreSpan(t, spans, "spend", server, "allowed")
	wantNoSecrets(t, spans)
}

func TestAdminRequestSpanIsNamedByItsRoute(t *testing.T) {
	tr := newTraced(t)
	s := api.New(api.Config{Rules: noRules{}, Limiter: tr.lim, Auth: admin{}, Logger: tr.log})
	srv := httptest.NewServer(edge.New(edge.Config{Observer: tr.tel.Front("http"), Logger: tr.log, Trace: tr.traces.HTTP}, s.Routes()...))
	req, _ := http.NewRequest("GET", srv.URL+"/v1/rules/"+bucketID, nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("traceparent", traceparent)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	srv.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", res.StatusCode)
	}
	spans := tr.spans.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("spans %v, want one", names(spans))
	}
	sp := byName(t, spans, "GET /v1/rules/:id")
	wantChildOfCaller(t, sp)
	if attr(sp, "http.route").AsString() != "/v1/rules/:id" || attr(sp, "http.response.status_code").AsInt64() != 404 || sp.Status.Code == codes.Error {
		t.Errorf("span %+v: want the route's pattern, status 404, and no error (a 4xx is the client's)", sp)
	}
	wantNoSecrets(t, spans)
}

func TestTracesOffInstallNothing(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
	} {
		traces, stop, err := telemetry.TracesFromEnv(context.Background(), func(k string) string { return env[k] }, "test")
		if err != nil || traces.HTTP != nil || traces.Store != nil || traces.GRPC != nil {
			t.Errorf("%v: hooks %+v, %v; want none", env, traces, err)
		}
		if err := stop(context.Background()); err != nil {
			t.Errorf("%v: stop: %v", env, err)
		}
	}
}

func TestTracesFromEnvRefuseWhatTheyDoNotKnow(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"): invalid OTLP protocol`},
		{map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, `OTEL_TRACES_EXPORTER="jaeger"`},
	} {
		t.Run(c.env["OTEL_TRACES_EXPORTER"], func(t *testing.T) {
			// The exporter reads the process's environment.
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			_, _, err := telemetry.TracesFromEnv(context.Background(), func(k string) string { return c.env[k] }, "test")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one with %s", err, c.want)
			}
		})
	}
}
