package api_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/loader"
)

// env is a whole service on a private database and store, served on a
// loopback port. Every response a test receives through it is validated
// against openapi.yaml.
type env struct {
	t   testing.TB
	url string
	srv *api.Server
	// handler is what the server serves: the edge, with every route.
	handler http.Handler
	db      *db.DB
	limiter *limiter.Limiter
	loader  *loader.Loader
	keeper  *auth.Keeper
	clock   *testenv.Clock
	client  *http.Client
	// admin is the bootstrap token.
	admin string
}

type envOptions struct {
	postgres bool
	// noSync answers writes without waiting for the snapshot; silent
	// keeps the database's change notifications from the loader.
	noSync, silent bool
	failOpen       bool
	store          limiter.Store
	topology       func() api.StoreTopology
	web            fs.FS
	// log receives the service's log; discarded when nil.
	log io.Writer
}

// envOption changes how newEnv builds the service.
type envOption func(*envOptions)

// onPostgres runs the service on a fresh Postgres database instead of SQLite.
func onPostgres() envOption { return func(o *envOptions) { o.postgres = true } }

// failOpen answers allowed and degraded when the store fails.
func failOpen() envOption { return func(o *envOptions) { o.failOpen = true } }

// withStore replaces the in-process store.
func withStore(s limiter.Store) envOption { return func(o *envOptions) { o.store = s } }

// withTopology has /v1/status report the store's primaries from f.
func withTopology(f func() api.StoreTopology) envOption {
	return func(o *envOptions) { o.topology = f }
}

// noSync answers writes without waiting for the snapshot to hold them, so
// that only the database's notifications bring changes to decisions.
func noSync() envOption { return func(o *envOptions) { o.noSync = true } }

// silent keeps the database's change notifications from the loader, which
// then sees a change only when a write waits for it.
func silent() envOption { return func(o *envOptions) { o.silent = true } }

// withLog writes the service's log to w.
func withLog(w io.Writer) envOption { return func(o *envOptions) { o.log = w } }

// withWeb serves the admin page's files from web.
func withWeb(web fs.FS) envOption { return func(o *envOptions) { o.web = web } }

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	var o envOptions
	for _, opt := range opts {
		opt(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(cmp.Or(o.log, io.Discard), nil))
	dbURL := "sqlite:" + t.TempDir() + "/ratelimitd.db"
	if o.postgres {
		dbURL = testenv.Postgres(t)
	}
	d, err := db.Open(ctx, dbURL, db.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c := testenv.NewClock(time.Now().Truncate(time.Millisecond))
	if o.store == nil {
		// The sweeper reads the service's clock, so that it never drops a
		// bucket the clock of the decisions still sees in use.
		ms := memstore.New(memstore.Options{Now: c.Now})
		t.Cleanup(ms.Close)
		o.store = ms
	}
	// The limiter tells telemetry of leases, as serve wires them: the
	// hook reaches tel, made below, before any decision is made.
	var tel *telemetry.Telemetry
	lim := limiter.New(limiter.Config{Store: o.store, Now: c.Now, FailOpen: o.failOpen, DeniedCacheSize: 1000, Logger: log,
		ObserveLease: func(limit string, e limiter.LeaseEvent, n int64) { tel.ObserveLease(limit, e, n) }})
	var src loader.Source = d
	if o.silent {
		src = silentSource{d}
	}
	admin, _ := auth.NewSecret()
	keeper := auth.NewKeeper(d.ListTokens, admin, log)
	ld := loader.New(loader.Config{Source: src, Target: lim, Tokens: keeper.Refresh, SyncInterval: time.Hour, MaxBackoff: 50 * time.Millisecond, Logger: log})
	// Read the tokens once before serving, so that /readyz is ready as soon
	// as the snapshot is.
	if err := keeper.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = ld.Run(ctx) }()
	wg.Go(func() { lim.RunLeaseSweeper(ctx, limiter.LeaseSweepInterval) })

	sync := ld.Sync
	if o.noSync {
		sync = nil
	}
	// The loader reads the real clock, and so does the snapshot age.
	tel = telemetry.New(telemetry.Config{Stats: lim.Stats, Status: ld.Status})
	srv := api.New(api.Config{
		Limits: d, Overrides: d, Rules: d, Tokens: d, Files: d, Limiter: lim, Auth: keeper, Sync: sync, Status: ld.Status,
		Metrics: tel.Handler(), OpenAPI: ratelimitd.OpenAPI(),
		StoreName: "memory", DatabaseName: d.Engine(), FailOpen: o.failOpen, StoreTopology: o.topology, Logger: log, Web: o.web,
	})
	buckets := decide.New(decide.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("http"), Now: c.Now})
	handler := edge.New(edge.Config{Observer: tel.Front("http"), Logger: log}, append(buckets.Routes(), srv.Routes()...)...)
	hs := httptest.NewUnstartedServer(handler)
	hs.Config.MaxHeaderBytes = edge.ServerHeaderBytes
	hs.Start()
	t.Cleanup(func() {
		hs.Close()
		cancel()
		wg.Wait()
		_ = d.Close()
	})
	select {
	case <-ld.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the loader did not load")
	}
	return &env{t: t, url: hs.URL, srv: srv, handler: handler, db: d, limiter: lim, loader: ld, keeper: keeper, clock: c,
		client: &http.Client{Transport: testenv.Validating(t, http.DefaultTransport, 1)}, admin: admin}
}

// silentSource is a database that sends no change notifications.
type silentSource struct{ *db.DB }

// Watch waits for ctx to end without a notification.
func (silentSource) Watch(ctx context.Context, _ func()) error {
	<-ctx.Done()
	return ctx.Err()
}

// withT returns a copy of e that reports to t, for a fuzz target's
// iterations, which may not report to the target's testing.F.
func (e *env) withT(t *testing.T) *env {
	c := *e
	c.t = t
	c.client = &http.Client{Transport: testenv.Validating(t, http.DefaultTransport, 1)}
	return &c
}

// response is a received response with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into v, failing the test when it does not fit.
func (r *response) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

// problem decodes a problem+json body.
func (r *response) problem(t testing.TB) problem.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json; body %s", ct, r.body)
	}
	var p problem.Problem
	r.json(t, &p)
	return p
}

// do sends a request with token (none when empty); body is JSON-encoded
// unless it is a string or []byte, which are sent as they are.
func (e *env) do(method, path, token string, body any, header ...string) *response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return &response{status: res.StatusCode, header: res.Header, body: raw}
}

// token creates a token of scope through the API and returns its secret.
func (e *env) token(name string, scope auth.Scope) string {
	e.t.Helper()
	res := e.do("POST", "/v1/tokens", e.admin, map[string]any{"name": name, "scope": scope})
	if res.status != http.StatusCreated {
		e.t.Fatalf("creating a token: %d %s", res.status, res.body)
	}
	var created struct{ Token string }
	res.json(e.t, &created)
	return created.Token
}
