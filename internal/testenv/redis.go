package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultRedisAddr is the shared server used when RATELIMIT_TEST_REDIS_ADDR
// is not set.
const defaultRedisAddr = "127.0.0.1:6379"

// readyTimeout bounds how long a redis-server may take to answer PING, or a
// new cluster to report cluster_state:ok.
const readyTimeout = 30 * time.Second

// Redis returns a client of the shared server at RATELIMIT_TEST_REDIS_ADDR,
// closed when the test ends. Tests share its keyspace, so each works under
// its own key prefix (RandomName). Like production clients it lets context
// deadlines bound every network wait. Without a server it calls
// Unavailable: a skip on a developer's machine, a failure in CI.
func Redis(t testing.TB) redis.UniversalClient {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  Getenv("RATELIMIT_TEST_REDIS_ADDR", defaultRedisAddr),
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		Unavailable(t, "redis", err)
	}
	return c
}

// RedisURL returns the URL of the shared server, for a service under test,
// after checking as Redis does that it answers.
func RedisURL(t testing.TB) string {
	t.Helper()
	Redis(t)
	return "redis://" + Getenv("RATELIMIT_TEST_REDIS_ADDR", defaultRedisAddr)
}

// RedisCluster returns the addresses of the masters of a Redis Cluster of
// three masters and no replicas, started from the installed redis-server
// on the first call and shared by every later test of the binary, since
// creating a cluster takes seconds. Its processes and files go when the
// test binary exits, however it exits. Tests share its keyspace and work
// under their own key prefixes.
func RedisCluster(t testing.TB) []string {
	t.Helper()
	addrs, err := sharedCluster()
	if err != nil {
		if missing, ok := errors.AsType[*exec.Error](err); ok {
			Unavailable(t, missing.Name, err)
		}
		t.Fatalf("starting a Redis Cluster: %v", err)
	}
	return addrs
}

// sharedCluster starts the binary's cluster once and remembers the outcome,
// a failure included, so that every test reports the same error quickly.
var sharedCluster = sync.OnceValues(startCluster)

// startCluster starts the cluster, again on fresh ports when another
// process (test binaries run in parallel) took one of the free ports before
// a node could bind it.
func startCluster() ([]string, error) {
	for range 2 {
		addrs, err := clusterOnFreePorts()
		if err == nil || !strings.Contains(err.Error(), "Address already in use") {
			return addrs, err
		}
	}
	return clusterOnFreePorts()
}

func clusterOnFreePorts() ([]string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(6) // a client port and a cluster bus port per node
	if err != nil {
		return nil, err
	}
	var (
		addrs []string
		nodes []*server
	)
	fail := func(err error) ([]string, error) {
		for _, n := range nodes {
			n.stop()
		}
		return nil, err
	}
	for i := range 3 {
		// The watchdog removes the directory when the binary exits:
		// nothing else would, since the cluster outlives every test.
		dir, err := os.MkdirTemp("", "ratelimitd-cluster-")
		if err != nil {
			return fail(err)
		}
		n, err := startServer(bin, ports[2*i], dir, true,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(ports[2*i+1]),
			"--cluster-node-timeout", "5000")
		if err != nil {
			_ = os.RemoveAll(dir)
			return fail(err)
		}
		nodes = append(nodes, n)
		addrs = append(addrs, n.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out))
	}
	for _, addr := range addrs {
		if err := waitClusterOK(ctx, addr); err != nil {
			return fail(err)
		}
	}
	return addrs, nil
}

// waitClusterOK waits until the node at addr sees every slot served.
func waitClusterOK(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster node %s not ok within %v: %v %q", addr, readyTimeout, err, info)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RedisProcess is a private redis-server for fault tests: the test can
// stall it, kill it and bring it back on the same address, which the shared
// server must never suffer.
type RedisProcess struct {
	t   testing.TB
	bin string
	dir string
	// port stays the same across restarts so that clients reconnect.
	port int
	// srv is the running process, nil while stopped.
	srv *server
}

// RedisServer starts a private redis-server on a free loopback port, with
// no persistence, and kills it when the test ends. It returns once the
// server answers PING. Without the redis-server binary it calls
// Unavailable.
func RedisServer(t testing.TB) *RedisProcess {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server", err)
	}
	p := &RedisProcess{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(p.Stop)
	// Another process can take a free port before the server binds it;
	// a fresh port then succeeds.
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		p.port = ports[0]
		srv, err := startServer(bin, p.port, p.dir, false)
		if err == nil {
			p.srv = srv
			return p
		}
		if attempt == 3 {
			t.Fatalf("starting redis-server: %v", err)
		}
	}
}

// Addr returns the server's host:port, the same after a restart.
func (p *RedisProcess) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// Pause stalls the server (SIGSTOP): connections stay open and nothing is
// answered, like a server stuck in a long command or a lost network path.
func (p *RedisProcess) Pause() { p.signal(syscall.SIGSTOP) }

// Resume lets a paused server go on (SIGCONT).
func (p *RedisProcess) Resume() { p.signal(syscall.SIGCONT) }

func (p *RedisProcess) signal(sig os.Signal) {
	p.t.Helper()
	if p.srv == nil {
		p.t.Fatalf("redis-server %s is stopped; cannot send %v", p.Addr(), sig)
	}
	if err := p.srv.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("redis-server %s: %v: %v", p.Addr(), sig, err)
	}
}

// Stop kills the server (SIGKILL, no shutdown), paused or not, and waits
// until it has exited; its data is lost. Stopping a stopped server does
// nothing.
func (p *RedisProcess) Stop() {
	if p.srv != nil {
		p.srv.stop()
		p.srv = nil
	}
}

// Start restarts a stopped server on the same port, empty, and returns once
// it answers PING.
func (p *RedisProcess) Start() {
	p.t.Helper()
	if p.srv != nil {
		p.t.Fatalf("redis-server %s is already running", p.Addr())
	}
	srv, err := startServer(p.bin, p.port, p.dir, false)
	if err != nil {
		p.t.Fatalf("restarting redis-server: %v", err)
	}
	p.srv = srv
}

// server is one running redis-server with its watchdog.
type server struct {
	addr string
	cmd  *exec.Cmd
	// watchdog is a shell that kills the server, and removes its
	// directory if asked to, when its standard input closes: when stop
	// closes release, or when the test binary exits in any way, a crash
	// or a test timeout included, so that no server outlives the tests.
	watchdog *exec.Cmd
	release  io.Closer
	// exited is closed when the server's output ends, that is when it has
	// exited; log holds that output and may be read only after exited is
	// closed.
	exited chan struct{}
	log    bytes.Buffer
}

// watchdogScript runs as sh -c watchdogScript sh PID [DIR]. It ignores
// SIGINT, which an interrupted go test sends to the whole process group, so
// that it still cleans up after the binary.
const watchdogScript = `trap '' INT; read _; kill -KILL "$1" 2>/dev/null; [ -z "$2" ] || rm -rf "$2"`

// startServer starts redis-server on 127.0.0.1:port in dir, without
// persistence, and waits until it answers PING. With removeDir, the
// watchdog removes dir after killing the server.
func startServer(bin string, port int, dir string, removeDir bool, extra ...string) (*server, error) {
	s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan struct{})}
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
	}, extra...)
	s.cmd = exec.Command(bin, args...)
	// The server writes to a pipe of ours, never to the test binary's
	// output, which go test waits on; the end of the pipe tells that the
	// server exited without reaping it (see stop).
	out, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	err = s.cmd.Start()
	w.Close()
	if err != nil {
		out.Close()
		return nil, err
	}
	go func() {
		_, _ = io.Copy(&s.log, out)
		out.Close()
		close(s.exited)
	}()

	wdArgs := []string{"-c", watchdogScript, "sh", strconv.Itoa(s.cmd.Process.Pid)}
	if removeDir {
		wdArgs = append(wdArgs, dir)
	}
	s.watchdog = exec.Command("sh", wdArgs...)
	stdin, err := s.watchdog.StdinPipe()
	if err == nil {
		err = s.watchdog.Start()
	}
	if err != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		_ = s.cmd.Wait()
		return nil, fmt.Errorf("starting the watchdog of redis-server: %w", err)
	}
	s.release = stdin

	if err := s.waitReady(); err != nil {
		s.stop()
		return nil, fmt.Errorf("redis-server on %s: %w\n%s", s.addr, err, s.log.String())
	}
	return s, nil
}

// waitReady polls PING until the server answers, exits or readyTimeout
// passes.
func (s *server) waitReady() error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %w", readyTimeout, err)
		}
		select {
		case <-s.exited:
			return errors.New("exited before answering PING")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop kills the server and waits for it. The server is reaped only after
// the watchdog has exited: until then its pid cannot name another process,
// so the watchdog's kill can never hit a stranger.
func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.release.Close()
	_ = s.watchdog.Wait()
	<-s.exited
	_ = s.cmd.Wait()
}

// FreePort returns a loopback port that was free a moment ago, for a
// process the test starts. Another process can take it before that one
// binds it, so the caller tries again on a fresh port when its process
// finds the address in use.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	return ports[0]
}

// freePorts returns n distinct loopback ports that were free a moment ago;
// the listeners stay open until all are chosen so that none repeats.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
