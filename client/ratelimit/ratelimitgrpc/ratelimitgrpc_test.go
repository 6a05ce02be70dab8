package ratelimitgrpc_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
	"github.com/ratelimitd/ratelimitd/client/ratelimit"
	"github.com/ratelimitd/ratelimitd/client/ratelimit/ratelimitgrpc"
)

// serve runs gRPC's health service behind the interceptors on a loopback
// listener and returns a client of it.
func serve(t *testing.T, c *ratelimit.Client, rule ratelimitgrpc.Rule) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ratelimitgrpc.UnaryServerInterceptor(c, rule)),
		grpc.StreamInterceptor(ratelimitgrpc.StreamServerInterceptor(c, rule)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func newClient(t *testing.T, f *fakeratelimitd.Server, failOpen bool) *ratelimit.Client {
	t.Helper()
	c, err := ratelimit.New(ratelimit.Config{URL: f.URL, Token: fakeratelimitd.Token, FailOpen: failOpen, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUnary spends a burst of 2 per method: the third call is refused
// with RESOURCE_EXHAUSTED and a RetryInfo of the retry-after.
func TestUnary(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerMethod": 2})
	hc := serve(t, newClient(t, f, false), ratelimitgrpc.Rule{Limit: "PerMethod", Key: ratelimitgrpc.Method})
	ctx := context.Background()
	for i := range 2 {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || len(st.Details()) != 1 {
		t.Fatalf("the third call: %v, details %v", st, st.Details())
	}
	if ri, ok := st.Details()[0].(*errdetails.RetryInfo); !ok || ri.RetryDelay.AsDuration() != fakeratelimitd.Retry {
		t.Errorf("the detail: %v, want RetryInfo of %v", st.Details()[0], fakeratelimitd.Retry)
	}
	if n := f.Taken("PerMethod", "/grpc.health.v1.Health/Check"); n != 2 {
		t.Errorf("the method's bucket has %d tokens taken, want 2", n)
	}
}

// TestStream spends once per stream, keyed by the client's address behind
// a trusted proxy, with a cost of 2.
func TestStream(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerClient": 4})
	hc := serve(t, newClient(t, f, false), ratelimitgrpc.Rule{Limit: "PerClient", Key: ratelimitgrpc.PeerAddress(clientip.Loopback...),
		Cost: func(context.Context, string) int64 { return 2 }})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", "203.0.113.7")
	for i := range 2 {
		stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("the third stream: %v", err)
	}
	if n := f.Taken("PerClient", "203.0.113.7"); n != 4 {
		t.Errorf("the forwarded client's bucket has %d tokens taken, want 4", n)
	}
}

// TestFailures: a missing key is INVALID_ARGUMENT; no answer from
// ratelimitd is the fail mode's, UNAVAILABLE when closed and the call's
// own answer when open.
func TestFailures(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerKey": 10})
	hc := serve(t, newClient(t, f, false), ratelimitgrpc.Rule{Limit: "PerKey", Key: ratelimitgrpc.Metadata("x-api-key")})
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("without the key: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("with the key: %v", err)
	}

	down := fakeratelimitd.New(t, nil)
	down.Close()
	for _, open := range []bool{false, true} {
		hc := serve(t, newClient(t, down, open), ratelimitgrpc.Rule{Limit: "PerKey", Key: ratelimitgrpc.Method})
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if want := map[bool]codes.Code{false: codes.Unavailable, true: codes.OK}[open]; status.Code(err) != want {
			t.Errorf("ratelimitd down, open=%v: %v, want %v", open, err, want)
		}
	}
}

// TestRefusedKey: a key that ratelimitd refuses, too long, holding NUL,
// not UTF-8 or longer than a body, is INVALID_ARGUMENT, never the fail
// mode's pass.
func TestRefusedKey(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerKey": 10})
	c := newClient(t, f, true)
	for _, id := range []string{strings.Repeat("k", 257), "a\x00b", "a\xffb", strings.Repeat("k", 2<<20)} {
		key := func(context.Context, string) (string, error) { return id, nil }
		hc := serve(t, c, ratelimitgrpc.Rule{Limit: "PerKey", Key: key})
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("a key of %.20q: %v, want INVALID_ARGUMENT", id, err)
		}
	}
}

// TestKeysAsMiddleware: the interceptor's key from metadata and the
// middleware's from a header take and refuse the same values, for the
// same reason, which each names; a refused key costs no request.
func TestKeysAsMiddleware(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"PerKey": 100})
	c := newClient(t, f, true)
	hc := serve(t, c, ratelimitgrpc.Rule{Limit: "PerKey", Key: ratelimitgrpc.Metadata("x-api-key-bin")})
	mw := ratelimit.Middleware(c, ratelimit.Rule{Limit: "PerKey", Key: ratelimit.Header("x-api-key-bin")})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, tc := range []struct {
		values []string
		reason string // "" when the key is taken
	}{
		{[]string{"k1"}, ""},
		{nil, "is missing"},
		{[]string{"a", "b"}, "is sent more than once"},
		{[]string{"a\x00b"}, "must not contain NUL"},
		{[]string{"a\xffb"}, "must be valid UTF-8"},
		{[]string{strings.Repeat("k", 128<<10+1)}, "longer than"},
	} {
		before, _ := f.Counts()
		ctx := context.Background()
		for _, v := range tc.values {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key-bin", v)
		}
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-Api-Key-Bin"] = tc.values
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, r)
		after, _ := f.Counts()
		switch {
		case tc.reason == "" && (err != nil || w.Code != http.StatusOK):
			t.Errorf("%.20q: %v and %d, want both taken", tc.values, err, w.Code)
		case tc.reason == "":
		case status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "x-api-key-bin "+tc.reason):
			t.Errorf("%.20q: the interceptor's %v, want INVALID_ARGUMENT saying x-api-key-bin %s", tc.values, err, tc.reason)
		case w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "X-Api-Key-Bin "+tc.reason):
			t.Errorf("%.20q: the middleware's %d %s, want 400 saying X-Api-Key-Bin %s", tc.values, w.Code, w.Body, tc.reason)
		case after != before:
			t.Errorf("%.20q: %d requests to ratelimitd for a refused key", tc.values, after-before)
		}
	}
}
