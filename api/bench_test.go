package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
)

// benchServer is the API on the in-process store with a snapshot built in
// memory: what a spend costs in this process, without network or database.
func benchServer(b *testing.B) (*api.Server, string) {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := memstore.New(memstore.Options{})
	b.Cleanup(store.Close)
	lim := limiter.New(limiter.Config{Store: store, DeniedCacheSize: 1000, Logger: log})
	builder := limiter.NewBuilder()
	for i, f := range []limiter.IDFormat{limiter.RegID, limiter.IPAddress, limiter.Domain} {
		l := limiter.Limit{Name: "Limit" + strconv.Itoa(i), Enum: i + 1, IDFormat: f,
			Params: limiter.Params{Burst: 1 << 30, Count: 1 << 19, Period: time.Second}}
		if err := builder.PutLimit(l); err != nil {
			b.Fatal(err)
		}
	}
	lim.SetSnapshot(builder.Snapshot(1, time.Now()))
	secret, _ := auth.NewSecret()
	keeper := auth.NewKeeper(func(context.Context) ([]auth.Token, error) { return nil, nil }, secret, time.Hour, log)
	srv := api.New(api.Config{Limiter: lim, Auth: keeper, Registry: prometheus.NewRegistry(), Logger: log})
	return srv, secret
}

// BenchmarkSpendHTTP measures POST /v1/spend through the whole handler
// chain: authentication, body limit, decoding, the Limiter with the
// in-process store, metrics, headers and the answer.
func BenchmarkSpendHTTP(b *testing.B) {
	bodies := map[string]string{
		"1 bucket":        `{"buckets":[{"limit":"Limit0","bucket_id":"12345678","cost":1}]}`,
		"3 buckets":       `{"buckets":[{"limit":"Limit0","bucket_id":"12345678"},{"limit":"Limit1","bucket_id":"192.0.2.1"},{"limit":"Limit2","bucket_id":"example.com"}]}`,
		"generic decoder": `{"buckets":[{"limit":"Limit0","bucket_id":"1234567\u0038","cost":1}]}`,
	}
	for name, body := range bodies {
		b.Run(name, func(b *testing.B) {
			srv, secret := benchServer(b)
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
