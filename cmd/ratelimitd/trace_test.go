package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it keeps the spans of
// every export request sent to /v1/traces.
type otlpReceiver struct {
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	service  string
	errs     []string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf":
		o.errs = append(o.errs, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
	case err != nil:
		o.errs = append(o.errs, err.Error())
	default:
		if err := proto.Unmarshal(body, &req); err != nil {
			o.errs = append(o.errs, err.Error())
		}
	}
	o.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				o.service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			o.spans = append(o.spans, ss.GetSpans()...)
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// otelEnv sets the OpenTelemetry variables in the process's environment,
// which the exporter reads, and in env, which serve reads.
func otelEnv(t *testing.T, env map[string]string, vars map[string]string) {
	for k, v := range vars {
		t.Setenv(k, v)
		env[k] = v
	}
}

// TestServeExportsTracesOverOTLP runs serve with the standard variables
// pointing at an OTLP/HTTP receiver: a spend carrying a traceparent is
// exported, on shutdown at the latest, as a span of the caller's trace
// with a child for its store call.
func TestServeExportsTracesOverOTLP(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	env := map[string]string{}
	otelEnv(t, env, map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL,
		"OTEL_SERVICE_NAME":           "ratelimitd-test",
	})
	s := startServe(t, env)
	s.waitReady(t)
	token := regexp.MustCompile(`rlt_[A-Za-z0-9_-]+`).FindString(s.stdout.String())
	if code, body := s.call(t, "PUT", "/v1/limits/Logins", token, `{"id_format":"string","burst":2,"count":2,"period":"1m"}`); code != http.StatusCreated {
		t.Fatalf("creating a limit: %d %s", code, body)
	}
	const caller = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest("POST", s.url+"/v1/spend", strings.NewReader(`{"buckets":[{"limit":"Logins","bucket_id":"alice@example.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", "00-"+caller+"-00f067aa0ba902b7-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("spend: %d", res.StatusCode)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if recv.requests == 0 || len(recv.errs) > 0 {
		t.Fatalf("%d export requests, errors %q\nlog: %s", recv.requests, recv.errs, s.stderr.String())
	}
	if recv.service != "ratelimitd-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", recv.service)
	}
	var spend, store *tracepb.Span
	for _, sp := range recv.spans {
		switch sp.GetName() {
		case "POST /v1/spend":
			spend = sp
		case "store spend":
			store = sp
		}
	}
	if spend == nil || store == nil {
		t.Fatalf("no span of the spend or of its store call among %d", len(recv.spans))
	}
	if hex.EncodeToString(spend.GetTraceId()) != caller || hex.EncodeToString(spend.GetParentSpanId()) != "00f067aa0ba902b7" {
		t.Errorf("the spend's span is not a child of the traceparent's: trace %x, parent %x", spend.GetTraceId(), spend.GetParentSpanId())
	}
	if string(store.GetParentSpanId()) != string(spend.GetSpanId()) {
		t.Errorf("the store call's parent is %x, want the spend's span %x", store.GetParentSpanId(), spend.GetSpanId())
	}
	for _, sp := range recv.spans {
		for _, kv := range sp.GetAttributes() {
			if v := kv.GetValue().String(); strings.Contains(v, "alice") || strings.Contains(v, token) {
				t.Errorf("span %q: attribute %s = %s holds the bucket id or the token", sp.GetName(), kv.GetKey(), v)
			}
		}
	}
}

// TestServeRefusesAnUnknownOTLPProtocol: a typo in the protocol is a
// startup error naming the variable, not a service that silently exports
// nothing.
func TestServeRefusesAnUnknownOTLPProtocol(t *testing.T) {
	env := map[string]string{"RATELIMIT_DATABASE_URL": "sqlite:" + t.TempDir() + "/ratelimitd.db", "RATELIMIT_HTTP_ADDR": "127.0.0.1:0"}
	otelEnv(t, env, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
	// Ended before it begins: serve refuses before serving, and a serve
	// that did not would stop at once instead of serving forever.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := run(ctx, []string{"serve"}, getenv(env), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`) {
		t.Fatalf("serve with an unknown OTLP protocol: %v", err)
	}
}
