package rls_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// benchFront is both front ends over one Limiter, each on a loopback
// listener: what a client on the same machine sees.
type benchFront struct {
	grpc   rlsv3.RateLimitServiceClient
	rest   *http.Client
	url    string
	secret string
}

// newBenchFront serves five limits of huge bursts, each with a rule of
// domain "bench" on its own key, from a snapshot built in memory.
func newBenchFront(b *testing.B, store limiter.Store) *benchFront {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lim := limiter.New(limiter.Config{Store: store, DeniedCacheSize: 1000, Logger: log})
	builder := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	for i := range 5 {
		name := "Limit" + strconv.Itoa(i)
		l := limiter.Limit{Name: name, Enum: i + 1, IDFormat: limiter.String,
			Params: limiter.Params{Burst: 1 << 30, Count: 1 << 19, Period: time.Second}}
		if err := builder.PutLimit(l); err != nil {
			b.Fatal(err)
		}
		r := limiter.Rule{ID: name, Domain: "bench", Limit: name, Descriptor: []limiter.DescriptorEntry{{Key: "k" + strconv.Itoa(i)}}}
		if err := builder.PutRule(r); err != nil {
			b.Fatal(err)
		}
	}
	lim.SetSnapshot(builder.Snapshot(1))
	secret, _ := auth.NewSecret()
	keeper := auth.NewKeeper(func(context.Context) ([]auth.Token, error) { return nil, nil }, secret, log)
	tel := telemetry.New(telemetry.Config{Stats: lim.Stats})
	srv := api.New(api.Config{Limiter: lim, Auth: keeper, Logger: log})
	buckets := decide.New(decide.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("http")})
	hs := httptest.NewServer(edge.New(edge.Config{Observer: tel.Front("http"), Logger: log}, append(buckets.Routes(), srv.Routes()...)...))
	b.Cleanup(hs.Close)

	gs := rls.New(rls.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("grpc"), Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	b.Cleanup(func() { gs.Stop(context.Background()) })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	return &benchFront{grpc: rlsv3.NewRateLimitServiceClient(conn), rest: &http.Client{Transport: tr}, url: hs.URL, secret: secret}
}

// streams is how many calls each benchmark keeps in flight per CPU.
const streams = 32

// BenchmarkFrontEnds compares a decision through Envoy's gRPC API with a
// REST spend, both over loopback with many calls in flight, on the
// in-process store and on Redis, for one descriptor (bucket) and five.
// Each call spends on a bucket of its own among 10,000, as a busy edge
// proxy's clients would. cpu-ns/op is the CPU of this process, client
// and server together, per call.
func BenchmarkFrontEnds(b *testing.B) {
	stores := []struct {
		name string
		make func(b *testing.B) limiter.Store
	}{
		{"memory", func(b *testing.B) limiter.Store {
			s := memstore.New(memstore.Options{})
			b.Cleanup(s.Close)
			return s
		}},
		{"redis", func(b *testing.B) limiter.Store {
			return redisstore.New(testenv.Redis(b), redisstore.Options{Prefix: testenv.RandomName("rlsbench-") + ":"})
		}},
	}
	for _, st := range stores {
		for _, n := range []int{1, 5} {
			b.Run(st.name+"/grpc/"+strconv.Itoa(n), func(b *testing.B) {
				f := newBenchFront(b, st.make(b))
				ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+f.secret)
				var seq atomic.Int64
				b.SetParallelism(streams)
				start := testenv.CPUTime()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					req := &rlsv3.RateLimitRequest{Domain: "bench"}
					for i := range n {
						req.Descriptors = append(req.Descriptors, &extv3.RateLimitDescriptor{
							Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "k" + strconv.Itoa(i)}}})
					}
					for pb.Next() {
						id := strconv.FormatInt(seq.Add(1)%10000, 10)
						for _, d := range req.Descriptors {
							d.Entries[0].Value = id
						}
						res, err := f.grpc.ShouldRateLimit(ctx, req)
						if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
							b.Errorf("%v, %v", res, err)
							return
						}
					}
				})
				testenv.ReportCPU(b, start)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			})
			b.Run(st.name+"/rest/"+strconv.Itoa(n), func(b *testing.B) {
				f := newBenchFront(b, st.make(b))
				var seq atomic.Int64
				b.SetParallelism(streams)
				start := testenv.CPUTime()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var body strings.Builder
					for pb.Next() {
						id := strconv.FormatInt(seq.Add(1)%10000, 10)
						body.Reset()
						body.WriteString(`{"buckets":[`)
						for i := range n {
							if i > 0 {
								body.WriteByte(',')
							}
							body.WriteString(`{"limit":"Limit` + strconv.Itoa(i) + `","bucket_id":"` + id + `"}`)
						}
						body.WriteString(`]}`)
						req, err := http.NewRequest(http.MethodPost, f.url+"/v1/spend", strings.NewReader(body.String()))
						if err != nil {
							b.Error(err)
							return
						}
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Authorization", "Bearer "+f.secret)
						res, err := f.rest.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							b.Errorf("status %d", res.StatusCode)
							return
						}
					}
				})
				testenv.ReportCPU(b, start)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			})
		}
	}
}
