package rls

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
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
	// Count records the decisions of a request in the metrics shared with
	// REST; nil counts nothing.
	Count func(op limiter.Op, res limiter.Result)
	// Registry receives the metrics of this front end alone; nil keeps
	// them private.
	Registry *prometheus.Registry
	// OmitHeaders leaves response_headers_to_add empty, as
	// envoyproxy/ratelimit does unless asked, for a proxy that must not
	// show clients the RateLimit headers (RATELIMIT_GRPC_RESPONSE_HEADERS=off).
	OmitHeaders bool
	// TLS, when set, serves over TLS.
	TLS    *tls.Config
	Logger *slog.Logger
}

// Server is the gRPC listener: ShouldRateLimit, grpc.health.v1 and server
// reflection.
type Server struct {
	grpc   *grpc.Server
	health *healthService
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
	s := &Server{grpc: grpc.NewServer(opts...), health: newHealthService(cfg.Ready)}
	rlsv3.RegisterRateLimitServiceServer(s.grpc, newService(cfg))
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s
}

// Serve answers on ln until Stop. It returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
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
		switch _, refused := auth.Authorize(a, values[0], auth.Decide); {
		case refused == nil:
			return handler(ctx, req)
		case refused.Forbidden:
			return nil, status.Error(codes.PermissionDenied, refused.Detail)
		default:
			return nil, status.Error(codes.Unauthenticated, refused.Detail)
		}
	}
}

// watchInterval is how often a Watch of the health service asks Ready:
// nothing announces that a store stopped answering, so a watcher learns
// it within this time. Check has no such lag.
const watchInterval = time.Second

// healthService answers grpc.health.v1 for the whole server ("") and for
// the rate limit service alike, from Ready itself at the moment of each
// check, so that it says SERVING exactly when /readyz would answer 200.
type healthService struct {
	healthpb.UnimplementedHealthServer
	ready func(context.Context) error
	// stopping is closed by shutdown: from then on every answer is
	// NOT_SERVING, so that proxies move away before the listener closes.
	stopping chan struct{}
	once     sync.Once
}

func newHealthService(ready func(context.Context) error) *healthService {
	return &healthService{ready: ready, stopping: make(chan struct{})}
}

// services are the names the health service knows.
var services = []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// status is the serving status of service, false for a service it does
// not know.
func (h *healthService) status(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, bool) {
	if !slices.Contains(services, service) {
		return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, false
	}
	select {
	case <-h.stopping:
		return healthpb.HealthCheckResponse_NOT_SERVING, true
	default:
	}
	if h.ready != nil && h.ready(ctx) != nil {
		return healthpb.HealthCheckResponse_NOT_SERVING, true
	}
	return healthpb.HealthCheckResponse_SERVING, true
}

// Check answers the status now; an unknown service is NOT_FOUND, as the
// protocol asks.
func (h *healthService) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, known := h.status(ctx, req.GetService())
	if !known {
		return nil, status.Error(codes.NotFound, "unknown service")
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// List answers the status of every service the listener knows.
func (h *healthService) List(ctx context.Context, _ *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	out := &healthpb.HealthListResponse{Statuses: make(map[string]*healthpb.HealthCheckResponse, len(services))}
	for _, name := range services {
		st, _ := h.status(ctx, name)
		out.Statuses[name] = &healthpb.HealthCheckResponse{Status: st}
	}
	return out, nil
}

// Watch sends the status at once and then each change of it, asking
// Ready every watchInterval; an unknown service is SERVICE_UNKNOWN, as
// the protocol asks. It ends after sending NOT_SERVING at shutdown, so
// that a watcher does not hold a graceful stop up.
func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx := stream.Context()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	for {
		st, _ := h.status(ctx, req.GetService())
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-h.stopping:
			if last != healthpb.HealthCheckResponse_NOT_SERVING && last != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
				return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING})
			}
			return nil
		case <-t.C:
		}
	}
}

// shutdown makes every answer NOT_SERVING from now on.
func (h *healthService) shutdown() { h.once.Do(func() { close(h.stopping) }) }
