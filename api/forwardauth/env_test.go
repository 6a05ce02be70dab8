package forwardauth_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/forwardauth"
	"github.com/ratelimitd/ratelimitd/api/problem"
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

// engine is a database and a store the route runs on.
type engine struct {
	name            string
	postgres, redis bool
}

var engines = []engine{{"sqlite+memory", false, false}, {"postgres+redis", true, true}}

type envOptions struct {
	failOpen bool
	store    limiter.Store
	// trusted are the trusted proxies; loopback when nil.
	trusted []netip.Prefix
}

// env is one replica: a database, a loader, a Limiter and the route on a
// loopback port, whose answers are checked against openapi.yaml.
type env struct {
	t      testing.TB
	db     *db.DB
	loader *loader.Loader
	reg    *prometheus.Registry
	url    string
	client *http.Client
	admin  string
	keeper *auth.Keeper
}

func newEnv(t testing.TB, eng engine, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	url := "sqlite:" + t.TempDir() + "/ratelimitd.db"
	if eng.postgres {
		url = testenv.Postgres(t)
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
		store = redisstore.New(testenv.Redis(t), redisstore.Options{Prefix: testenv.RandomName("fa-") + ":", Timeout: 5 * time.Second})
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
	trusted := o.trusted
	if trusted == nil {
		trusted = clientip.Loopback
	}
	h := forwardauth.New(forwardauth.Config{Limiter: lim, Auth: keeper, Observer: tel.Front("forward_auth"), Clients: clientip.New(trusted)})
	hs := httptest.NewServer(edge.New(edge.Config{Observer: tel.Front("http"), Logger: log}, h.Routes()...))
	var wg sync.WaitGroup
	wg.Go(func() { _ = ld.Run(ctx) })
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
	return &env{t: t, db: d, loader: ld, reg: reg, url: hs.URL, admin: admin, keeper: keeper,
		client: &http.Client{Transport: testenv.Validating(t, http.DefaultTransport, 1)}}
}

func (e *env) sync() {
	e.t.Helper()
	if err := e.loader.Sync(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) limit(l limiter.Limit) {
	e.t.Helper()
	if _, _, err := e.db.PutLimit(context.Background(), "test", l); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

// rule creates a rule of domain and the entries (key, value pairs; an
// empty value matches any).
func (e *env) rule(domain, limit string, kv ...string) limiter.Rule {
	e.t.Helper()
	r := limiter.Rule{Domain: domain, Limit: limit}
	for i := 0; i < len(kv); i += 2 {
		r.Descriptor = append(r.Descriptor, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	r, err := e.db.CreateRule(context.Background(), "test", r)
	if err != nil {
		e.t.Fatal(err)
	}
	e.sync()
	return r
}

// answer is a received answer, its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// problem decodes a problem+json body.
func (a answer) problem(t testing.TB) problem.Problem {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d, content type %q, want a problem; body %s", a.status, ct, a.body)
	}
	var p problem.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// fields lists the fields a problem names.
func (a answer) fields(t testing.TB) []string {
	var out []string
	for _, f := range a.problem(t).Errors {
		out = append(out, f.Field)
	}
	return out
}

// call sends a forward-auth call of method to path (with its query) with
// the gateway's token and headers, given as name, value pairs.
func (e *env) call(method, path string, kv ...string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-Ratelimit-Authorization", "Bearer "+e.admin)
	for i := 0; i < len(kv); i += 2 {
		if strings.EqualFold(kv[i], "Host") {
			req.Host = kv[i+1]
			continue
		}
		req.Header.Add(kv[i], kv[i+1])
	}
	return e.do(req)
}

// raw sends a GET call as bytes, so that its headers may hold what Go's
// client refuses to send; it returns the status and body.
func (e *env) raw(path string, kv ...string) (int, string) {
	e.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	b.WriteString("GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Ratelimit-Authorization: Bearer " + e.admin + "\r\n")
	for i := 0; i < len(kv); i += 2 {
		b.WriteString(kv[i] + ": " + kv[i+1] + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		e.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

func (e *env) do(req *http.Request) answer {
	e.t.Helper()
	res, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: body}
}

// get is a GET call.
func (e *env) get(path string, kv ...string) answer {
	e.t.Helper()
	return e.call(http.MethodGet, path, kv...)
}

// metric returns the value of a sample of the registry, as the text
// format writes it ("name{labels}"), 0 when there is none.
func (e *env) metric(sample string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			e.t.Fatal(err)
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var v float64
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				e.t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

func perMinute(name string, f limiter.IDFormat, burst int64) limiter.Limit {
	return limiter.Limit{Name: name, IDFormat: f, Params: limiter.Params{Burst: burst, Count: burst, Period: time.Minute}}
}
