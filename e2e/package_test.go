//go:build linux

package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/client/ratelimit"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// packageTransport is the transport of the Go package's clients in these
// tests: it counts the HTTP requests made, checks every request body
// against openapi.yaml, and, with answers set, every answer too
// (testenv.Validating), so that the package's hand-written encoder and
// decoder and the contract are held to each other. The fault tests'
// answers are the faults', not the service's: they check requests only.
func packageTransport(t *testing.T, requests *atomic.Int64, answers bool) http.RoundTripper {
	contract := testenv.OpenAPI(t)
	var next http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
	if answers {
		next = testenv.Validating(t, next, 1)
	}
	return testenv.RoundTripper(func(req *http.Request) (*http.Response, error) {
		requests.Add(1)
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if err := contract.CheckRequest(req, body); err != nil {
			t.Errorf("%v\nbody: %s", err, body)
		}
		return next.RoundTrip(req)
	})
}

// newPackageClient returns a client of the Go package for base, whose
// requests go through tr. Unless cfg says otherwise, a call waits up to
// 10s: the tests that use it count exact answers, which a fail-mode answer
// on a busy machine would spoil.
func newPackageClient(t *testing.T, base, token string, tr http.RoundTripper, cfg ratelimit.Config) *ratelimit.Client {
	t.Helper()
	cfg.URL, cfg.Token = base, token
	cfg.HTTPClient = &http.Client{Transport: tr}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	c, err := ratelimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGoPackage drives the real service, on the in-process store and on
// Redis, through the Go package for services (client/ratelimit): the
// middleware and coalesced spends admit exactly a burst among 64 callers,
// the spends sharing requests and each caller getting its own answer, and
// a lease outlives its ttl while renewed and reports its end when the
// service dies.
func TestGoPackage(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var opts options
			if store == "redis" {
				opts.redisURL = testenv.RedisURL(t)
			}
			svc := newService(t, "ratelimitd", opts)
			admin := svc.admin()
			for _, name := range []string{"PerClient", "PerCaller"} {
				putLimit(t, admin, name, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(burst)), Count: ptr(int64(1)), Period: ptr("1h")})
			}
			putLimit(t, admin, "Jobs", client.LimitPut{IDFormat: client.IDFormatString, Kind: ptr(client.LimitKindConcurrency),
				Burst: ptr(int64(1)), Period: ptr("1s")})
			token := createToken(t, admin, "service", client.ScopeDecide)
			decide := svc.client(token)
			for _, name := range []string{"PerClient", "PerCaller", "Jobs"} {
				waitKnown(t, decide, name, "probe")
			}

			t.Run("middleware", func(t *testing.T) { middlewareExact(t, svc, token) })
			t.Run("coalesced", func(t *testing.T) { coalescedExact(t, svc, token) })
			t.Run("lease", func(t *testing.T) { leaseRenewed(t, svc, token, decide) })
			// Last: the service dies.
			t.Run("lease of a dead service", func(t *testing.T) { leaseOfDeadService(t, svc, token) })
		})
	}
}

// burst is the burst of the limits the 64 callers share.
const burst = 20

// callers is how many goroutines call at once.
const callers = 64

// middlewareExact sends 64 requests at once through the middleware, all
// with one key, to a real HTTP server: exactly burst reach the handler,
// the rest are 429s with Retry-After and the RateLimit headers.
func middlewareExact(t *testing.T, svc *service, token string) {
	var requests atomic.Int64
	c := newPackageClient(t, svc.url, token, packageTransport(t, &requests, true), ratelimit.Config{})
	var served atomic.Int64
	srv := httptest.NewServer(ratelimit.Middleware(c, ratelimit.Rule{Limit: "PerClient", Key: ratelimit.Header("X-Client")})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) })))
	defer srv.Close()

	var mu sync.Mutex
	codes := map[int]int{}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			req, err := http.NewRequest("GET", srv.URL, nil)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-Client", "middleware")
			<-start
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			if res.StatusCode == http.StatusTooManyRequests &&
				(res.Header.Get("Retry-After") == "" || res.Header.Get("RateLimit") == "" || res.Header.Get("RateLimit-Policy") != `"PerClient";q=20;w=72000`) {
				t.Errorf("a 429 without its headers: %v", res.Header)
			}
			mu.Lock()
			codes[res.StatusCode]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if codes[http.StatusOK] != burst || codes[http.StatusTooManyRequests] != callers-burst || served.Load() != burst {
		t.Errorf("answers %v, %d served; want %d allowed and %d denied", codes, served.Load(), burst, callers-burst)
	}
	t.Logf("measured: 64 requests through the middleware made %d requests to ratelimitd", requests.Load())
}

// coalescedExact makes 64 Spend calls at once, each on the shared bucket
// and a bucket of its own: exactly burst are allowed, the allowed ones
// were told each a different count of tokens left (so each got its own
// answer), each answer names its caller's own bucket, and the calls shared
// fewer requests than there were calls. Local denials are off, so that
// every call reaches ratelimitd.
func coalescedExact(t *testing.T, svc *service, token string) {
	var requests, carried atomic.Int64
	c := newPackageClient(t, svc.url, token, packageTransport(t, &requests, true), ratelimit.Config{NoLocalDenials: true,
		Hooks: ratelimit.Hooks{Request: func(calls int, _ time.Duration, _ error) { carried.Add(int64(calls)) }}})
	results := make([]ratelimit.Result, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			r, err := c.Spend(bg, ratelimit.Bucket{Limit: "PerClient", ID: "coalesced", Cost: 1},
				ratelimit.Bucket{Limit: "PerCaller", ID: fmt.Sprint("caller-", i), Cost: 1})
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
			results[i] = r
		})
	}
	close(start)
	wg.Wait()
	var left []int64
	for i, r := range results {
		if len(r.Decisions) != 2 || r.Decisions[0].BucketID != "coalesced" || r.Decisions[1].BucketID != fmt.Sprint("caller-", i) {
			t.Fatalf("call %d was answered for other buckets: %+v", i, r)
		}
		if r.Allowed {
			left = append(left, r.Decisions[0].Remaining)
		} else if r.Decisions[0].Allowed || r.Decisions[0].Reason != "limited" || r.RetryAfter <= 0 {
			t.Errorf("call %d, denied: %+v", i, r)
		}
	}
	slices.Sort(left)
	want := make([]int64, burst)
	for i := range want {
		want[i] = int64(i)
	}
	if !slices.Equal(left, want) {
		t.Errorf("the allowed calls were told %v tokens left, want each of 0 to %d once", left, burst-1)
	}
	if n := requests.Load(); n >= callers || carried.Load() != callers {
		t.Errorf("%d calls went in %d requests (carrying %d calls): they did not share requests", callers, n, carried.Load())
	}
	t.Logf("measured: 64 concurrent Spend calls went in %d requests", requests.Load())
}

// leaseRenewed holds a lease of a 1s ttl for 2.5s: renewed, it still holds
// the bucket's one unit, so that another acquire is denied; released, the
// unit is free.
func leaseRenewed(t *testing.T, svc *service, token string, decide *client.ClientWithResponses) {
	var requests atomic.Int64
	c := newPackageClient(t, svc.url, token, packageTransport(t, &requests, true), ratelimit.Config{})
	job := ratelimit.Bucket{Limit: "Jobs", ID: "renewed", Cost: 1}
	r, err := c.Acquire(bg, time.Second, job)
	if err != nil || !r.Allowed || r.Lease == nil || r.Lease.ID() == "" {
		t.Fatalf("acquire: %+v, %v", r, err)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := r.Lease.Err(); err != nil {
		t.Fatalf("the lease ended: %v", err)
	}
	if d := check(t, decide, "Jobs", "renewed", 0); d.Held == nil || *d.Held != 1 {
		t.Errorf("2.5s after an acquire of ttl 1s, the bucket holds %v units, want 1", d.Held)
	}
	if again, err := c.Acquire(bg, time.Second, job); err != nil || again.Allowed {
		t.Errorf("a second acquire while the lease is held: %+v, %v", again, err)
	}
	if err := r.Lease.Release(bg); err != nil {
		t.Fatal(err)
	}
	if d := check(t, decide, "Jobs", "renewed", 0); d.Held == nil || *d.Held != 0 {
		t.Errorf("after the release the bucket holds %v units, want 0", d.Held)
	}
}

// leaseOfDeadService kills the service while a lease is held: the
// renewals fail, and the lease ends when its ttl has passed, saying so.
func leaseOfDeadService(t *testing.T, svc *service, token string) {
	var requests atomic.Int64
	c := newPackageClient(t, svc.url, token, packageTransport(t, &requests, true), ratelimit.Config{})
	r, err := c.Acquire(bg, time.Second, ratelimit.Bucket{Limit: "Jobs", ID: "dead", Cost: 1})
	if err != nil || !r.Allowed || r.Lease == nil {
		t.Fatalf("acquire: %+v, %v", r, err)
	}
	killed := time.Now()
	svc.kill()
	select {
	case <-r.Lease.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the lease of a dead service did not end within 30s")
	}
	if !errors.Is(r.Lease.Err(), ratelimit.ErrLeaseExpired) {
		t.Errorf("the lease's Err: %v, want ErrLeaseExpired", r.Lease.Err())
	}
	t.Logf("measured: a lease of ttl 1s ended %v after its service was killed", time.Since(killed).Round(time.Millisecond))
}

// faultFront stands between the Go package and the service and answers
// for it as told: a server error, garbage, or the service's own answer cut
// off in the middle; else it passes the request on.
type faultFront struct {
	target string
	mode   atomic.Value // string: "", "5xx", "garbage", "mid-answer"
}

func (f *faultFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	mode, _ := f.mode.Load().(string)
	switch mode {
	case "5xx":
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>502 Bad Gateway</html>")
		return
	case "garbage":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"results":[{"allowed":"yes"}]}`)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, f.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	answer, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if mode == "mid-answer" {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(answer))
		buf.Write(answer[:len(answer)/2])
		buf.Flush()
		conn.Close()
		return
	}
	w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
	w.WriteHeader(res.StatusCode)
	w.Write(answer)
}

// TestGoPackageFaults puts a proxy on a loopback listener the test
// controls, and the fault front behind it, between the Go package and the
// real service, and fails the service every way: down, slow past the
// deadline, a server error, garbage, the connection closed in the middle
// of the answer. Failing open and closed, every call ends within a
// generous bound of its deadline with the fail mode's answer, never
// allowed together with an error; the breaker opens, and once the fault
// is gone, a probe closes it.
func TestGoPackageFaults(t *testing.T) {
	t.Parallel()
	svc := newService(t, "ratelimitd", options{})
	admin := svc.admin()
	putLimit(t, admin, "PerClient", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1_000_000)), Count: ptr(int64(1_000_000)), Period: ptr("1s")})
	token := createToken(t, admin, "service", client.ScopeDecide)
	waitKnown(t, svc.client(token), "PerClient", "probe")

	front := &faultFront{target: svc.url}
	frontSrv := httptest.NewServer(front)
	t.Cleanup(frontSrv.Close)
	u, err := url.Parse(frontSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)

	faults := []struct {
		name        string
		start, stop func()
	}{
		{"down", proxy.Down, proxy.Up},
		{"slow", proxy.Stall, proxy.Resume},
		{"5xx", func() { front.mode.Store("5xx") }, func() { front.mode.Store("") }},
		{"garbage", func() { front.mode.Store("garbage") }, func() { front.mode.Store("") }},
		{"mid-answer", func() { front.mode.Store("mid-answer") }, func() { front.mode.Store("") }},
	}
	const deadline = 100 * time.Millisecond
	for _, fault := range faults {
		for _, open := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/open=%v", fault.name, open), func(t *testing.T) {
				var requests atomic.Int64
				var breaker []bool
				var mu sync.Mutex
				c := newPackageClient(t, "http://"+proxy.Addr(), token, packageTransport(t, &requests, false), ratelimit.Config{
					Timeout: deadline, FailOpen: open, BreakerFailures: 3, BreakerCooldown: 200 * time.Millisecond,
					Hooks: ratelimit.Hooks{Breaker: func(open bool) { mu.Lock(); breaker = append(breaker, open); mu.Unlock() }}})
				// A first call makes a connection, so that the fault meets
				// one in use as well as new ones. (On a busy machine a call
				// may miss its deadline even so: it is tried again.)
				waitFor(t, 10*time.Second, "a call answered before the fault", func() bool {
					r, err := c.Spend(bg, ratelimit.Bucket{Limit: "PerClient", ID: "faults", Cost: 1})
					return err == nil && r.Allowed && !r.Degraded
				})
				fault.start()
				var slowest atomic.Int64
				for range 4 {
					var wg sync.WaitGroup
					for i := range 8 {
						wg.Go(func() {
							start := time.Now()
							r, err := c.Spend(bg, ratelimit.Bucket{Limit: "PerClient", ID: fmt.Sprint("faults-", i), Cost: 1})
							took := time.Since(start)
							for old := slowest.Load(); int64(took) > old && !slowest.CompareAndSwap(old, int64(took)); old = slowest.Load() {
							}
							// A generous bound: only a call that waited on
							// something other than its deadline exceeds it.
							if took > deadline+5*time.Second {
								t.Errorf("a call took %v with a deadline of %v", took, deadline)
							}
							checkFailMode(t, open, r, err)
						})
					}
					wg.Wait()
				}
				mu.Lock()
				opened := slices.Equal(breaker, []bool{true})
				mu.Unlock()
				if !opened {
					t.Errorf("the breaker's changes during the fault: %v, want it open", breaker)
				}
				fault.stop()
				waitFor(t, 10*time.Second, "the breaker to close after the fault", func() bool {
					r, err := c.Spend(bg, ratelimit.Bucket{Limit: "PerClient", ID: "after", Cost: 1})
					return err == nil && r.Allowed && !r.Degraded
				})
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(breaker, []bool{true, false}) {
					t.Errorf("the breaker's changes: %v, want it opened then closed", breaker)
				}
				t.Logf("measured: %s, open=%v: the slowest of 32 calls with a deadline of %v took %v", fault.name, open, deadline,
					time.Duration(slowest.Load()).Round(time.Millisecond))
			})
		}
	}
}

// checkFailMode fails the test unless r, err is the fail mode's answer.
func checkFailMode(t *testing.T, open bool, r ratelimit.Result, err error) {
	t.Helper()
	if r.Allowed && err != nil {
		t.Errorf("allowed together with an error: %+v, %v", r, err)
	}
	switch {
	case open && (err != nil || !r.Allowed || !r.Degraded):
		t.Errorf("failing open: %+v, %v; want allowed, degraded", r, err)
	case !open && (!errors.Is(err, ratelimit.ErrUnavailable) || r.Allowed):
		t.Errorf("failing closed: %+v, %v; want ErrUnavailable", r, err)
	}
}
