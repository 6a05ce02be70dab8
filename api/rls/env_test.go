package rls_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/forwardauth"
	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/loader"
)

// engine is a database and a store the listener runs on.
type engine struct {
	name     string
	postgres bool
	redis    bool
}

var engines = []engine{{"sqlite+memory", false, false}, {"postgres+redis", true, true}}

type envOptions struct {
	noAuth      bool
	failOpen    bool
	omitHeaders bool
	store       limiter.Store
	// dbURL shares a database with another env, as a second replica.
	dbURL string
}

// env is one replica: a database, a loader, a Limiter and the gRPC
// listener on a loopback port, with a real client.
type env struct {
	t      testing.TB
	db     *db.DB
	dbURL  string
	lim    *limiter.Limiter
	loader *loader.Loader
	srv    *api.Server
	// http serves srv's routes through the edge.
	http   http.Handler
	gs     *rls.Server
	reg    *prometheus.Registry
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	admin  string
	keeper *auth.Keeper
	// forwardAuth is the URL of the forward-auth route over the same
	// Limiter, for comparing the two fronts.
	forwardAuth string
}

func newEnv(t testing.TB, eng engine, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	url := o.dbURL
	switch {
	case url != "":
	case eng.postgres:
		url = testenv.Postgres(t)
	default:
		url = "sqlite:" + t.TempDir() + "/ratelimitd.db"
	}
	d, err := db.Open(ctx, url, db.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store := o.store
	switch {
	case store != nil:
	case eng.redis:
		// A generous timeout: a loaded test machine is no outage.
		store = redisstore.New(testenv.Redis(t), redisstore.Options{Prefix: testenv.RandomName("rls-") + ":", Timeout: 5 * time.Second})
	default:
		ms := memstore.New(memstore.Options{})
		t.Cleanup(ms.Close)
		store = ms
	}
	lim := limiter.New(limiter.Config{Store: store, FailOpen: o.failOpen, Logger: log})
	admin, _ := auth.NewSecret()
	keeper := auth.NewKeeper(d.ListTokens, admin, log)
	ld := loader.New(loader.Config{Source: d, Target: lim, Tokens: keeper.Refresh, SyncInterval: time.Hour, MaxBackoff: 50 * time.Millisecond, Logger: log})
	if err := keeper.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tel := telemetry.New(telemetry.Config{Registry: reg, Stats: lim.Stats, Status: ld.Status})
	srv := api.New(api.Config{Limits: d, Overrides: d, Rules: d, Tokens: d, Files: d, Limiter: lim, Auth: keeper, Sync: ld.Sync, Status: ld.Status,
		Metrics: tel.Handler(), OpenAPI: ratelimitd.OpenAPI(), Logger: log})
	cfg := rls.Config{Limiter: lim, Auth: keeper, Ready: srv.Ready, Observer: tel.Front("grpc"), OmitHeaders: o.omitHeaders, Logger: log}
	if o.noAuth {
		cfg.Auth = nil
	}
	gs := rls.New(cfg)
	fa := httptest.NewServer(edge.New(edge.Config{Observer: tel.Front("http"), Logger: log},
		forwardauth.New(forwardauth.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("forward_auth"), Clients: clientip.New(clientip.Loopback)}).Routes()...))
	t.Cleanup(fa.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = ld.Run(ctx) })
	wg.Go(func() { _ = gs.Serve(ln) })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		stop, cancelStop := context.WithTimeout(context.Background(), 5*time.Second)
		gs.Stop(stop)
		cancelStop()
		cancel()
		wg.Wait()
		_ = d.Close()
	})
	select {
	case <-ld.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the loader did not load")
	}
	return &env{t: t, db: d, dbURL: url, lim: lim, loader: ld, srv: srv, gs: gs,
		http: edge.New(edge.Config{Observer: tel.Front("http"), Logger: log}, srv.Routes()...), reg: reg, client: rlsv3.NewRateLimitServiceClient(conn),
		conn: conn, admin: admin, keeper: keeper, forwardAuth: fa.URL}
}

// limit creates a limit and waits until the snapshot holds it.
func (e *env) limit(l limiter.Limit) {
	e.t.Helper()
	if _, _, err := e.db.PutLimit(context.Background(), "test", l); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

// rule creates a rule of domain and the entries (key, value pairs; an
// empty value matches any) and waits until the snapshot holds it.
func (e *env) rule(domain, limit string, kv ...string) limiter.Rule {
	e.t.Helper()
	r, err := e.db.CreateRule(context.Background(), "test", limiter.Rule{Domain: domain, Limit: limit, Descriptor: entriesOf(kv...)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.sync()
	return r
}

func (e *env) override(o limiter.Override) {
	e.t.Helper()
	o.Enabled = true
	if _, err := e.db.CreateOverride(context.Background(), "test", o); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

func (e *env) sync() {
	e.t.Helper()
	if err := e.loader.Sync(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// call sends a request with the admin token.
func (e *env) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return e.callAs(e.admin, req)
}

func (e *env) callAs(token string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return e.client.ShouldRateLimit(ctx, req)
}

// must sends a request that must succeed.
func (e *env) must(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	e.t.Helper()
	res, err := e.call(req)
	if err != nil {
		e.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(res.GetStatuses()) != len(req.GetDescriptors()) {
		e.t.Fatalf("%d statuses for %d descriptors", len(res.GetStatuses()), len(req.GetDescriptors()))
	}
	return res
}

func entriesOf(kv ...string) []limiter.DescriptorEntry {
	var out []limiter.DescriptorEntry
	for i := 0; i < len(kv); i += 2 {
		out = append(out, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// desc makes a request descriptor of key, value pairs.
func desc(kv ...string) *extv3.RateLimitDescriptor {
	d := &extv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &extv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(d *extv3.RateLimitDescriptor, n uint64) *extv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, ds ...*extv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func perMinute(name string, f limiter.IDFormat, burst, count int64) limiter.Limit {
	return limiter.Limit{Name: name, IDFormat: f, Params: limiter.Params{Burst: burst, Count: count, Period: time.Minute}}
}

// rawRequest encodes a request by hand, so that its strings may be any
// bytes: descriptors are lists of key, value pairs.
func rawRequest(domain string, descriptors [][]string) []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, kv := range descriptors {
		var d []byte
		for i := 0; i < len(kv); i += 2 {
			var entry []byte
			entry = protowire.AppendTag(entry, 1, protowire.BytesType)
			entry = protowire.AppendString(entry, kv[i])
			entry = protowire.AppendTag(entry, 2, protowire.BytesType)
			entry = protowire.AppendString(entry, kv[i+1])
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendBytes(d, entry)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// rawCodec sends requests as the bytes given and reads answers as
// protobuf.
type rawCodec struct{ encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// invokeRaw sends raw bytes as a ShouldRateLimit request.
func (e *env) invokeRaw(raw []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.admin)
	var res rlsv3.RateLimitResponse
	return e.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, raw, &res,
		grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(protoenc.Name)}))
}
