package rls

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
)

// Authenticator knows the API tokens; *auth.Keeper is one.
type Authenticator interface {
	Authenticate(secret string) (auth.Principal, bool)
}

// Config wires a Server.
type Config struct {
	Limiter Decider
	// Auth checks the bearer token of every ShouldRateLimit call, which
	// needs the scope decide or admin. Nil accepts every call, for a
	// listener that only the proxy can reach (RATELIMIT_GRPC_AUTH=none).
	Auth Authenticator
	// Ready says whether this replica can decide, as /readyz does; the
	// health service asks it on every check. Nil is always ready.
	Ready func(context.Context) error
	// Observer counts the decisions. Required.
	Observer Observer
	// OmitHeaders leaves response_headers_to_add empty, as
	// envoyproxy/ratelimit does unless asked, for a proxy that must not
	// show clients the RateLimit headers (RATELIMIT_GRPC_RESPONSE_HEADERS=off).
	OmitHeaders bool
	// TLS, when set, serves over TLS.
	TLS    *tls.Config
	Logger *slog.Logger

	// StatsHandler, when set, sees every call, as tracing needs; nil
	// adds nothing to a call.
	StatsHandler stats.Handler
}

// Server is the gRPC listener: ShouldRateLimit, grpc.health.v1 and server
// reflection.
type Server struct {
	grpc   *grpc.Server
	health *healthService
}

// connLimits bound what one client connection may hold of the server.
type connLimits struct {
	// streams is the most calls in flight on one connection: a client
	// waits for a free stream, or opens another connection.
	streams uint32
	// workers is how many goroutines wait for calls: a call on a waiting
	// worker runs on a stack that earlier calls grew, while a call that
	// finds every worker busy gets a goroutine of its own, whose stack
	// grows anew as the call goes deeper (on a busy service, about a sixth
	// of the CPU of a call went to that growth).
	workers   uint32
	keepalive keepalive.ServerParameters
	// enforcement sends away a client that pings more often than it says.
	enforcement keepalive.EnforcementPolicy
}

// defaultConnLimits leave Envoy room (a thousand calls in flight on one
// connection, far beyond what a millisecond's decision needs) while a
// client that holds streams or idle connections holds a bounded share:
// an idle connection is closed after ten minutes, a peer that vanished is
// found by a ping after two minutes of silence, and pings, which cost the
// server a write each, are welcome every ten seconds, the shortest a gRPC
// client sends them, with calls in flight or without (Envoy's connection
// keep-alive pings idle connections).
func defaultConnLimits() connLimits {
	return connLimits{
		streams:     1000,
		workers:     streamWorkers,
		keepalive:   keepalive.ServerParameters{MaxConnectionIdle: 10 * time.Minute, Time: 2 * time.Minute, Timeout: 20 * time.Second},
		enforcement: keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true},
	}
}

// New returns a Server; Serve starts it.
func New(cfg Config) *Server {
	return newServer(cfg, defaultConnLimits())
}

// newServer is New with the bounds of a connection, which tests shrink.
func newServer(cfg Config, limits connLimits) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(newCodec()),
		grpc.NumStreamWorkers(limits.workers),
		grpc.MaxConcurrentStreams(limits.streams),
		grpc.KeepaliveParams(limits.keepalive),
		grpc.KeepaliveEnforcementPolicy(limits.enforcement),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.Auth != nil {
		opts = append(opts, grpc.InTapHandle(authorize(cfg.Auth)))
	}
	if cfg.StatsHandler != nil {
		opts = append(opts, grpc.StatsHandler(cfg.StatsHandler))
	}
	s := &Server{grpc: grpc.NewServer(opts...), health: newHealthService(cfg.Ready)}
	rlsv3.RegisterRateLimitServiceServer(s.grpc, newService(cfg))
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s
}

// Serve answers on ln, and keeps the health service's watchers in step
// with Ready, until Stop. It returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.health.follow(ctx)
	return s.grpc.Serve(ln)
}

// Stop tells health watchers the service is going, lets the calls in
// flight finish until ctx ends, then closes every connection.
func (s *Server) Stop(ctx context.Context) {
	s.health.shutdown()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// authorize checks the bearer token of ShouldRateLimit calls as their
// headers arrive, before the server gives the stream a goroutine or reads
// its message, so that a client without a token holds nothing of the
// server. Health checks and reflection hold nothing secret and need none,
// as /healthz does not. It runs on the connection's reader, so it must
// stay quick: a look-up in the tokens held in memory.
func authorize(a Authenticator) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName != rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			return ctx, nil
		}
		values := info.Header.Get("authorization")
		if len(values) != 1 {
			return ctx, status.Error(codes.Unauthenticated, "send one authorization: Bearer <token> metadata entry")
		}
		if _, err := problem.Authorize(a, values[0], auth.Decide); err != nil {
			return ctx, grpcError(err)
		}
		return ctx, nil
	}
}

// grpcError is the status of a refusal by the one edge of every front end:
// its gRPC code and its detail, worded as REST words it.
func grpcError(err error) error {
	p := &problem.Problem{}
	if _, ok := problem.From(err, p); !ok {
		problem.Internal(p)
	}
	return status.Error(problem.Code(p.Status), p.Detail)
}

// watchInterval is how often the health service asks Ready for its
// watchers: nothing announces that a store stopped answering, so a
// watcher learns it within this time, or at the next Check. Check itself
// has no such lag.
const watchInterval = time.Second

// services are the names the health service answers for: the whole
// server and the rate limit service.
var services = []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// healthService answers grpc.health.v1. Check and List ask Ready at the
// moment of the call, so that they say SERVING exactly when /readyz would
// answer 200. Watch is grpc's, fed by every Check and by one poll of
// Ready every watchInterval, however many watchers there are, so that a
// watcher costs the store nothing of its own.
type healthService struct {
	*health.Server
	ready    func(context.Context) error
	stopping atomic.Bool
}

func newHealthService(ready func(context.Context) error) *healthService {
	h := &healthService{Server: health.NewServer(), ready: ready}
	h.publish(healthpb.HealthCheckResponse_NOT_SERVING)
	return h
}

// status asks Ready now, and tells the watchers.
func (h *healthService) status(ctx context.Context) healthpb.HealthCheckResponse_ServingStatus {
	st := healthpb.HealthCheckResponse_SERVING
	if h.stopping.Load() || h.ready != nil && h.ready(ctx) != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.publish(st)
	return st
}

// publish sets the status the watchers see; after shutdown it changes
// nothing.
func (h *healthService) publish(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range services {
		h.SetServingStatus(name, st)
	}
}

// Check answers the status now; an unknown service is NOT_FOUND, as the
// protocol asks.
func (h *healthService) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if !slices.Contains(services, req.GetService()) {
		return nil, status.Error(codes.NotFound, "unknown service")
	}
	return &healthpb.HealthCheckResponse{Status: h.status(ctx)}, nil
}

// List answers the status of every service now.
func (h *healthService) List(ctx context.Context, _ *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	st := h.status(ctx)
	out := &healthpb.HealthListResponse{Statuses: make(map[string]*healthpb.HealthCheckResponse, len(services))}
	for _, name := range services {
		out.Statuses[name] = &healthpb.HealthCheckResponse{Status: st}
	}
	return out, nil
}

// follow asks Ready every watchInterval for the watchers, until ctx ends.
func (h *healthService) follow(ctx context.Context) {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		h.status(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// shutdown makes every answer NOT_SERVING from now on.
func (h *healthService) shutdown() {
	h.stopping.Store(true)
	h.Shutdown()
}

// streamWorkers is the number of goroutines kept for calls: enough for
// the calls in flight of a busy proxy, each waiting on a store round trip.
const streamWorkers = 128
