package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// service is ratelimitd serve running in this test process.
type service struct {
	url    string
	stdout *testenv.LockedBuffer
	stderr *testenv.LockedBuffer
	stop   func() error
}

// getenv serves a fixed environment, where a variable set to "" is set
// and empty, as environ reports it.
func getenv(env map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := env[k]; ok && v == "" {
			return setEmpty
		}
		return env[k]
	}
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startServe runs `ratelimitd serve` with env on a free loopback port and
// waits until it listens. stop shuts it down as SIGTERM would and returns
// what run returned.
func startServe(t *testing.T, env map[string]string) *service {
	t.Helper()
	return startServeWith(t, env, func(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
		return run(ctx, []string{"serve"}, getenv, stdout, stderr)
	})
}

// startServeWith is startServe with the function that serves, so that a
// test can serve on a clock of its own.
func startServeWith(t *testing.T, env map[string]string, serveFn func(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error) *service {
	t.Helper()
	env["RATELIMIT_HTTP_ADDR"] = "127.0.0.1:0"
	if _, ok := env["RATELIMIT_GRPC_ADDR"]; !ok {
		env["RATELIMIT_GRPC_ADDR"] = "127.0.0.1:0"
	}
	if env["RATELIMIT_DATABASE_URL"] == "" {
		env["RATELIMIT_DATABASE_URL"] = "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{stdout: &testenv.LockedBuffer{}, stderr: &testenv.LockedBuffer{}}
	done := make(chan error, 1)
	go func() { done <- serveFn(ctx, getenv(env), s.stdout, s.stderr) }()
	var once sync.Once
	var runErr error
	s.stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = s.stop() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := listening.FindStringSubmatch(s.stdout.String()); m != nil {
			s.url = m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended before listening: %v\nlog: %s", err, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not listen within 30 s\nlog: %s", s.stderr.String())
		}
	}
	return s
}

// call sends a JSON request and returns the status and body.
func (s *service) call(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// waitReady polls /readyz until it answers 200.
func (s *service) waitReady(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := s.call(t, "GET", "/readyz", "", ""); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30 s\nlog: %s", s.stderr.String())
		}
	}
}

// TestFirstRunOnTheEmbeddedDefault is a newcomer's first run: no
// configuration but a database path, an admin token printed once, a
// decision made, and a clean shutdown.
func TestFirstRunOnTheEmbeddedDefault(t *testing.T) {
	s := startServe(t, map[string]string{})
	s.waitReady(t)
	token := regexp.MustCompile(`rlt_[A-Za-z0-9_-]+`).FindString(s.stdout.String())
	if token == "" {
		t.Fatalf("no admin token printed on the first run:\n%s", s.stdout.String())
	}
	if strings.Contains(s.stderr.String(), token) {
		t.Fatal("the first admin token is in the log")
	}
	if code, body := s.call(t, "PUT", "/v1/limits/Logins", token, `{"id_format":"string","burst":2,"count":2,"period":"1m"}`); code != http.StatusCreated {
		t.Fatalf("creating a limit: %d %s", code, body)
	}
	spend := `{"buckets":[{"limit":"Logins","bucket_id":"alice@example.com"}]}`
	var allowed []bool
	for range 3 {
		var got struct{ Allowed bool }
		s.waitFor(t, func() bool {
			code, body := s.call(t, "POST", "/v1/spend", token, spend)
			return code == http.StatusOK && json.Unmarshal([]byte(body), &got) == nil
		})
		allowed = append(allowed, got.Allowed)
	}
	if !allowed[0] || !allowed[1] || allowed[2] {
		t.Fatalf("three spends against a burst of 2: %v", allowed)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if !strings.Contains(s.stderr.String(), `"msg":"stopped"`) {
		t.Fatalf("no clean stop in the log:\n%s", s.stderr.String())
	}
}

// waitFor retries f until it holds: the limit created above reaches the
// snapshot a moment after the write.
func (s *service) waitFor(t *testing.T, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// TestServeOnPostgresAndRedis selects the production backends by
// configuration and keeps every secret out of the log.
func TestServeOnPostgresAndRedis(t *testing.T) {
	pg := testenv.Postgres(t)
	redisURL := testenv.RedisURL(t) // fails in CI, skips elsewhere, when Redis is missing
	secretFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(secretFile, []byte("boot-secret-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, map[string]string{
		"RATELIMIT_DATABASE_URL":         pg,
		"RATELIMIT_REDIS_URL":            redisURL,
		"RATELIMIT_REDIS_PREFIX":         testenv.RandomName("rltest:") + ":",
		"RATELIMIT_BOOTSTRAP_TOKEN_FILE": secretFile,
		"RATELIMIT_FAIL_MODE":            "closed",
	})
	s.waitReady(t)
	code, body := s.call(t, "GET", "/v1/status", "boot-secret-123", "")
	if code != http.StatusOK || !strings.Contains(body, `"store":"redis"`) || !strings.Contains(body, `"database":"postgres"`) || !strings.Contains(body, `"fail_mode":"closed"`) {
		t.Fatalf("status: %d %s", code, body)
	}
	if strings.Contains(s.stderr.String(), "boot-secret-123") {
		t.Fatal("the bootstrap token is in the log")
	}
	if strings.Contains(s.stdout.String(), "rlt_") {
		t.Fatal("a first admin token was created although a bootstrap token is configured")
	}
}

// TestHTTP2WithoutTLS sends a decision and an admin request over one
// HTTP/2 connection without TLS (prior knowledge, as gRPC clients and
// h2load do), and shows that HTTP/1.1 still works on the same port.
func TestHTTP2WithoutTLS(t *testing.T) {
	s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_h2c"})
	s.waitReady(t)
	if code, body := s.call(t, "PUT", "/v1/limits/Logins", "rlt_h2c", `{"id_format":"string","burst":2,"count":2,"period":"1m"}`); code != http.StatusCreated {
		t.Fatalf("creating a limit: %d %s", code, body)
	}
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	h2 := &http.Client{Transport: tr}
	for _, c := range []struct {
		client     *http.Client
		proto      int
		path, body string
	}{
		{h2, 2, "/v1/spend", `{"buckets":[{"limit":"Logins","bucket_id":"alice"}]}`},
		{h2, 2, "/v1/limits/Logins", ""},
		{http.DefaultClient, 1, "/v1/spend", `{"buckets":[{"limit":"Logins","bucket_id":"alice"}]}`},
	} {
		method := http.MethodGet
		if c.body != "" {
			method = http.MethodPost
		}
		req, err := http.NewRequest(method, s.url+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer rlt_h2c")
		req.Header.Set("Content-Type", "application/json")
		res, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.ProtoMajor != c.proto {
			t.Errorf("%s %s: %s %d %s, want HTTP/%d 200", method, c.path, res.Proto, res.StatusCode, body, c.proto)
		}
	}
}

var pprofAt = regexp.MustCompile(`pprof on (http://\S+)`)

// TestDebugListener shows that pprof is served on RATELIMIT_DEBUG_ADDR
// only: not on the API's port, and nowhere when the setting is empty.
func TestDebugListener(t *testing.T) {
	s := startServe(t, map[string]string{"RATELIMIT_DEBUG_ADDR": "127.0.0.1:0", "RATELIMIT_BOOTSTRAP_TOKEN": "rlt_debug"})
	m := pprofAt.FindStringSubmatch(s.stdout.String())
	if m == nil {
		t.Fatalf("no debug listener announced:\n%s", s.stdout.String())
	}
	res, err := http.Get(m[1] + "goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile:") {
		t.Errorf("goroutine profile: %d %.200s", res.StatusCode, body)
	}
	if code, _ := s.call(t, "GET", "/debug/pprof/", "rlt_debug", ""); code != http.StatusNotFound {
		t.Errorf("pprof on the API's port: %d", code)
	}

	off := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_debug"})
	if strings.Contains(off.stdout.String(), "pprof") {
		t.Errorf("a debug listener without RATELIMIT_DEBUG_ADDR:\n%s", off.stdout.String())
	}
}

// TestDebugListenerKeepsSecrets: the command line, which may hold
// -bootstrap-token, is not served, and a listener reachable from other
// hosts is announced with a warning, since no token guards it.
func TestDebugListenerKeepsSecrets(t *testing.T) {
	args := os.Args
	os.Args = append(slices.Clip(args), "-bootstrap-token=rlt_on_the_command_line")
	t.Cleanup(func() { os.Args = args })
	for _, tc := range []struct {
		addr string
		warn bool
	}{{"127.0.0.1:0", false}, {"[::1]:0", false}, {":0", true}, {"0.0.0.0:0", true}} {
		s := startServe(t, map[string]string{"RATELIMIT_DEBUG_ADDR": tc.addr})
		m := pprofAt.FindStringSubmatch(s.stdout.String())
		if m == nil {
			if tc.addr == "[::1]:0" {
				continue // no IPv6 loopback here
			}
			t.Fatalf("%s: no debug listener announced:\n%s", tc.addr, s.stdout.String())
		}
		res, err := http.Get(strings.Replace(m[1], "[::]", "127.0.0.1", 1) + "cmdline")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), "rlt_on_the_command_line") {
			t.Errorf("%s: /debug/pprof/cmdline shows the bootstrap token: %d %q", tc.addr, res.StatusCode, body)
		}
		if warned := strings.Contains(s.stderr.String(), "reachable from other hosts"); warned != tc.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", tc.addr, warned, tc.warn, s.stderr.String())
		}
		if err := s.stop(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigErrorsNameEveryBadValue(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"serve", "-fail-mode", "sometimes"}, getenv(map[string]string{
		"RATELIMIT_HTTP_ADDR":         "nowhere",
		"RATELIMIT_DEBUG_ADDR":        "nowhere",
		"RATELIMIT_SYNC_INTERVAL":     "-1s",
		"RATELIMIT_DATABASE_URL":      "mysql://x",
		"RATELIMIT_REDIS_URL":         "http://redis",
		"RATELIMIT_DENIED_CACHE_SIZE": "many",
		"RATELIMIT_LOG_LEVEL":         "loud",
	}), io.Discard, &stderr)
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, name := range []string{"RATELIMIT_HTTP_ADDR", "RATELIMIT_DEBUG_ADDR", "RATELIMIT_SYNC_INTERVAL", "RATELIMIT_DATABASE_URL", "RATELIMIT_REDIS_URL",
		"RATELIMIT_DENIED_CACHE_SIZE", "RATELIMIT_LOG_LEVEL", "RATELIMIT_FAIL_MODE"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error does not name %s:\n%v", name, err)
		}
	}
}

func TestMaskedConfigHidesSecrets(t *testing.T) {
	for _, dbURL := range []string{"postgres://app:hunter2@db:5432/rl", "postgres://app@db:5432/rl?password=hunter2&sslmode=disable"} {
		c := &config{raw: map[string]string{
			"RATELIMIT_DATABASE_URL":    dbURL,
			"RATELIMIT_REDIS_URL":       "redis://:s3cret@redis:6379",
			"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_abc",
		}}
		m := c.masked()
		for k, v := range m {
			if strings.Contains(v, "hunter2") || strings.Contains(v, "s3cret") || strings.Contains(v, "rlt_abc") {
				t.Errorf("%s shows a secret: %s", k, v)
			}
		}
		if !strings.Contains(m["RATELIMIT_DATABASE_URL"], "db:5432") {
			t.Errorf("the database URL lost its host: %s", m["RATELIMIT_DATABASE_URL"])
		}
	}
	// The token is masked because of its setting, whatever it looks like.
	for _, token := range []string{"sqlite:hunter2", "x://hunter2", "https://user:hunter2@example.com", "hunter2"} {
		c := &config{raw: map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": token, "RATELIMIT_REDIS_URL": "hunter2"}}
		for k, v := range c.masked() {
			if strings.Contains(v, "hunter2") {
				t.Errorf("%s shows a secret: %s", k, v)
			}
		}
	}
}

// TestCommandLine drives the administration commands on one database.
func TestCommandLine(t *testing.T) {
	env := map[string]string{"RATELIMIT_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "rl.db"), "RATELIMIT_LOG_LEVEL": "warn"}
	cli := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, getenv(env), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	mustRun := func(args ...string) string {
		t.Helper()
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return out
	}
	if out := mustRun("migrate"); !strings.Contains(out, "sqlite database at migration") {
		t.Fatalf("migrate: %s", out)
	}
	created := mustRun("token", "create", "-name", "deployer", "-scope", "support")
	id := regexp.MustCompile(`created token (\S+)`).FindStringSubmatch(created)
	if id == nil || !strings.Contains(created, "rlt_") {
		t.Fatalf("token create: %s", created)
	}
	if out := mustRun("token", "list"); !strings.Contains(out, "deployer") || strings.Contains(out, "rlt_") {
		t.Fatalf("token list shows no token or a secret: %s", out)
	}
	mustRun("token", "revoke", id[1])
	if out, err := cli("token", "revoke", id[1]); err == nil {
		t.Fatalf("revoking twice succeeded: %s", out)
	}

	dir := t.TempDir()
	defaults := filepath.Join(dir, "defaults.yaml")
	overrides := filepath.Join(dir, "overrides.yaml")
	if err := os.WriteFile(defaults, []byte("NewOrdersPerAccount:\n  burst: 300\n  count: 300\n  period: 3h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(overrides, []byte("- NewOrdersPerAccount:\n    burst: 600\n    count: 600\n    period: 3h\n    ids: [\"0042\", {id: \"7\", comment: big customer}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := mustRun("import", "-kind", "defaults", "-dry-run", defaults); !strings.Contains(out, "1 created") {
		t.Fatalf("dry run: %s", out)
	}
	mustRun("import", "-kind", "defaults", defaults)
	if out := mustRun("import", "-kind", "overrides", overrides); !strings.Contains(out, "2 created") {
		t.Fatalf("import overrides: %s", out)
	}
	exported := mustRun("export", "-kind", "overrides")
	if !strings.Contains(exported, "42") || !strings.Contains(exported, "big customer") {
		t.Fatalf("export: %s", exported)
	}
	again := filepath.Join(dir, "again.yaml")
	mustRun("export", "-kind", "overrides", "-o", again)
	if out := mustRun("import", again); !strings.Contains(out, "2 unchanged") {
		t.Fatalf("re-importing the export, its kind told from the document, changed something: %s", out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("- NewOrdersPerAccount:\n    burst: 0\n    count: 1\n    period: 1h\n    ids: [\"x\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cli("import", "-kind", "overrides", bad)
	if err == nil || !strings.Contains(out, "bad.yaml:") {
		t.Fatalf("a bad file was accepted or its errors have no line: %v\n%s", err, out)
	}
	if out := mustRun("version"); !strings.HasPrefix(out, "ratelimitd ") {
		t.Fatalf("version: %s", out)
	}
	if _, err := cli("nonsense"); err == nil {
		t.Fatal("an unknown command succeeded")
	}

	// A mistyped command is refused before it opens, creates or migrates
	// any database.
	fresh := filepath.Join(t.TempDir(), "untouched.db")
	env["RATELIMIT_DATABASE_URL"] = "sqlite:" + fresh
	for _, args := range [][]string{
		{"token", "frobnicate"}, {"token", "create", "-name", "x", "-scope", "root"}, {"token", "revoke"},
		{"token", "create", "-name", "x", "-scope", "admin", "extra"}, {"token", "list", "extra"},
		{"import"}, {"import", defaults, "-create", "-kind"}, {"import", "-create", "-kind", "nope", defaults}, {"import", filepath.Join(dir, "missing.yaml")},
		{"export", "-kind", "nope"}, {"export", "-kind", "defaults", "extra"}, {"migrate", "sideways"}, {"serve", "extra"},
	} {
		if out, err := cli(args...); err == nil {
			t.Errorf("%q succeeded: %s", args, out)
		}
		if _, err := os.Stat(fresh); err == nil {
			t.Fatalf("%q created the database", args)
		}
	}
}
