package decide_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// benchServer is the service's handler, the bucket routes beside the admin
// API, on the in-process store with a snapshot built in memory: what a
// spend costs in this process, without network or database. Limit0 to
// Limit2 allow every spend; Denied allows one a day, so that a bucket once
// spent stays empty and cached. traces are the zero Traces, tracing off,
// unless a benchmark measures tracing.
func benchServer(b *testing.B, traces telemetry.Traces) (http.Handler, string) {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := memstore.New(memstore.Options{})
	b.Cleanup(store.Close)
	lim := limiter.New(limiter.Config{Store: store, DeniedCacheSize: 1000, Logger: log, TraceStore: traces.Store})
	builder := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	limits := []limiter.Limit{
		{Name: "Denied", Enum: 4, IDFormat: limiter.RegID, Params: limiter.Params{Burst: 1, Count: 1, Period: 24 * time.Hour}},
	}
	for i, f := range []limiter.IDFormat{limiter.RegID, limiter.IPAddress, limiter.Domain} {
		limits = append(limits, limiter.Limit{Name: "Limit" + strconv.Itoa(i), Enum: i + 1, IDFormat: f,
			Params: limiter.Params{Burst: 1 << 30, Count: 1 << 19, Period: time.Second}})
	}
	for _, l := range limits {
		if err := builder.PutLimit(l); err != nil {
			b.Fatal(err)
		}
	}
	lim.SetSnapshot(builder.Snapshot(1))
	// A token of scope decide, as a client service has, not the
	// bootstrap token, which is checked apart.
	secret, hash := auth.NewSecret()
	tokens := []auth.Token{{ID: "1", Name: "bench", Scope: auth.Decide, Hash: hash}}
	keeper := auth.NewKeeper(func(context.Context) ([]auth.Token, error) { return tokens, nil }, "", log)
	if err := keeper.Refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	tel := telemetry.New(telemetry.Config{Stats: lim.Stats}).Front("http")
	srv := api.New(api.Config{Limiter: lim, Auth: keeper, Logger: log})
	buckets := decide.New(decide.Config{Limiter: lim, Auth: keeper, Observer: tel})
	return edge.New(edge.Config{Observer: tel, Logger: log, Trace: traces.HTTP}, append(buckets.Routes(), srv.Routes()...)...), secret
}

// BenchmarkSpendHTTP measures POST /v1/spend through the whole handler
// chain: authentication, body limit, decoding, the Limiter with the
// in-process store, metrics, headers and the answer.
func BenchmarkSpendHTTP(b *testing.B) {
	bodies := map[string]string{
		"1 bucket":       `{"buckets":[{"limit":"Limit0","bucket_id":"12345678","cost":1}]}`,
		"3 buckets":      `{"buckets":[{"limit":"Limit0","bucket_id":"12345678"},{"limit":"Limit1","bucket_id":"192.0.2.1"},{"limit":"Limit2","bucket_id":"example.com"}]}`,
		"strict decoder": `{"buckets":[{"limit":"Limit0","bucket_id":"1234567\u0038","cost":1}]}`,
	}
	for name, body := range bodies {
		b.Run(name, func(b *testing.B) {
			srv, secret := benchServer(b, telemetry.Traces{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				rd := strings.NewReader(body)
				for pb.Next() {
					rd.Reset(body)
					req := httptest.NewRequest(http.MethodPost, "/v1/spend", rd)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+secret)
					w := httptest.NewRecorder()
					srv.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("%d %s", w.Code, w.Body)
					}
				}
			})
		})
	}
}

// BenchmarkSpendListener measures a one-bucket spend through a listener
// on loopback, with the timeouts of the service's server: net/http's work
// and the handler's, over one keep-alive connection, as a load generator
// sends them. The client writes a request made once and reads the answer
// by its Content-Length, so that it costs little and allocates nothing.
func BenchmarkSpendListener(b *testing.B) {
	h, secret := benchServer(b, telemetry.Traces{})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadHeaderTimeout, srv.Config.ReadTimeout = 5*time.Second, 30*time.Second
	srv.Config.WriteTimeout, srv.Config.IdleTimeout = 30*time.Second, 2*time.Minute
	srv.Start()
	b.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	body := `{"buckets":[{"limit":"Limit0","bucket_id":"12345678","cost":1}]}`
	req := []byte("POST /v1/spend HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer " + secret +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	rd := bufio.NewReader(conn)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		if err := readAnswer(rd); err != nil {
			b.Fatal(err)
		}
	}
}

// readAnswer reads one answer from rd, which must be a 200.
func readAnswer(rd *bufio.Reader) error {
	n := -1
	for first := true; ; first = false {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first && !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
			return fmt.Errorf("answer %q", line)
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return err
			}
		}
	}
	if n < 0 {
		return errors.New("an answer without Content-Length")
	}
	_, err := rd.Discard(n)
	return err
}

// discardWriter is a ResponseWriter that keeps the status and forgets the
// body, so that a benchmark measures the handler, not a recorder.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// BenchmarkDecisionHandler measures what the service's own code costs per
// decision: the handler from ServeHTTP down, on the in-process store,
// with the request and the writer reused, so that neither the test's
// allocations nor net/http's are counted. The allowed runs spend on a huge
// burst; the denied ones on a burst of 1, emptied before the timer starts,
// which the denied cache answers. The settle charges one token beyond
// what it reserved, so that it writes as a spend does. The escaped body
// measures the strict reading.
func BenchmarkDecisionHandler(b *testing.B) { benchDecisions(b, telemetry.Traces{}, "") }

// BenchmarkDecisionHandlerTraced is BenchmarkDecisionHandler with tracing
// on: every request continues its caller's sampled trace, and its spans
// and its store call's go to a batching processor whose exporter drops
// them, so that what is measured is the service's side of tracing.
func BenchmarkDecisionHandlerTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchDecisions(b, telemetry.NewTraces(tp, "bench"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
}

// benchDecisions runs the decisions of BenchmarkDecisionHandler with
// traces, each request with traceparent when it is not "".
func benchDecisions(b *testing.B, traces telemetry.Traces, traceparent string) {
	bodies := []struct{ name, path, body string }{
		{"1 bucket allowed", "/v1/spend", `{"buckets":[{"limit":"Limit0","bucket_id":"12345678"}]}`},
		{"3 buckets allowed", "/v1/spend", `{"buckets":[{"limit":"Limit0","bucket_id":"12345678"},{"limit":"Limit1","bucket_id":"192.0.2.1"},{"limit":"Limit2","bucket_id":"example.com"}]}`},
		{"1 bucket denied", "/v1/spend", `{"buckets":[{"limit":"Denied","bucket_id":"12345678"}]}`},
		{"1 bucket settled", "/v1/settle", `{"buckets":[{"limit":"Limit0","bucket_id":"12345678","reserved":1,"actual":2}]}`},
		// An escape is left to the strict reading, as any uncommon form is.
		{"1 bucket escaped", "/v1/spend", `{"buckets":[{"limit":"Limit\u0030","bucket_id":"12345678"}]}`},
	}
	for _, bb := range bodies {
		b.Run(bb.name, func(b *testing.B) {
			srv, secret := benchServer(b, traces)
			if strings.Contains(bb.name, "denied") {
				// Empty the bucket, so that every spend after is denied
				// from the cache.
				serveOnce(b, srv, secret, bb.body, http.StatusOK)
			}
			body := strings.NewReader(bb.body)
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1"+bb.path, body)
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+secret)
			if traceparent != "" {
				req.Header.Set("traceparent", traceparent)
			}
			w := &discardWriter{header: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(bb.body)
				req.Body = io.NopCloser(body)
				req.ContentLength = int64(len(bb.body))
				clear(w.header)
				srv.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					b.Fatalf("status %d", w.status)
				}
			}
		})
	}
}

// serveOnce sends one spend and checks its status.
func serveOnce(b *testing.B, h http.Handler, secret, body string, status int) {
	b.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/spend", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secret)
	w := &discardWriter{header: http.Header{}}
	h.ServeHTTP(w, req)
	if w.status != status {
		b.Fatalf("status %d, want %d", w.status, status)
	}
}
