package api_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/memstore"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
	"github.com/ratelimitd/ratelimitd/web"
)

func TestHealth(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := e.do("GET", path, "", nil).expect(t, http.StatusOK).object(t); got["status"] != "ok" {
			t.Errorf("%s: %v", path, got)
		}
	}
	// A path without the method: 405 naming the methods it has.
	if allow := e.do("DELETE", "/v1/limits", e.admin, nil).expect(t, http.StatusMethodNotAllowed).header.Get("Allow"); !strings.Contains(allow, "GET") {
		t.Errorf("Allow: %q", allow)
	}
	e.do("GET", "/v1/nothing", e.admin, nil).expect(t, http.StatusNotFound).problem(t)
	res := e.do("GET", "/openapi.yaml", "", nil).expect(t, http.StatusOK)
	if res.header.Get("Content-Type") != "application/yaml" || !bytes.Equal(res.body, ratelimitd.OpenAPI()) {
		t.Errorf("openapi.yaml: %s", res.header.Get("Content-Type"))
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 1, 1, "1s")
	e.override(obj{"limit": "PerAccount", "bucket_id": "1", "unlimited": true})
	e.waitLimit("PerAccount")
	e.waitSource("PerAccount", "1", "unlimited")
	var st struct {
		Snapshot struct {
			Loaded    bool    `json:"loaded"`
			Version   int64   `json:"version"`
			SyncedAt  *string `json:"synced_at"`
			AgeMS     int64   `json:"age_ms"`
			Limits    int     `json:"limits"`
			Overrides int     `json:"overrides"`
			InStep    bool    `json:"in_step"`
		} `json:"snapshot"`
		Store, Database string
		FailMode        string      `json:"fail_mode"`
		StoreHealth     storeHealth `json:"store_health"`
	}
	e.do("GET", "/v1/status", e.token("d", auth.Decide), nil).expect(t, http.StatusOK).json(t, &st)
	s := st.Snapshot
	if !s.Loaded || s.Version < 2 || s.SyncedAt == nil || s.AgeMS < 0 || s.AgeMS > 60000 || s.Limits != 1 || s.Overrides != 1 || !s.InStep {
		t.Errorf("snapshot %+v", s)
	}
	if st.Store != "memory" || st.Database != "sqlite" || st.FailMode != "closed" {
		t.Errorf("status %+v", st)
	}
	if h := st.StoreHealth; !h.Available || h.Primaries == nil || len(h.Primaries) != 0 || h.PrimaryChanges != 0 || h.PrimaryChangedAt != nil || h.WaitReplicas != 0 {
		t.Errorf("the in-process store's health: %+v", h)
	}
}

// storeHealth is the store_health of /v1/status.
type storeHealth struct {
	Available        bool
	Primaries        []string
	PrimaryChanges   int64      `json:"primary_changes"`
	PrimaryChangedAt *time.Time `json:"primary_changed_at"`
	WaitReplicas     int        `json:"wait_replicas"`
}

// TestStatusStoreHealth: /v1/status pings a Redis store for each request,
// as /readyz does, and reports its topology as the store tells it.
func TestStatusStoreHealth(t *testing.T) {
	rs := testenv.RedisServer(t)
	opts, err := redisstore.ParseURL("redis://" + rs.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewUniversalClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	store := redisstore.New(c, redisstore.Options{Prefix: testenv.RandomName("rltest:") + ":", WaitReplicas: 2})
	changed := time.Date(2026, 11, 27, 10, 0, 0, 0, time.FixedZone("CET", 3600))
	e := newEnv(t, withStore(store), withTopology(func() api.StoreTopology {
		topo := store.Topology()
		// A change as a failover would record it.
		return api.StoreTopology{Primaries: topo.Primaries, PrimaryChanges: 1, PrimaryChangedAt: changed, WaitReplicas: topo.WaitReplicas}
	}))
	health := func() storeHealth {
		var st struct {
			StoreHealth storeHealth `json:"store_health"`
		}
		e.do("GET", "/v1/status", e.admin, nil).expect(t, http.StatusOK).json(t, &st)
		return st.StoreHealth
	}
	h := health()
	if !h.Available || !slices.Equal(h.Primaries, []string{rs.Addr()}) || h.PrimaryChanges != 1 || h.WaitReplicas != 2 ||
		h.PrimaryChangedAt == nil || !h.PrimaryChangedAt.Equal(changed) || h.PrimaryChangedAt.Location() != time.UTC {
		t.Errorf("a Redis store that answers: %+v", h)
	}
	rs.Stop()
	if h := health(); h.Available {
		t.Errorf("a Redis store that is down: %+v", h)
	}
	rs.Start()
	if h := health(); !h.Available {
		t.Errorf("a Redis store back: %+v", h)
	}
}

func TestAdminPage(t *testing.T) {
	web := fstest.MapFS{
		"index.html":     {Data: []byte("<!doctype html><title>admin</title>")},
		"app.js":         {Data: []byte("console.log(1)")},
		"style.css":      {Data: []byte("body{}")},
		"img/logo.svg":   {Data: []byte("<svg/>")},
		"img/nested/a.x": {Data: []byte("x")},
	}
	e := newEnv(t, withWeb(web))
	noRedirect := &http.Client{Transport: e.client.Transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	res, err := noRedirect.Get(e.url + "/admin")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/admin/" {
		t.Errorf("/admin: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
	for path, ct := range map[string]string{
		"/admin/":              "text/html; charset=utf-8",
		"/admin/app.js":        "text/javascript; charset=utf-8",
		"/admin/style.css":     "text/css; charset=utf-8",
		"/admin/img/logo.svg":  "image/svg+xml",
		"/admin/index.html":    "text/html; charset=utf-8",
		"/admin/missing.js":    "application/problem+json",
		"/admin/img":           "application/problem+json",
		"/admin/img/":          "application/problem+json",
		"/admin/%2e%2e/secret": "application/problem+json",
	} {
		res := e.do("GET", path, "", nil)
		if got := res.header.Get("Content-Type"); got != ct {
			t.Errorf("%s: %d %q, want %q", path, res.status, got, ct)
		}
		if strings.HasPrefix(ct, "application/problem") {
			res.expect(t, http.StatusNotFound)
		} else {
			res.expect(t, http.StatusOK)
		}
		csp := res.header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") ||
			res.header.Get("X-Content-Type-Options") != "nosniff" || res.header.Get("Referrer-Policy") != "no-referrer" ||
			res.header.Get("Cache-Control") != "no-cache" {
			t.Errorf("%s: security headers %v", path, res.header)
		}
	}
	// A path that climbs out is refused before it reaches the files.
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("GET /admin/../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	raw, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw.Body.Close()
	if raw.StatusCode != http.StatusNotFound {
		t.Errorf("climbing out: %d", raw.StatusCode)
	}

	// Without files, there is no page.
	bare := newEnv(t)
	bare.do("GET", "/admin/", "", nil).expect(t, http.StatusNotFound).problem(t)
}

func TestMetrics(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.putLimit("Shadowed", obj{"id_format": "reg_id", "burst": 1, "count": 1, "period": "1h", "shadow": true})
	e.waitLimit("Shadowed")
	e.decided("spend", e.admin, bucket("PerAccount", "1234567", 1))                                   // allowed
	e.decided("spend", e.admin, bucket("PerAccount", "1234567", 3))                                   // near_limit
	e.decided("spend", e.admin, bucket("PerAccount", "1234567", 3))                                   // denied
	e.decided("check", e.admin, bucket("Shadowed", "1234567", 2), bucket("PerAccount", "8888888", 0)) // shadow_denied, allowed
	e.decide("spend", e.admin, bucket("Nope", "1234567", 1)).expect(t, http.StatusUnprocessableEntity)
	e.do("GET", "/no/such/path/1234567", "", nil).expect(t, http.StatusNotFound)

	body := string(e.do("GET", "/metrics", "", nil).expect(t, http.StatusOK).body)
	for _, want := range []string{
		`ratelimitd_decisions_total{frontend="http",limit="PerAccount",op="spend",result="allowed"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="PerAccount",op="spend",result="near_limit"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="PerAccount",op="spend",result="denied"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="Shadowed",op="check",result="shadow_denied"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="PerAccount",op="check",result="allowed"} 1`,
		`ratelimitd_http_request_duration_seconds_count{code="200",method="POST",route="/v1/spend"} 3`,
		`ratelimitd_http_request_duration_seconds_count{code="422",method="POST",route="/v1/spend"} 1`,
		`ratelimitd_http_request_duration_seconds_count{code="201",method="PUT",route="/v1/limits/:name"} 2`,
		`ratelimitd_store_errors_total 0`,
		`ratelimitd_denied_cache_hits_total`,
		`ratelimitd_snapshot_version`,
		`ratelimitd_snapshot_limits 2`,
		`ratelimitd_snapshot_overrides 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s", want)
		}
	}
	if strings.Contains(body, "1234567") || strings.Contains(body, "8888888") {
		t.Error("the metrics hold a bucket id or a raw path")
	}
	age := regexp.MustCompile(`(?m)^ratelimitd_snapshot_age_seconds (\S+)$`).FindStringSubmatch(body)
	if age == nil {
		t.Fatal("no snapshot age")
	}
	if v, err := strconv.ParseFloat(age[1], 64); err != nil || v < 0 || v > time.Minute.Seconds() {
		t.Errorf("snapshot age %s", age[1])
	}
}

func TestDegradedMetrics(t *testing.T) {
	e := newEnv(t, failOpen(), withStore(storetest.Down{Err: errStoreDown}))
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.waitLimit("PerAccount")
	e.decided("spend", e.admin, bucket("PerAccount", "1", 1))
	body := string(e.do("GET", "/metrics", "", nil).expect(t, http.StatusOK).body)
	for _, want := range []string{
		`ratelimitd_decisions_total{frontend="http",limit="PerAccount",op="spend",result="degraded"} 1`,
		`ratelimitd_store_errors_total 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s", want)
		}
	}
}

// TestDatabaseDown shows that a database outage is a 503 for the routes
// that need it, and that decisions go on from the snapshot.
func TestDatabaseDown(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.waitLimit("PerAccount")
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/limits", nil},
		{"GET", "/v1/limits/PerAccount", nil},
		{"PUT", "/v1/limits/Other", obj{"id_format": "string", "burst": 1, "count": 1, "period": "1s"}},
		{"POST", "/v1/overrides", obj{"limit": "PerAccount", "bucket_id": "1", "unlimited": true}},
		{"GET", "/v1/overrides?bucket_id=1", nil},
		{"POST", "/v1/tokens", obj{"name": "n", "scope": "admin"}},
		{"GET", "/v1/export?kind=defaults", nil},
	} {
		res := e.do(r.method, r.path, e.admin, r.body).expect(t, http.StatusServiceUnavailable)
		if p := res.problem(t); res.header.Get("Retry-After") == "" || strings.Contains(p.Detail, "sql") {
			t.Errorf("%s %s: %+v %v", r.method, r.path, p, res.header)
		}
	}
	if r, _ := e.decided("spend", e.admin, bucket("PerAccount", "1", 1)); !r.Allowed {
		t.Errorf("decision while the database is down: %+v", r)
	}
	e.do("GET", "/readyz", "", nil).expect(t, http.StatusOK)
}

// TestAdminPageFiles serves the real page: every file answers 200 with a
// media type openapi.yaml lists (the transport checks it).
func TestAdminPageFiles(t *testing.T) {
	files := web.Files()
	e := newEnv(t, withWeb(files))
	err := fs.WalkDir(files, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		e.do("GET", "/admin/"+name, "", nil).expect(t, http.StatusOK)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := e.do("GET", "/admin/", "", nil).expect(t, http.StatusOK); !contains(res.body, "<html") {
		t.Errorf("the page: %.200s", res.body)
	}
}

// pingCtxStore answers a ping as a remote store does when its caller
// gives up first: with the context's error.
type pingCtxStore struct{ limiter.Store }

func (s pingCtxStore) Ping(ctx context.Context) error { return ctx.Err() }

// TestReadyCallerGone: a readiness probe whose caller went away, or whose
// own deadline passed (a gRPC health check's), before the store answered
// learned nothing of the store: it is not logged as a store that does not
// answer.
func TestReadyCallerGone(t *testing.T) {
	var logs testenv.LockedBuffer
	ms := memstore.New(memstore.Options{})
	t.Cleanup(ms.Close)
	e := newEnv(t, withStore(pingCtxStore{ms}), withLog(&logs))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.srv.Ready(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Ready, the caller gone: %v", err)
	}
	if strings.Contains(logs.String(), "store does not answer") {
		t.Errorf("the log: %s", logs.String())
	}
	if err := e.srv.Ready(context.Background()); err != nil {
		t.Errorf("Ready: %v", err)
	}
}
