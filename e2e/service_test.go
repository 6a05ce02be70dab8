//go:build linux

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// startTimeout bounds how long a process may take to listen and be ready,
// on a loaded machine.
const startTimeout = 30 * time.Second

// redisTimeout is RATELIMIT_REDIS_TIMEOUT of every process: short, so that
// a fault shows quickly, and the bound every decision must keep to.
const redisTimeout = 100 * time.Millisecond

// options configure a service process.
type options struct {
	// databaseURL is RATELIMIT_DATABASE_URL; a fresh Postgres database
	// when empty.
	databaseURL string
	// redisURL is RATELIMIT_REDIS_URL; the in-process store when empty.
	redisURL string
	// redisPrefix is RATELIMIT_REDIS_PREFIX; a random one when empty, so
	// that processes share buckets only when they are given one prefix.
	redisPrefix string
	// failMode is RATELIMIT_FAIL_MODE; open when empty.
	failMode string
	// bootstrap is RATELIMIT_BOOTSTRAP_TOKEN; a random one when empty.
	// Processes that should accept the same token share it.
	bootstrap string
	// gogc is GOGC; unset when empty, whatever the tests' environment
	// says, so that every process runs as a default install does.
	gogc string
	// env holds further settings (KEY=value), after the others.
	env []string
}

// service is one ratelimitd process, started from the binary TestMain
// built. It can be killed and started again on the same address; its
// JSON log (stderr) is kept across restarts and printed when the test
// fails.
type service struct {
	t    *testing.T
	name string
	env  []string
	// addr is host:port, chosen by the first start and kept after.
	addr string
	url  string
	// bootstrap is the admin token the process accepts from start.
	bootstrap string
	logs      *testenv.LockedBuffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	err  error         // cmd.Wait's, once done is closed
}

// newService starts ratelimitd serve with opts and returns once it is
// ready (GET /readyz answers 200). It is killed when the test ends.
func newService(t *testing.T, name string, opts options) *service {
	t.Helper()
	if opts.databaseURL == "" {
		opts.databaseURL = testenv.Postgres(t)
	}
	if opts.failMode == "" {
		opts.failMode = "open"
	}
	if opts.redisPrefix == "" {
		opts.redisPrefix = testenv.RandomName("e2e:") + ":"
	}
	if opts.bootstrap == "" {
		opts.bootstrap = testenv.RandomName("bootstrap-")
	}
	s := &service{t: t, name: name, bootstrap: opts.bootstrap, logs: &testenv.LockedBuffer{}}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RATELIMIT_") && !strings.HasPrefix(kv, "GOGC=") {
			s.env = append(s.env, kv)
		}
	}
	if opts.gogc != "" {
		s.env = append(s.env, "GOGC="+opts.gogc)
	}
	s.env = append(s.env,
		"RATELIMIT_DATABASE_URL="+opts.databaseURL,
		"RATELIMIT_REDIS_URL="+opts.redisURL,
		"RATELIMIT_REDIS_PREFIX="+opts.redisPrefix,
		"RATELIMIT_REDIS_TIMEOUT="+redisTimeout.String(),
		"RATELIMIT_FAIL_MODE="+opts.failMode,
		"RATELIMIT_BOOTSTRAP_TOKEN="+opts.bootstrap,
		"RATELIMIT_SHUTDOWN_TIMEOUT=5s",
	)
	s.env = append(s.env, opts.env...)
	t.Cleanup(func() {
		s.kill()
		s.checkLog()
		if t.Failed() {
			t.Logf("log of %s:\n%s", s.name, tail(s.logs.String(), 200))
		}
	})
	s.start()
	return s
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// start runs the process and waits until it is ready; on the first start
// it listens on a free port, afterwards on the same one.
func (s *service) start() {
	s.t.Helper()
	addr := "127.0.0.1:0"
	if s.addr != "" {
		addr = s.addr
	}
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(append([]string(nil), s.env...), "RATELIMIT_HTTP_ADDR="+addr, "RATELIMIT_GRPC_ADDR=127.0.0.1:0")
	cmd.Stderr = s.logs
	// Should the test binary die, so does the service.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		s.t.Fatalf("starting %s: %v", s.name, err)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(done)
	}()
	found := make(chan string, 1)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case u := <-found:
		s.url = u
		pu, err := url.Parse(u)
		if err != nil {
			s.t.Fatalf("%s printed an address that does not parse: %q", s.name, u)
		}
		s.addr = pu.Host
	case <-done:
		s.t.Fatalf("%s exited before listening: %v\n%s", s.name, s.exitErr(), tail(s.logs.String(), 50))
	case <-time.After(startTimeout):
		s.t.Fatalf("%s did not listen within %v\n%s", s.name, startTimeout, tail(s.logs.String(), 50))
	}
	s.waitReady()
}

// waitReady polls /readyz until it answers 200.
func (s *service) waitReady() {
	s.t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		res, err := hc.Get(s.url + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s not ready within %v (last: %v)\n%s", s.name, startTimeout, statusOrErr(res, err), tail(s.logs.String(), 50))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL, as an OOM killer or a lost machine would, and waits
// until the process is gone. Killing a stopped process does nothing.
func (s *service) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// terminate sends SIGTERM and waits for the process to exit, and returns
// how it exited.
func (s *service) terminate() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(startTimeout):
		s.t.Fatalf("%s did not exit within %v of SIGTERM", s.name, startTimeout)
	}
	return s.exitErr()
}

func (s *service) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// checkLog fails the test for what must never be in the log, whatever the
// fault: an internal error (a 500, a recovered panic included) or, in a
// race-enabled build, a data race.
func (s *service) checkLog() {
	for line := range strings.SplitSeq(s.logs.String(), "\n") {
		switch {
		case strings.Contains(line, "WARNING: DATA RACE"):
			s.t.Errorf("%s: a data race (see its log)", s.name)
		case strings.Contains(line, `"status":500`):
			s.t.Errorf("%s answered 500: %s", s.name, line)
		case strings.HasPrefix(line, "panic:"), strings.HasPrefix(line, "fatal error:"):
			s.t.Errorf("%s crashed: %s", s.name, line)
		}
	}
}

// client returns a client of the process that authenticates with token
// (none when empty) and checks every response against openapi.yaml. Each
// client has its own connections.
func (s *service) client(token string) *client.ClientWithResponses {
	return newClient(s.t, s.url, token, 1)
}

// admin returns a client with the bootstrap token.
func (s *service) admin() *client.ClientWithResponses { return s.client(s.bootstrap) }

// newClient returns a generated client of the service at base. It checks
// one response in every validateEvery against openapi.yaml, and the first
// of every route and status always; load generators check a sample, so
// that checking does not take the CPU the service needs.
func newClient(t testing.TB, base, token string, validateEvery int) *client.ClientWithResponses {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	return newClientOn(t, base, token, validateEvery, tr)
}

// newClientOn is newClient over the transport tr, for a test that closes
// its idle connections.
func newClientOn(t testing.TB, base, token string, validateEvery int, tr *http.Transport) *client.ClientWithResponses {
	hc := &http.Client{Transport: testenv.Validating(t, timed(tr), validateEvery), Timeout: 30 * time.Second}
	c, err := client.NewClientWithResponses(base, client.WithHTTPClient(hc),
		client.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			if token != "" {
				r.Header.Set("Authorization", "Bearer "+token)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// metrics reads the gauges named from /metrics: series without labels,
// such as go_goroutines and process_open_fds.
func (s *service) metrics(names ...string) map[string]float64 {
	s.t.Helper()
	res, err := http.Get(s.url + "/metrics")
	if err != nil {
		s.t.Fatalf("%s /metrics: %v", s.name, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		s.t.Fatalf("%s /metrics: %d %v", s.name, res.StatusCode, err)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		for _, want := range names {
			if name == want {
				v, err := strconv.ParseFloat(value, 64)
				if err != nil {
					s.t.Fatalf("%s /metrics: %q: %v", s.name, line, err)
				}
				out[name] = v
			}
		}
	}
	for _, want := range names {
		if _, ok := out[want]; !ok {
			s.t.Fatalf("%s /metrics has no %s", s.name, want)
		}
	}
	return out
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d lines left out]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

func statusOrErr(res *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return res.Status
}

// ptr returns a pointer to v, for the generated client's optional fields.
func ptr[T any](v T) *T { return &v }
