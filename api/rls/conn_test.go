package rls

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// noRules is a Decider whose snapshot holds no rule, so that every call
// is answered OK without a decision: these tests are about connections.
type noRules struct{}

func (noRules) Decide(context.Context, limiter.Op, []limiter.Request, []limiter.Decision) (limiter.Result, error) {
	return limiter.Result{}, errors.New("no rule matched, so nothing is decided")
}

func (noRules) Snapshot() *limiter.Snapshot {
	return limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index}).Snapshot(1)
}

// tokens authenticates one secret, of scope decide.
type tokens string

func (t tokens) Authenticate(secret string) (auth.Principal, bool) {
	return auth.Principal{Name: "envoy", Scope: auth.Decide}, secret == string(t)
}

const secret = "rlt_envoy"

// listen serves a Server with the given bounds on a loopback port and
// returns its address.
func listen(t *testing.T, cfg Config, limits connLimits) string {
	t.Helper()
	cfg.Limiter = noRules{}
	cfg.Observer = telemetry.New(telemetry.Config{}).Front("grpc")
	s := newServer(cfg, limits)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = s.Serve(ln); close(done) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Stop(ctx)
		<-done
	})
	return ln.Addr().String()
}

// h2 is a client that speaks HTTP/2 frames itself, as an attacker's would,
// with no gRPC library to pace it.
type h2 struct {
	t    *testing.T
	conn net.Conn
	fr   *http2.Framer
	// settings is what the server announced first.
	settings map[http2.SettingID]uint32
}

func dialH2(t *testing.T, addr string) *h2 {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A guard against a server that never answers; no assertion reads it.
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	c := &h2{t: t, conn: conn, fr: http2.NewFramer(conn, conn), settings: map[http2.SettingID]uint32{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f := c.read()
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = sf.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
			if err := c.fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
}

func (c *h2) read() http2.Frame {
	c.t.Helper()
	f, err := c.fr.ReadFrame()
	if err != nil {
		c.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// callHeaders is the header block of a ShouldRateLimit call, with the
// token when it is not empty.
func callHeaders(token string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "ratelimitd"},
		{":path", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if token != "" {
		_ = enc.WriteField(hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
	}
	return b.Bytes()
}

// field is the value of a header of a frame, "" when it has none.
func field(h *http2.MetaHeadersFrame, name string) string {
	for _, f := range h.RegularFields() {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// TestStreamsWithoutTokenHoldNothing: one connection opens thousands of
// calls without a token and never sends their messages. Each is refused
// UNAUTHENTICATED from its headers alone, and the server starts no
// goroutine for any of them.
func TestStreamsWithoutTokenHoldNothing(t *testing.T) {
	addr := listen(t, Config{Auth: tokens(secret)}, defaultConnLimits())
	c := dialH2(t, addr)
	const n = 5000
	before := runtime.NumGoroutine()
	block := callHeaders("")
	var wg sync.WaitGroup
	wg.Go(func() {
		// The server answers as it reads, so the answers are read while
		// the calls are written.
		for i := range uint32(n) {
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2*i + 1, BlockFragment: block, EndHeaders: true}); err != nil {
				t.Errorf("stream %d: %v", 2*i+1, err)
				return
			}
		}
		// The server reads frames in order: its answer to this ping
		// follows what it did with every call.
		if err := c.fr.WritePing(false, [8]byte{1}); err != nil {
			t.Error(err)
		}
	})
	refused, other := 0, map[string]int{}
	for {
		f := c.read()
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			break
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			if code := h.PseudoValue("status"); code != "200" {
				other[":status "+code]++
			} else if st := field(h, "grpc-status"); st == strconv.Itoa(int(codes.Unauthenticated)) {
				refused++
			} else {
				other["grpc-status "+st]++
			}
		}
	}
	wg.Wait()
	grown := runtime.NumGoroutine() - before
	if refused != n || len(other) > 0 {
		t.Errorf("%d of %d calls without a token refused UNAUTHENTICATED before their messages; other answers %v", refused, n, other)
	}
	t.Logf("%d calls without a token: %d goroutines more", n, grown)
	// A generous bound: a goroutine per call would be thousands.
	if grown > 50 {
		t.Errorf("%d calls without a token left %d goroutines more", n, grown)
	}
	if got := c.settings[http2.SettingMaxConcurrentStreams]; got != defaultConnLimits().streams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", got, defaultConnLimits().streams)
	}
}

// TestStreamsBeyondTheBoundWait: a client with a token that holds every
// stream of its connection makes its next call wait, and that call goes
// through once a stream is free. A listener without auth takes calls
// without a token.
func TestStreamsBeyondTheBoundWait(t *testing.T) {
	limits := defaultConnLimits()
	limits.streams = 4
	for _, tc := range []struct {
		name  string
		cfg   Config
		token string
	}{{"token", Config{Auth: tokens(secret)}, secret}, {"none", Config{}, ""}} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(listen(t, tc.cfg, limits), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := context.Background()
			if tc.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.token)
			}
			client := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*extv3.RateLimitDescriptor{{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
			if _, err := client.ShouldRateLimit(ctx, req); err != nil {
				t.Fatalf("a call: %v", err)
			}
			// Streams that never send their message hold their slots.
			var held []context.CancelFunc
			defer func() {
				for _, c := range held {
					c()
				}
			}()
			desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
			for range limits.streams {
				hctx, cancel := context.WithCancel(ctx)
				held = append(held, cancel)
				if _, err := conn.NewStream(hctx, desc, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName); err != nil {
					t.Fatal(err)
				}
			}
			// The wait ends only by the deadline: no slot frees meanwhile,
			// however slow the machine.
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = client.ShouldRateLimit(wctx, req)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a call beyond %d streams in flight: %v, want it to wait", limits.streams, err)
			}
			held[0]()
			if _, err := client.ShouldRateLimit(ctx, req); err != nil {
				t.Errorf("a call once a stream is free: %v", err)
			}
		})
	}
}

// TestKeepalive: an idle connection is closed, and pings at the pace the
// policy allows are answered, with no call in flight, as Envoy's
// connection keep-alive sends them.
func TestKeepalive(t *testing.T) {
	limits := defaultConnLimits()
	limits.keepalive.MaxConnectionIdle = 200 * time.Millisecond
	c := dialH2(t, listen(t, Config{}, limits))
	for {
		if g, ok := c.read().(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo {
				t.Errorf("an idle connection closed with %v", g.ErrCode)
			}
			break
		}
	}

	limits = defaultConnLimits()
	limits.enforcement.MinTime = 20 * time.Millisecond
	c = dialH2(t, listen(t, Config{}, limits))
	for i := range 5 {
		// Sleeping paces the pings; only a faster pace could be refused.
		time.Sleep(2 * limits.enforcement.MinTime)
		if err := c.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		for acked := false; !acked; {
			switch f := c.read().(type) {
			case *http2.PingFrame:
				acked = f.IsAck()
			case *http2.GoAwayFrame:
				t.Fatalf("ping %d, every %v with no call in flight: GOAWAY %v %q", i, 2*limits.enforcement.MinTime, f.ErrCode, f.DebugData())
			}
		}
	}
	// A client that pings faster than the policy is sent away.
	for i := range 5 {
		_ = c.fr.WritePing(false, [8]byte{byte(i)})
	}
	for {
		if g, ok := c.read().(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("a ping flood: GOAWAY %v", g.ErrCode)
			}
			break
		}
	}
}

// gate is a Decider whose decisions each wait until `want` of them are in
// flight at once, then all allow: calls that the server ran one after the
// other would never get there.
type gate struct {
	snap    *limiter.Snapshot
	arrived chan struct{}
	open    chan struct{}
	want    int
	once    sync.Once
}

func newGate(t *testing.T, want int) *gate {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	l := limiter.Limit{Name: "L", Enum: 1, IDFormat: limiter.String, Params: limiter.Params{Burst: 10, Count: 10, Period: time.Second}}
	if err := b.PutLimit(l); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRule(limiter.Rule{ID: "r", Domain: "d", Limit: "L", Descriptor: []limiter.DescriptorEntry{{Key: "k"}}}); err != nil {
		t.Fatal(err)
	}
	return &gate{snap: b.Snapshot(1), arrived: make(chan struct{}, want), open: make(chan struct{}), want: want}
}

func (g *gate) Decide(ctx context.Context, _ limiter.Op, reqs []limiter.Request, dst []limiter.Decision) (limiter.Result, error) {
	g.arrived <- struct{}{}
	if len(g.arrived) == g.want {
		g.once.Do(func() { close(g.open) })
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return limiter.Result{}, ctx.Err()
	}
	dst = dst[:0]
	for range reqs {
		dst = append(dst, limiter.Decision{Outcome: limiter.Outcome{Allowed: true}, Source: limiter.SourceUnlimited})
	}
	return limiter.Result{Allowed: true, Decisions: dst}, nil
}

func (g *gate) Snapshot() *limiter.Snapshot { return g.snap }

// TestCallsBeyondTheWorkersRunAtOnce: calls in flight beyond the stream
// workers are not queued behind them; each runs at once on a goroutine of
// its own, so that a slow store round trip never holds up other calls.
func TestCallsBeyondTheWorkersRunAtOnce(t *testing.T) {
	limits := defaultConnLimits()
	limits.workers = 2
	const calls = 8
	g := newGate(t, calls)
	s := newServer(Config{Limiter: g, Observer: telemetry.New(telemetry.Config{}).Front("grpc")}, limits)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	defer s.Stop(context.Background())
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	// The deadline only ends a test that would otherwise hang.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*extv3.RateLimitDescriptor{{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(i)}}}}}
			res, err := client.ShouldRateLimit(ctx, req)
			if err == nil && res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				err = errors.New(res.String())
			}
			errs <- err
		}()
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Errorf("%d calls in flight on %d workers: %v", calls, limits.workers, err)
		}
	}
}
