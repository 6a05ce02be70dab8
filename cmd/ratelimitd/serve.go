package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
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
	"github.com/ratelimitd/ratelimitd/api/forwardauth"
	"github.com/ratelimitd/ratelimitd/api/rls"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/loader"
	"github.com/ratelimitd/ratelimitd/web"
)

// serveAt is serve on the clock now, which decisions, override expiry,
// the loader's snapshots and the in-process store read, so that a test can
// step time by hand through the whole wiring.
func serveAt(ctx context.Context, now func() time.Time, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return commandNamed("serve").exec(ctx, invocation{now: now, getenv: getenv, stdout: stdout, stderr: stderr}, args)
}

// serveOn runs the service until ctx ends, then shuts down gracefully:
// in-flight requests finish, background loops stop, pools close. What can
// fail at start comes before anything is written: the listeners are bound
// before the database is created or migrated, and the first admin token is
// made last, so that a start that fails changes nothing and never made a
// secret that it did not print.
func serveOn(ctx context.Context, inv *invocation) error {
	if len(inv.args) > 0 {
		return misusef("unexpected argument %q; settings are flags or RATELIMIT_* variables", inv.args[0])
	}
	cfg, now, stdout := inv.cfg, inv.now, inv.stdout
	log := newLogger(inv.stderr, cfg.LogLevel)
	log.Info("starting", "version", version, "config", cfg.masked())

	// Off unless OTEL_TRACES_EXPORTER asks: then every hook is nil.
	traces, stopTraces, err := telemetry.TracesFromEnv(ctx, inv.getenv, version)
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

	grpcTLS, err := loadGRPCTLS(cfg)
	if err != nil {
		return err
	}
	lns, err := listen(cfg)
	if err != nil {
		return err
	}
	// The servers close the listeners they serve; this closes them when
	// the start fails before.
	defer lns.close()

	created := newSQLite(cfg.DatabaseURL)
	d, err := openDB(ctx, cfg, log, cfg.Migrate)
	if err != nil {
		return err
	}
	defer d.Close()
	announceDatabase(stdout, cfg.DatabaseURL, created)

	store, storeName, closeStore := openStore(cfg, now, log)
	defer closeStore()
	// What the Redis store knows of its primaries, for /v1/status and the
	// metrics; nothing for the in-process store.
	var topology func() api.StoreTopology
	var primaryChanges func() int64
	if rs, ok := store.(redisstore.Store); ok {
		topology = func() api.StoreTopology {
			t := rs.Topology()
			return api.StoreTopology{Primaries: t.Primaries, PrimaryChanges: t.Changes, PrimaryChangedAt: t.ChangedAt, WaitReplicas: t.WaitReplicas}
		}
		primaryChanges = func() int64 { return rs.Topology().Changes }
	}

	// Telemetry reads the limiter's counters, and the limiter reports its
	// store calls and leases to telemetry: the hooks reach tel, made
	// below, before any decision can be made.
	var tel *telemetry.Telemetry
	lim := limiter.New(limiter.Config{Store: store, Now: now, FailOpen: cfg.FailOpen, DeniedCacheSize: cfg.DeniedCacheSize, Logger: log,
		TraceStore: traces.Store, ObserveStore: func(op limiter.Op, took time.Duration, err error) { tel.ObserveStore(op, took, err) },
		ObserveLease: func(limit string, e limiter.LeaseEvent, n int64) { tel.ObserveLease(limit, e, n) }})
	keeper := auth.NewKeeper(d.ListTokens, cfg.BootstrapToken, log)
	ld := loader.New(loader.Config{Source: d, Target: lim, Tokens: keeper.Refresh, Now: now, SyncInterval: cfg.SyncInterval, Logger: log})

	tel = telemetry.New(telemetry.Config{Registry: prometheus.NewRegistry(), Stats: lim.Stats, Status: ld.Status, Now: now, PrimaryChanges: primaryChanges})
	httpFront := tel.Front("http")
	srv := api.New(api.Config{
		Limits: d, Overrides: d, Rules: d, Tokens: d, Files: d, Limiter: lim, Auth: keeper, Sync: ld.Sync, Status: ld.Status,
		Metrics: tel.Handler(), OpenAPI: ratelimitd.OpenAPI(),
		Web:       web.Files(),
		StoreName: storeName, DatabaseName: d.Engine(), FailOpen: cfg.FailOpen, StoreTopology: topology, Logger: log, Now: now,
	})
	buckets := decide.New(decide.Config{Limiter: lim, Auth: keeper, Observer: httpFront, Now: now})
	gateways := forwardauth.New(forwardauth.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("forward_auth"),
		Clients: clientip.New(cfg.TrustedProxies), Now: now})
	hs := &http.Server{
		// Every route of every HTTP front is registered with the edge.
		Handler: edge.New(edge.Config{Observer: httpFront, Logger: log, Trace: traces.HTTP},
			slices.Concat(buckets.Routes(), gateways.Routes(), srv.Routes())...),
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
	servers, listeners := []*http.Server{hs}, []net.Listener{lns.http}
	if lns.debug != nil {
		servers, listeners = append(servers, debugServer(log)), append(listeners, lns.debug)
		fmt.Fprintf(stdout, "ratelimitd serves pprof on http://%s/debug/pprof/\n", lns.debug.Addr())
		log.Info("debug listener", "addr", lns.debug.Addr().String())
		if a, ok := lns.debug.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
			log.Warn("the debug listener is reachable from other hosts, and no token guards the internals pprof shows: keep RATELIMIT_DEBUG_ADDR on loopback",
				"addr", lns.debug.Addr().String())
		}
	}

	// Nothing that can fail is left before serving: now the first admin
	// token, if the database needs one, so that it is printed whenever
	// it is made.
	if cfg.BootstrapToken == "" {
		if err := adminToken(ctx, d, cfg.DatabaseURL, stdout); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "ratelimitd listening on http://%s (admin page: http://%s/admin/)\n", lns.http.Addr(), lns.http.Addr())
	log.Info("listening", "addr", lns.http.Addr().String(), "store", storeName, "database", d.Engine())

	background, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = ld.Run(background) }()
	// Expired leases are dropped, and counted, as they expire.
	wg.Go(func() { lim.RunLeaseSweeper(background, limiter.LeaseSweepInterval) })
	served := make(chan error, len(servers))
	for i, s := range servers {
		go func() { served <- s.Serve(listeners[i]) }()
	}
	stopGRPC := startGRPC(cfg, lns.grpc, grpcTLS, lim, keeper, srv, tel.Front("grpc"), traces.GRPC, log, stdout, served)

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

// listeners are the service's sockets. debug and grpc are nil when off.
type listeners struct {
	http, debug, grpc net.Listener
}

// listen binds every listener of the configuration. A busy address is
// refused with the listener's name, the setting that moves it and, for
// the optional ones, how to turn it off.
func listen(cfg *config) (*listeners, error) {
	l := &listeners{}
	var err error
	l.http, err = bind("the HTTP listener (API and admin page)", "http-addr", "RATELIMIT_HTTP_ADDR", cfg.HTTPAddr, "")
	if err == nil && cfg.DebugAddr != "" {
		l.debug, err = bind("the debug listener (pprof)", "debug-addr", "RATELIMIT_DEBUG_ADDR", cfg.DebugAddr, ", or leave it empty to turn it off")
	}
	if err == nil && cfg.GRPCAddr != "" {
		l.grpc, err = bind("the Envoy gRPC listener", "grpc-addr", "RATELIMIT_GRPC_ADDR", cfg.GRPCAddr,
			`, or turn it off with -grpc-addr= (or RATELIMIT_GRPC_ADDR set to "") when no Envoy calls this service`)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// bind listens on addr for the listener what, whose address the flag and
// the variable env set.
func bind(what, flag, env, addr, off string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	// "listen tcp ADDR: bind: address already in use" without repeating
	// the address.
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err
	}
	return nil, fmt.Errorf("%s cannot listen on %s (%v): choose another address with -%s or %s%s", what, addr, err, flag, env, off)
}

// close closes the listeners that are open.
func (l *listeners) close() {
	for _, ln := range []net.Listener{l.http, l.debug, l.grpc} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// announceDatabase says which database serve uses, and whether this start
// created it.
func announceDatabase(stdout io.Writer, url string, created bool) {
	note := ""
	if created {
		note = ", created now"
	}
	fmt.Fprintf(stdout, "Using %s%s.\n", describeDatabase(url), note)
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
// in-process store sweeps full buckets by now; the Redis store logs its
// changes of primary to log.
func openStore(cfg *config, now func() time.Time, log *slog.Logger) (limiter.Store, string, func()) {
	if cfg.Redis == nil {
		s := memstore.New(memstore.Options{Now: now})
		return s, "memory", s.Close
	}
	client := redis.NewUniversalClient(cfg.Redis)
	s := redisstore.New(client, redisstore.Options{Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout,
		WaitReplicas: cfg.RedisWaitReplicas, WaitTimeout: cfg.RedisWaitTimeout, Logger: log})
	return s, "redis", func() { _ = client.Close() }
}

// adminToken makes a fresh deployment usable, and tells a later start how
// to get in. On a database without any token (revoked ones included) it
// creates an admin token and prints its secret, which is never shown
// again; on one with tokens it names the admin token that exists and the
// command that makes another, as the secret of the first start may be
// lost. Of replicas starting together on an empty database, one creates
// it.
func adminToken(ctx context.Context, d *db.DB, dbURL string, stdout io.Writer) error {
	secret, hash := auth.NewSecret()
	t, created, err := d.CreateFirstToken(ctx, auth.ServiceActor, auth.Token{Name: "initial-admin", Scope: auth.Admin, Hash: hash})
	if err != nil {
		return fmt.Errorf("creating the first admin token: %w", err)
	}
	another := "ratelimitd token create -name NAME -scope admin" + databaseFlag(dbURL)
	if created {
		fmt.Fprintf(stdout, "No token existed, so an admin token was created (id %s). It is shown only this once:\n\n    %s\n\nShould it be lost, this makes another:\n\n    %s\n\n", t.ID, secret, another)
		return nil
	}
	tokens, err := d.ListTokens(ctx)
	if err != nil {
		return fmt.Errorf("reading the tokens: %w", err)
	}
	var admins []auth.Token
	for _, t := range tokens {
		if t.Scope == auth.Admin && t.RevokedAt.IsZero() {
			admins = append(admins, t)
		}
	}
	if len(admins) == 0 {
		fmt.Fprintf(stdout, "No admin token is live: each was revoked, or the tokens are of other scopes. This makes one:\n    %s\n", another)
		return nil
	}
	more := ""
	if len(admins) > 1 {
		more = fmt.Sprintf(", and %d more (ratelimitd token list)", len(admins)-1)
	}
	a := admins[0]
	fmt.Fprintf(stdout, "An admin token exists: %s (id %s, created %s)%s. Its secret was shown only when it was made; this makes another:\n    %s\n",
		a.Name, a.ID, a.CreatedAt.UTC().Format("2006-01-02 15:04 UTC"), more, another)
	return nil
}

// databaseFlag is what a command needs to reach the same database from
// anywhere: the absolute path of a SQLite file, or, as a Postgres URL holds
// a password that is not printed, a reminder.
func databaseFlag(url string) string {
	path, ok := strings.CutPrefix(url, "sqlite:")
	if !ok {
		return " (with this RATELIMIT_DATABASE_URL)"
	}
	arg := "sqlite:" + absPath(path)
	if strings.ContainsFunc(arg, func(r rune) bool { return !strings.ContainsRune(shellSafe, r) }) {
		// Quoted for a POSIX shell, which takes all but ' literally there.
		arg = "'" + strings.ReplaceAll(arg, "'", `'\''`) + "'"
	}
	return " -database-url " + arg
}

// shellSafe are the characters a shell takes literally in an argument.
const shellSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:,@%="

// loadGRPCTLS reads the gRPC listener's certificate, nil when none is
// configured, before anything is bound or written.
func loadGRPCTLS(cfg *config) (*tls.Config, error) {
	if cfg.GRPCAddr == "" || cfg.GRPCTLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.GRPCTLSCert, cfg.GRPCTLSKey)
	if err != nil {
		return nil, fmt.Errorf("the gRPC listener's certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// startGRPC serves Envoy's rate limit service on ln, unless it is nil,
// with TLS when tlsCfg is not nil, and returns what stops it gracefully
// within a context. A failure of the listener ends serve as the HTTP
// server's does, through failed. traced, when not nil, traces the calls.
func startGRPC(cfg *config, ln net.Listener, tlsCfg *tls.Config, lim *limiter.Limiter, keeper *auth.Keeper, srv *api.Server, obs rls.Observer, traced stats.Handler, log *slog.Logger, stdout io.Writer, failed chan<- error) func(context.Context) {
	if ln == nil {
		return func(context.Context) {}
	}
	rc := rls.Config{Limiter: lim, Auth: keeper, Ready: srv.Ready, Observer: obs, TLS: tlsCfg,
		OmitHeaders: !cfg.GRPCResponseHeaders, Logger: log, StatsHandler: traced}
	if !cfg.GRPCAuth {
		rc.Auth = nil
		log.Warn("the gRPC listener accepts calls without a token (RATELIMIT_GRPC_AUTH=none): only the proxy may reach it", "addr", cfg.GRPCAddr)
	}
	scheme := "grpc"
	if tlsCfg != nil {
		scheme = "grpcs"
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
	return gs.Stop
}
