package rls_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func codesOf(res *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for _, s := range res.GetStatuses() {
		out = append(out, s.GetCode())
	}
	return out
}

func wantCodes(t *testing.T, res *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, each ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	got := codesOf(res)
	if res.GetOverallCode() != overall || len(got) != len(each) {
		t.Fatalf("overall %v statuses %v, want %v %v", res.GetOverallCode(), got, overall, each)
	}
	for i := range each {
		if got[i] != each[i] {
			t.Fatalf("overall %v statuses %v, want %v %v", res.GetOverallCode(), got, overall, each)
		}
	}
}

func headerMap(hs []*corev3.HeaderValue) map[string]string {
	out := map[string]string{}
	for _, h := range hs {
		out[h.GetKey()] = h.GetValue()
	}
	return out
}

func TestShouldRateLimit(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng, envOptions{})
			e.limit(perMinute("PerIP", limiter.IPAddress, 2, 60))
			e.limit(perMinute("PerPath", limiter.String, 3, 3))
			e.limit(perMinute("Login", limiter.String, 1, 1))
			e.rule("edge", "PerIP", "remote_address", "")
			e.rule("edge", "PerPath", "path", "")
			e.rule("edge", "Login", "path", "/login")

			// Two notations of one address share a bucket: burst 2.
			res := e.must(request("edge", desc("remote_address", "10.0.0.1")))
			wantCodes(t, res, ok, ok)
			st := res.GetStatuses()[0]
			if l := st.GetCurrentLimit(); l.GetName() != "PerIP" || l.GetRequestsPerUnit() != 60 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
				t.Errorf("current_limit %v", l)
			}
			if st.GetLimitRemaining() != 1 || st.GetDurationUntilReset().AsDuration() <= 0 || st.GetDurationUntilReset().AsDuration() > time.Second {
				t.Errorf("remaining %d, until reset %v", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
			}
			if h := headerMap(res.GetResponseHeadersToAdd()); h["RateLimit-Policy"] != `"PerIP";q=2;w=2` || h["RateLimit"] != `"PerIP";r=1;t=1` || h["Retry-After"] != "" {
				t.Errorf("headers %v", h)
			}
			wantCodes(t, e.must(request("edge", desc("remote_address", "::ffff:10.0.0.1"))), ok, ok)
			res = e.must(request("edge", desc("remote_address", "10.0.0.1")))
			wantCodes(t, res, over, over)
			if h := headerMap(res.GetResponseHeadersToAdd()); h["Retry-After"] != "1" || h["RateLimit"] != `"PerIP";r=0;t=1` {
				t.Errorf("denied headers %v", h)
			}
			if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Second {
				t.Errorf("a denial resets in its retry-after, got %v", d)
			}

			// An exact value beats no value; unmatched descriptors are OK
			// and change nothing; the batch is all or nothing.
			res = e.must(request("edge", desc("path", "/login"), desc("nothing", "here"), desc("path", "/a")))
			wantCodes(t, res, ok, ok, ok, ok)
			if res.GetStatuses()[1].GetCurrentLimit() != nil || res.GetStatuses()[0].GetCurrentLimit().GetName() != "Login" {
				t.Errorf("statuses %v", res.GetStatuses())
			}
			res = e.must(request("edge", desc("path", "/a"), desc("path", "/login")))
			wantCodes(t, res, over, ok, over)
			// /a was not spent by the denied batch: it still has 2 of 3.
			res = e.must(request("edge", hits(desc("path", "/a"), 0)))
			if got := res.GetStatuses()[0].GetLimitRemaining(); got != 2 {
				t.Errorf("/a has %d left after a denied batch, want 2", got)
			}
			// hits_addend 0 checks: nothing is spent however often.
			for range 5 {
				wantCodes(t, e.must(request("edge", hits(desc("path", "/b"), 0))), ok, ok)
			}
			// The request's hits_addend applies to descriptors without one.
			req := request("edge", desc("path", "/b"))
			req.HitsAddend = 3
			wantCodes(t, e.must(req), ok, ok)
			wantCodes(t, e.must(request("edge", desc("path", "/b"))), over, over)
			// Two descriptors of one bucket spend both hits at once.
			wantCodes(t, e.must(request("edge", desc("path", "/c"), desc("path", "/c"), desc("path", "/c"))), ok, ok, ok, ok)
			wantCodes(t, e.must(request("edge", desc("path", "/d"), hits(desc("path", "/d"), 3))), over, over, over)

			// Overrides apply to descriptor buckets, canonical ids and all.
			e.override(limiter.Override{Limit: "PerIP", BucketID: "10.9.9.9", Unlimited: true})
			e.override(limiter.Override{Limit: "PerPath", BucketID: "/blocked", Params: limiter.Params{Burst: 0, Count: 1, Period: time.Hour}})
			for range 5 {
				res = e.must(request("edge", desc("remote_address", "::ffff:10.9.9.9")))
				wantCodes(t, res, ok, ok)
			}
			if res.GetStatuses()[0].GetCurrentLimit() != nil {
				t.Errorf("an unlimited bucket has a current limit: %v", res.GetStatuses()[0])
			}
			wantCodes(t, e.must(request("edge", desc("path", "/blocked"))), over, over)

			// Decisions are counted by limit, with the front end.
			metrics := gather(t, e)
			for _, want := range []string{
				`ratelimitd_decisions_total{frontend="grpc",limit="PerIP",op="spend",result="denied"} 1`,
				`ratelimitd_unmatched_descriptors_total{frontend="grpc"} 1`,
			} {
				if !strings.Contains(metrics, want) {
					t.Errorf("no %s in\n%s", want, metrics)
				}
			}
		})
	}
}

// TestCurrentLimitUnits: the rate in the largest unit in which it is
// whole, else in the smallest in which it is at least 1.
func TestCurrentLimitUnits(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	for i, tc := range []struct {
		count  int64
		period time.Duration
		rpu    uint32
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{300, 3 * time.Hour, 100, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{10, time.Second, 10, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{120, 2 * time.Minute, 60, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{1, 90 * time.Second, 40, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{7, 24 * time.Hour, 7, rlsv3.RateLimitResponse_RateLimit_DAY},
		{1, 11 * time.Second, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{1, 400 * 24 * time.Hour, 1, rlsv3.RateLimitResponse_RateLimit_YEAR},
		{1000000, time.Second, 1000000, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		name := "L" + string(rune('a'+i))
		e.limit(limiter.Limit{Name: name, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: tc.count, Period: tc.period}})
		e.rule("units", name, "k", name)
		l := e.must(request("units", desc("k", name))).GetStatuses()[0].GetCurrentLimit()
		if l.GetRequestsPerUnit() != tc.rpu || l.GetUnit() != tc.unit {
			t.Errorf("%d per %v: %d per %v, want %d per %v", tc.count, tc.period, l.GetRequestsPerUnit(), l.GetUnit(), tc.rpu, tc.unit)
		}
	}
}

// gather returns the metrics as Prometheus text.
func gather(t *testing.T, e *env) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestConcurrentCallsAdmitExactlyTheBurst: 300 concurrent calls against a
// burst of 50 admit exactly 50, on both stores.
func TestConcurrentCallsAdmitExactlyTheBurst(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng, envOptions{})
			e.limit(limiter.Limit{Name: "Burst", IDFormat: limiter.String, Params: limiter.Params{Burst: 50, Count: 1, Period: time.Hour}})
			e.rule("d", "Burst", "client", "")
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 300)
			for range 300 {
				wg.Go(func() {
					res, err := e.call(request("d", desc("client", "c1")))
					switch {
					case err != nil:
						errs <- err
					case res.GetOverallCode() == ok:
						admitted.Add(1)
					default:
						denied.Add(1)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if admitted.Load() != 50 || denied.Load() != 250 {
				t.Errorf("admitted %d, denied %d; want 50 and 250", admitted.Load(), denied.Load())
			}
		})
	}
}

func TestShadowNeverDenies(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	l := perMinute("Shadowed", limiter.String, 1, 1)
	l.Shadow = true
	e.limit(l)
	e.limit(perMinute("Real", limiter.String, 5, 5))
	e.rule("d", "Shadowed", "user", "")
	e.rule("d", "Real", "path", "")
	wantCodes(t, e.must(request("d", desc("user", "u"), desc("path", "/"))), ok, ok, ok)
	res := e.must(request("d", desc("user", "u"), desc("path", "/")))
	wantCodes(t, res, ok, ok, ok)
	// The shadow bucket is empty, and says so, but allows the request; the
	// real one was spent both times.
	if got := res.GetStatuses()[0].GetLimitRemaining(); got != 0 {
		t.Errorf("shadow bucket has %d left", got)
	}
	if got := res.GetStatuses()[1].GetLimitRemaining(); got != 3 {
		t.Errorf("real bucket has %d left, want 3", got)
	}
	if h := headerMap(res.GetResponseHeadersToAdd()); !strings.HasPrefix(h["RateLimit"], `"Real"`) || h["Retry-After"] != "" {
		t.Errorf("headers describe %v", h)
	}
}

var errDown = errors.New("store down")

func TestFailModes(t *testing.T) {
	for _, open := range []bool{true, false} {
		e := newEnv(t, engines[0], envOptions{store: storetest.Down{Err: errDown}, failOpen: open})
		e.limit(perMinute("L", limiter.String, 1, 1))
		e.rule("d", "L", "k", "")
		res, err := e.call(request("d", desc("k", "v"), desc("unmatched", "x")))
		if open {
			if err != nil {
				t.Fatalf("fail open: %v", err)
			}
			wantCodes(t, res, ok, ok, ok)
			if res.GetStatuses()[0].GetCurrentLimit() != nil {
				t.Errorf("a degraded answer claims to know the bucket: %v", res.GetStatuses()[0])
			}
			continue
		}
		if status.Code(err) != codes.Unavailable || res != nil {
			t.Errorf("fail closed: %v, %v", res, err)
		}
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("L", limiter.String, 100, 100))
	e.rule("d", "L", "k", "")
	req := request("d", desc("k", "v"))
	secret, hash := auth.NewSecret()
	if _, err := e.db.CreateToken(context.Background(), "test", auth.Token{Name: "staff", Scope: auth.Support, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	decideSecret, decideHash := auth.NewSecret()
	if _, err := e.db.CreateToken(context.Background(), "test", auth.Token{Name: "envoy", Scope: auth.Decide, Hash: decideHash}); err != nil {
		t.Fatal(err)
	}
	if err := e.keeper.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		token string
		code  codes.Code
	}{
		{"", codes.Unauthenticated},
		{"not-a-token", codes.Unauthenticated},
		{secret, codes.PermissionDenied},
		{decideSecret, codes.OK},
		{e.admin, codes.OK},
	} {
		res, err := e.callAs(tc.token, req)
		if status.Code(err) != tc.code || (err == nil) != (res != nil) {
			t.Errorf("token %q: %v, %v; want %v", tc.token, res, err, tc.code)
		}
	}
	// Without auth, a listener only the proxy reaches takes every call.
	open := newEnv(t, engines[0], envOptions{noAuth: true})
	open.limit(perMinute("L", limiter.String, 100, 100))
	open.rule("d", "L", "k", "")
	if res, err := open.callAs("", req); err != nil || res.GetOverallCode() != ok {
		t.Errorf("no auth: %v, %v", res, err)
	}
}

func TestHealthFollowsReadiness(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	hc := healthpb.NewHealthClient(e.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		res, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetStatus()
	}
	eventually(t, "serving", func() bool {
		return check("") == healthpb.HealthCheckResponse_SERVING && check(rlsv3.RateLimitService_ServiceDesc.ServiceName) == healthpb.HealthCheckResponse_SERVING
	})
	// A store that stops answering makes the replica unready.
	down := newEnv(t, engines[0], envOptions{store: storetest.Down{Err: errDown}})
	hc = healthpb.NewHealthClient(down.conn)
	for range 3 {
		if st := check(""); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %v with the store down", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerIP", limiter.IPAddress, 10, 10))
	e.limit(perMinute("Pair", limiter.String, 10, 10))
	e.rule("d", "PerIP", "remote_address", "")
	e.rule("d", "Pair", "a", "", "b", "")
	many := make([]*extv3.RateLimitDescriptor, 101)
	for i := range many {
		many[i] = desc("k", "v")
	}
	long := strings.Repeat("x", 257)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", request("", desc("k", "v")), "domain: must not be empty"},
		{"no descriptors", request("d"), "descriptors: must hold 1 to 100 descriptors"},
		{"too many descriptors", request("d", many...), "descriptors: must hold 1 to 100 descriptors"},
		{"no entries", request("d", desc("k", "v"), &extv3.RateLimitDescriptor{}), "descriptors[1].entries: must hold 1 to 16 entries"},
		{"empty key", request("d", desc("k", "v", "", "v")), "descriptors[0].entries[1].key: must not be empty"},
		{"huge value", request("d", desc("k", long)), "descriptors[0].entries[0].value: must be at most 256 bytes"},
		{"huge domain", request(long, desc("k", "v")), "domain: must be at most 256 bytes"},
		{"NUL", request("d", desc("k", "v\x00")), "descriptors[0].entries[0].value: must not hold control characters"},
		{"huge hits", request("d", hits(desc("remote_address", "10.0.0.1"), 1<<63)), "descriptors[0].hits_addend: must be at most 9223372036854775807"},
		{"not an address", request("d", desc("k", "v"), desc("remote_address", "nope")), `descriptors[1].entries[0].value: not a bucket id of limit "PerIP"`},
		{"empty address", request("d", desc("remote_address", "")), `descriptors[0].entries[0].value: not a bucket id of limit "PerIP"`},
		{"joined id too long", request("d", desc("a", strings.Repeat("%", 200), "b", "y")), `descriptors[0].entries: not a bucket id of limit "Pair"`},
		{"negative hits", request("d", &extv3.RateLimitDescriptor{Entries: desc("k", "v").Entries, IsNegativeHits: true}), "descriptors[0].is_negative_hits: not supported"},
	} {
		res, err := e.call(tc.req)
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || res != nil || !strings.HasPrefix(st.Message(), tc.want) {
			t.Errorf("%s: %v, %v; want INVALID_ARGUMENT %q", tc.name, res, err, tc.want)
		}
	}
	// Envoy copies header bytes into descriptors, which need not be UTF-8
	// and which protobuf's own decoder refuses.
	for _, tc := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"invalid UTF-8 key", rawRequest("d", [][]string{{"k\xff", "v"}}), "descriptors[0].entries[0].key: must be valid UTF-8"},
		{"invalid UTF-8 value", rawRequest("d", [][]string{{"k", "v"}, {"k", "\xc3"}}), "descriptors[1].entries[0].value: must be valid UTF-8"},
		{"invalid UTF-8 domain", rawRequest("\xff", [][]string{{"k", "v"}}), "domain: must be valid UTF-8"},
	} {
		st, _ := status.FromError(e.invokeRaw(tc.raw))
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tc.want) {
			t.Errorf("%s: %v; want INVALID_ARGUMENT %q", tc.name, st, tc.want)
		}
	}
	// A message that is not protobuf at all stays an error of the transport.
	if err := e.invokeRaw([]byte{0x0a, 0xff}); status.Code(err) == codes.OK {
		t.Error("a truncated message was answered")
	}
	// Nothing was spent by the refused requests.
	res := e.must(request("d", hits(desc("remote_address", "10.0.0.1"), 0)))
	if got := res.GetStatuses()[0].GetLimitRemaining(); got != 10 {
		t.Errorf("%d left after refused requests, want 10", got)
	}
}

// TestRuleReachesAnotherReplica: a rule made through one replica's
// database handle is used by another's listener without a restart.
func TestRuleReachesAnotherReplica(t *testing.T) {
	one := newEnv(t, engines[1], envOptions{})
	two := newEnv(t, engines[1], envOptions{dbURL: one.dbURL})
	one.limit(perMinute("L", limiter.String, 1, 1))
	req := request("d", desc("user", "u"))
	wantCodes(t, two.must(req), ok, ok)
	if two.must(req).GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatal("a descriptor matched before any rule")
	}
	one.rule("d", "L", "user", "")
	eventually(t, "the rule on the other replica", func() bool {
		return two.must(request("d", hits(desc("user", "u"), 0))).GetStatuses()[0].GetCurrentLimit().GetName() == "L"
	})
}

// eventually polls cond until it holds, failing the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s", what)
		}
	}
}

// stallStore answers nothing until its caller gives up, and records the
// deadline it was given.
type stallStore struct {
	storetest.Down
	deadlines chan time.Time
}

func (s stallStore) Apply(ctx context.Context, _ limiter.Op, _ time.Time, _ []limiter.Bucket) (bool, error) {
	d, _ := ctx.Deadline()
	s.deadlines <- d
	<-ctx.Done()
	return false, ctx.Err()
}

func (stallStore) Ping(context.Context) error { return nil }

// TestDeadlineBoundsTheStore: the store call ends with the caller's
// deadline, as Envoy's filter timeout sets it, and fails closed.
func TestDeadlineBoundsTheStore(t *testing.T) {
	st := stallStore{Down: storetest.Down{Err: errDown}, deadlines: make(chan time.Time, 1)}
	e := newEnv(t, engines[0], envOptions{store: st})
	e.limit(perMinute("L", limiter.String, 1, 1))
	e.rule("d", "L", "k", "")
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+e.admin), 200*time.Millisecond)
	defer cancel()
	want, _ := ctx.Deadline()
	_, err := e.client.ShouldRateLimit(ctx, request("d", desc("k", "v")))
	if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Unavailable {
		t.Errorf("a stalled store: %v", err)
	}
	// gRPC sends the time left, so the server's deadline is the caller's
	// plus the transit: far from any default of its own.
	got := <-st.deadlines
	if got.IsZero() || got.After(want.Add(100*time.Millisecond)) {
		t.Errorf("the store's deadline %v, the caller's %v", got, want)
	}
}
