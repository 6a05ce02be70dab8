package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/stats"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/loader"
	"github.com/ratelimitd/ratelimitd/web"
)

// serve runs the service until ctx ends, then shuts down gracefully:
// in-flight requests finish, background loops stop, pools close.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return serveAt(ctx, time.Now, args, getenv, stdout, stderr)
}

// serveAt is serve on the clock now, which decisions, override expiry,
// the loader's snapshots and the in-process store read, so that a test can
// step time by hand through the whole wiring.
func serveAt(ctx context.Context, now func() time.Time, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg, rest, err := loadConfig(fs, args, getenv)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("serve: unexpected arguments %q; settings are flags or RATELIMIT_* variables", strings.Join(rest, " "))
	}
	log := newLogger(stderr, cfg.LogLevel)
	log.Info("starting", "version", version, "config", cfg.masked())

	// Off unless OTEL_TRACES_EXPORTER asks: then every hook is nil.
	traces, stopTraces, err := telemetry.TracesFromEnv(ctx, getenv, version)
	if err != nil {
		return err
	}
	defer func() {
		// Last, so that the spans of the final requests go out too.
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		if err := stopTraces(flushCtx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()

	d, err := openDB(ctx, cfg, log, cfg.Migrate)
	if err != nil {
		return err
	}
	defer d.Close()

	store, storeName, closeStore := openStore(cfg, now)
	defer closeStore()

	// Telemetry reads the limiter's counters, and the limiter reports its
	// store calls and leases to telemetry: the hooks reach tel, made
	// below, before any decision can be made.
	var tel *telemetry.Telemetry
	lim := limiter.New(limiter.Config{Store: store, Now: now, FailOpen: cfg.FailOpen, DeniedCacheSize: cfg.DeniedCacheSize, Logger: log,
		TraceStore: traces.Store, ObserveStore: func(op limiter.Op, took time.Duration, err error) { tel.ObserveStore(op, took, err) },
		ObserveLease: func(limit string, e limiter.LeaseEvent, n int64) { tel.ObserveLease(limit, e, n) }})
	keeper := auth.NewKeeper(d.ListTokens, cfg.BootstrapToken, log)
	ld := loader.New(loader.Config{Source: d, Target: lim, Tokens: keeper.Refresh, Now: now, SyncInterval: cfg.SyncInterval, Logger: log})
	if cfg.BootstrapToken == "" {
		if err := firstAdminToken(ctx, d, stdout); err != nil {
			return err
		}
	}

	tel = telemetry.New(telemetry.Config{Registry: prometheus.NewRegistry(), Stats: lim.Stats, Status: ld.Status, Now: now})
	httpFront := tel.Front("http")
	srv := api.New(api.Config{
		Limits: d, Overrides: d, Rules: d, Tokens: d, Files: d, Limiter: lim, Auth: keeper, Sync: ld.Sync, Status: ld.Status,
		Metrics: tel.Handler(), OpenAPI: ratelimitd.OpenAPI(),
		Web:       web.Files(),
		StoreName: storeName, DatabaseName: d.Engine(), FailOpen: cfg.FailOpen, Logger: log, Now: now,
	})
	buckets := decide.New(decide.Config{Limiter: lim, Auth: keeper, Observer: httpFront, Now: now})
	hs := &http.Server{
		// Every route of every HTTP front is registered with the edge.
		Handler: edge.New(edge.Config{Observer: httpFront, Logger: log, Trace: traces.HTTP},
			append(buckets.Routes(), srv.Routes()...)...),
		MaxHeaderBytes:    edge.ServerHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// HTTP/2 without TLS (h2c, prior knowledge) beside HTTP/1.1, for
		// clients that multiplex many decisions over one connection.
		Protocols: protocols(),
	}
	servers := []*http.Server{hs}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	listeners := []net.Listener{ln}
	if cfg.DebugAddr != "" {
		dl, err := net.Listen("tcp", cfg.DebugAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("the debug listener: %w", err)
		}
		servers, listeners = append(servers, debugServer(log)), append(listeners, dl)
		fmt.Fprintf(stdout, "ratelimitd serves pprof on http://%s/debug/pprof/\n", dl.Addr())
		log.Info("debug listener", "addr", dl.Addr().String())
		if a, ok := dl.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
			log.Warn("the debug listener is reachable from other hosts, and no token guards the internals pprof shows: keep RATELIMIT_DEBUG_ADDR on loopback",
				"addr", dl.Addr().String())
		}
	}
	fmt.Fprintf(stdout, "ratelimitd listening on http://%s (admin page: http://%s/admin/)\n", ln.Addr(), ln.Addr())
	log.Info("listening", "addr", ln.Addr().String(), "store", storeName, "database", d.Engine())

	background, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = ld.Run(background) }()
	served := make(chan error, len(servers))
	for i, s := range servers {
		go func() { served <- s.Serve(listeners[i]) }()
	}
	stopGRPC, err := startGRPC(cfg, lim, keeper, srv, tel.Front("grpc"), traces.GRPC, log, stdout, served)
	if err != nil {
		for _, s := range servers {
			_ = s.Close()
		}
		stopBackground()
		wg.Wait()
		return err
	}

	select {
	case err = <-served:
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	for _, s := range servers {
		if serr := s.Shutdown(shutdownCtx); err == nil || errors.Is(err, http.ErrServerClosed) {
			err = serr
		}
	}
	stopGRPC(shutdownCtx)
	cancel()
	stopBackground()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info("stopped", "err", err)
	return err
}

// protocols are those of the main listener: HTTP/1.1, and HTTP/2 without
// TLS for clients that know beforehand that the server speaks it.
func protocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &p
}

// debugServer serves net/http/pprof, on its own listener so that profiles
// are never reachable through the API's address. A CPU profile or a trace
// takes as long as the client asks, so it has no write timeout. The
// command line is left out: it may hold -bootstrap-token (the index
// answers 404 for it).
func debugServer(log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
}

// openDB connects to the database and, when migrate is true, applies the
// pending migrations.
func openDB(ctx context.Context, cfg *config, log *slog.Logger, migrate bool) (*db.DB, error) {
	d, err := db.Open(ctx, cfg.DatabaseURL, db.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("opening the database: %w", err)
	}
	if migrate {
		if err := d.Migrate(ctx); err != nil {
			d.Close()
			return nil, fmt.Errorf("migrating the database: %w", err)
		}
	}
	return d, nil
}

// openStore returns the Redis store when a URL is configured, else the
// in-process one, with its name and a function that releases it. The
// in-process store sweeps full buckets by now.
func openStore(cfg *config, now func() time.Time) (limiter.Store, string, func()) {
	if cfg.Redis == nil {
		s := memstore.New(memstore.Options{Now: now})
		return s, "memory", s.Close
	}
	client := redis.NewUniversalClient(cfg.Redis)
	s := redisstore.New(client, redisstore.Options{Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout})
	return s, "redis", func() { _ = client.Close() }
}

// firstAdminToken makes a fresh deployment usable: when the database has
// no token at all and no bootstrap token is configured, it creates an admin
// token and prints its secret, which is never shown again. Of replicas
// starting together on an empty database, one does.
func firstAdminToken(ctx context.Context, d *db.DB, stdout io.Writer) error {
	secret, hash := auth.NewSecret()
	t, created, err := d.CreateFirstToken(ctx, auth.ServiceActor, auth.Token{Name: "initial-admin", Scope: auth.Admin, Hash: hash})
	if err != nil {
		return fmt.Errorf("creating the first admin token: %w", err)
	}
	if !created {
		return nil
	}
	fmt.Fprintf(stdout, "No token existed, so an admin token was created (id %s). It is shown only this once:\n\n    %s\n\n", t.ID, secret)
	return nil
}

// startGRPC starts Envoy's rate limit service on cfg.GRPCAddr, unless it
// is empty, and returns what stops it gracefully within a context. A
// failure of the listener ends serve as the HTTP server's does, through
// failed. traced, when not nil, traces the calls.
func startGRPC(cfg *config, lim *limiter.Limiter, keeper *auth.Keeper, srv *api.Server, obs rls.Observer, traced stats.Handler, log *slog.Logger, stdout io.Writer, failed chan<- error) (func(context.Context), error) {
	if cfg.GRPCAddr == "" {
		return func(context.Context) {}, nil
	}
	rc := rls.Config{Limiter: lim, Auth: keeper, Ready: srv.Ready, Observer: obs,
		OmitHeaders: !cfg.GRPCResponseHeaders, Logger: log, StatsHandler: traced}
	if !cfg.GRPCAuth {
		rc.Auth = nil
		log.Warn("the gRPC listener accepts calls without a token (RATELIMIT_GRPC_AUTH=none): only the proxy may reach it", "addr", cfg.GRPCAddr)
	}
	scheme := "grpc"
	if cfg.GRPCTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.GRPCTLSCert, cfg.GRPCTLSKey)
		if err != nil {
			return nil, fmt.Errorf("the gRPC listener's certificate: %w", err)
		}
		rc.TLS, scheme = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, "grpcs"
	}
	ln, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return nil, err
	}
	gs := rls.New(rc)
	fmt.Fprintf(stdout, "Envoy rate limit service listening on %s://%s\n", scheme, ln.Addr())
	log.Info("listening", "addr", ln.Addr().String(), "api", "envoy.service.ratelimit.v3", "tls", rc.TLS != nil, "auth", cfg.GRPCAuth)
	go func() {
		if err := gs.Serve(ln); err != nil {
			select {
			case failed <- fmt.Errorf("the gRPC listener: %w", err):
			default: // the HTTP server failed first
			}
		}
	}()
	return gs.Stop, nil
}
