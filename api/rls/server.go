package rls

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

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
	// health service follows it.
	Ready func(context.Context) error
	// Observer counts the decisions. Required.
	Observer Observer
	// TLS, when set, serves over TLS.
	TLS    *tls.Config
	Logger *slog.Logger

	// StatsHandler, when set, sees every call, as tracing needs; nil
	// adds nothing to a call.
	StatsHandler stats.Handler
}

// readinessInterval is how often the health service asks Ready: a
// readiness probe sees a change within it.
const readinessInterval = time.Second

// Server is the gRPC listener: ShouldRateLimit, grpc.health.v1 and server
// reflection.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	ready  func(context.Context) error
	log    *slog.Logger
}

// New returns a Server; Serve starts it.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	opts := []grpc.ServerOption{grpc.ForceServerCodecV2(newCodec())}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.Auth != nil {
		opts = append(opts, grpc.UnaryInterceptor(authorize(cfg.Auth)))
	}
	if cfg.StatsHandler != nil {
		opts = append(opts, grpc.StatsHandler(cfg.StatsHandler))
	}
	s := &Server{grpc: grpc.NewServer(opts...), health: health.NewServer(), ready: cfg.Ready, log: cfg.Logger}
	rlsv3.RegisterRateLimitServiceServer(s.grpc, newService(cfg))
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// Serve answers on ln, and keeps the health service in step with Ready,
// until Stop. It returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.followReadiness(ctx)
	return s.grpc.Serve(ln)
}

// followReadiness sets the health status from Ready every second.
func (s *Server) followReadiness(ctx context.Context) {
	t := time.NewTicker(readinessInterval)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		rctx, cancel := context.WithTimeout(ctx, readinessInterval)
		if s.ready != nil && s.ready(rctx) != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.health.SetServingStatus("", st)
		s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stop tells health watchers the service is going, lets the calls in
// flight finish until ctx ends, then closes every connection.
func (s *Server) Stop(ctx context.Context) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// authorize checks the bearer token of ShouldRateLimit calls; health
// checks and reflection hold nothing secret and need none, as /healthz
// does not.
func authorize(a Authenticator) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		values := md.Get("authorization")
		if len(values) != 1 {
			return nil, status.Error(codes.Unauthenticated, "send one authorization: Bearer <token> metadata entry")
		}
		if _, err := problem.Authorize(a, values[0], auth.Decide); err != nil {
			return nil, grpcError(err)
		}
		return handler(ctx, req)
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
