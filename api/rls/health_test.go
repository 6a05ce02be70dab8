package rls_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/limiter/memstore"
)

// flakyStore is the in-process store whose Ping fails while down is set,
// as a Redis that stops answering does.
type flakyStore struct {
	*memstore.Store
	down atomic.Bool
}

func (s *flakyStore) Ping(ctx context.Context) error {
	if s.down.Load() {
		return errors.New("the store is down")
	}
	return s.Store.Ping(ctx)
}

// TestHealthIsReadinessAtEveryMoment: a health client that asks right
// after /readyz changed its answer gets the same answer, both ways, with
// no lag of its own: a replica that is ready takes traffic at once, and
// one that is not sheds it at once.
func TestHealthIsReadinessAtEveryMoment(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	store := &flakyStore{Store: ms}
	e := newEnv(t, engines[0], envOptions{store: store})
	hc := healthpb.NewHealthClient(e.conn)
	readyz := func() int {
		rec := httptest.NewRecorder()
		e.http.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code
	}
	for round := range 3 {
		for _, tc := range []struct {
			down  bool
			code  int
			state healthpb.HealthCheckResponse_ServingStatus
		}{
			{false, http.StatusOK, healthpb.HealthCheckResponse_SERVING},
			{true, http.StatusServiceUnavailable, healthpb.HealthCheckResponse_NOT_SERVING},
		} {
			store.down.Store(tc.down)
			if code := readyz(); code != tc.code {
				t.Fatalf("round %d: /readyz %d with the store down %v", round, code, tc.down)
			}
			for _, service := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName} {
				res, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
				if err != nil || res.GetStatus() != tc.state {
					t.Fatalf("round %d: health of %q right after /readyz answered %d: %v, %v", round, service, tc.code, res.GetStatus(), err)
				}
			}
		}
	}
	// A service the listener does not serve is unknown, as grpc.health.v1
	// says.
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "no.such.Service"}); err == nil {
		t.Error("health of an unknown service answered")
	}
}

// TestHealthWatch: a watcher hears the status at once, then each change
// within a poll, and NOT_SERVING when the listener stops.
func TestHealthWatch(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	store := &flakyStore{Store: ms}
	e := newEnv(t, engines[0], envOptions{store: store})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A Check tells the watchers what it found, so the watch starts from
	// it rather than from the last poll.
	hc := healthpb.NewHealthClient(e.conn)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		res, err := w.Recv()
		if err != nil || res.GetStatus() != want {
			t.Fatalf("watch: %v, %v; want %v", res.GetStatus(), err, want)
		}
	}
	next(healthpb.HealthCheckResponse_SERVING)
	store.down.Store(true)
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	store.down.Store(false)
	next(healthpb.HealthCheckResponse_SERVING)
	stopped := make(chan struct{})
	go func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.gs.Stop(stop)
		close(stopped)
	}()
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	// The watcher leaves, and the graceful stop ends.
	cancel()
	<-stopped
}
