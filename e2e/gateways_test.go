//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// gatewaysDir holds the gateways' configurations, which the tests run as
// they are, filled in as docs/gateways.md tells a user to.
const gatewaysDir = "../deploy/gateways"

// hopAddr is the address of a proxy in front of the gateways, which
// ratelimitd (and Caddy) are told to trust. The gateways reach ratelimitd
// from 127.0.0.1, the only other trusted address; the clients connect from
// the rest of 127/8, which Linux routes to the loopback interface.
const hopAddr = "127.0.255.254"

// gatewayTrust is RATELIMIT_TRUSTED_PROXIES of the service behind the
// gateways.
const gatewayTrust = "127.0.0.1/32," + hopAddr + "/32"

// TestGateways runs nginx, Caddy and HAProxy with the configurations of
// deploy/gateways in front of an upstream that records what reaches it,
// with ratelimitd behind them on the in-process store and on Redis, and
// checks through each gateway what a client gets: exact bursts under
// concurrency, limits keyed on the client's address (from a trusted hop
// and spoofed), on an API key, on the path and on the client's own
// Authorization, overrides taking effect within a second, shadow limits,
// the RateLimit headers on allowed and denied answers; on Redis the fail
// modes with the store down and ratelimitd itself gone, and on the
// in-process store a token that may not decide. The token the gateways
// authenticate with never reaches a client or the upstream.
//
// One ratelimitd and one process of each gateway serve all the subtests
// of a store; each subtest has limits and rules of its own, on bucket
// values (addresses, keys, paths) no other subtest sends.
func TestGateways(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t, store)
			t.Run("gateways", func(t *testing.T) {
				for _, gw := range r.gateways {
					t.Run(gw.name, func(t *testing.T) {
						t.Parallel()
						t.Run("burst", func(t *testing.T) { r.testBurst(t, gw) })
						t.Run("client address", func(t *testing.T) { r.testClientAddress(t, gw) })
						t.Run("api key", func(t *testing.T) { r.testAPIKey(t, gw) })
						t.Run("path", func(t *testing.T) { r.testPath(t, gw) })
						t.Run("authorization", func(t *testing.T) { r.testAuthorization(t, gw) })
						t.Run("override", func(t *testing.T) { r.testOverride(t, gw) })
						t.Run("shadow", func(t *testing.T) { r.testShadow(t, gw) })
					})
				}
			})
			if r.redis != nil {
				t.Run("fail modes", r.testFailModes)
			} else {
				t.Run("token refused", r.testTokenRefused)
			}
		})
	}
}

// gatewayRig is one ratelimitd, the upstream, and a process of each
// gateway in front of them.
type gatewayRig struct {
	svc      *service
	redis    *testenv.RedisProcess // nil on the in-process store
	admin    *client.ClientWithResponses
	token    string
	app      *upstream
	gateways []*gateway
}

func newGatewayRig(t *testing.T, store string) *gatewayRig {
	r := &gatewayRig{app: newUpstream(t)}
	// A Redis call slower than the e2e processes' 100 ms, which a loaded
	// machine makes, would be answered as the fail mode says, and these
	// tests count every request. A stopped Redis refuses at once.
	opts := options{env: []string{"RATELIMIT_TRUSTED_PROXIES=" + gatewayTrust, "RATELIMIT_REDIS_TIMEOUT=2s"}}
	if store == "redis" {
		// A private server, which the fail-mode tests stop.
		r.redis = testenv.RedisServer(t)
		opts.redisURL = "redis://" + r.redis.Addr()
	}
	r.svc = newService(t, "ratelimitd", opts)
	r.admin = r.svc.admin()
	r.token = createToken(t, r.admin, "gateways", client.ScopeDecide)
	env := gatewayEnv{upstream: r.app.addr, ratelimitd: r.svc.addr, token: r.token}
	for _, kind := range gatewayKinds {
		r.gateways = append(r.gateways, startGateway(t, kind, env))
	}
	t.Cleanup(func() { r.app.checkNoToken(t, r.token) })
	return r
}

// testBurst sends 20 requests at once from one client on a limit of burst
// 5: exactly 5 reach the upstream, the others are denied.
func (r *gatewayRig) testBurst(t *testing.T, gw *gateway) {
	subnet := nextSubnet(t)
	r.limitWithRule(t, "remote_address", subnet+"*", client.LimitPut{IDFormat: client.IDFormatIPAddress, Burst: ptr(int64(5)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + testenv.RandomName("burst-")
	const n = 20
	replies := make([]reply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = r.get(gw, subnet+"1", path, nil)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, a := range replies {
		if a.status == http.StatusOK {
			allowed++
			a.wantAllowed(t, true)
		} else {
			a.wantDenied(t)
		}
	}
	if allowed != 5 || r.app.count(path) != 5 {
		t.Errorf("%d requests at once on burst 5: %d allowed, %d reached the upstream; want 5 and 5", n, allowed, r.app.count(path))
	}
}

// testClientAddress limits per client address, 2 requests each: the
// address a trusted hop puts in X-Forwarded-For counts, and the one a
// client writes there itself does not.
func (r *gatewayRig) testClientAddress(t *testing.T, gw *gateway) {
	subnet := nextSubnet(t)
	r.limitWithRule(t, "remote_address", subnet+"*", client.LimitPut{IDFormat: client.IDFormatIPAddress, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + testenv.RandomName("address-")
	via := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }

	// Through the trusted hop, the client is the address it forwards.
	r.sendN(t, gw, hopAddr, path, via(subnet+"7"), 2, 1)
	r.send(t, gw, hopAddr, path, via(subnet+"8")).wantAllowed(t, true)

	// A client naming another address (in both headers a proxy could
	// write) is still limited as itself, and does not spend the bucket
	// of the address it names.
	spoof := http.Header{"X-Forwarded-For": {subnet + "9"}, "X-Real-Ip": {subnet + "9"}}
	r.sendN(t, gw, subnet+"1", path, spoof, 2, 1)
	r.send(t, gw, subnet+"2", path, spoof).wantAllowed(t, true)
	r.send(t, gw, hopAddr, path, via(subnet+"9")).wantAllowed(t, true)
	r.send(t, gw, hopAddr, path, via(subnet+"1")).wantDenied(t)
	if got := r.app.count(path); got != 7 {
		t.Errorf("the upstream got %d requests, want the 7 allowed", got)
	}
}

// testAPIKey limits per value of the X-Api-Key header, from any address;
// requests without the header are not limited by it.
func (r *gatewayRig) testAPIKey(t *testing.T, gw *gateway) {
	tag := testenv.RandomName("key-")
	r.limitWithRule(t, "api_key", tag+"-*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + tag
	key := func(k string) http.Header { return http.Header{"X-Api-Key": {k}} }
	r.send(t, gw, "127.0.0.2", path, key(tag+"-a")).wantAllowed(t, true)
	// A client's own X-Ratelimit-Authorization is replaced by the
	// gateway's, and reaches the upstream no more than the gateway's does;
	// nor does its X-Ratelimit-Degraded.
	h := key(tag + "-a")
	h.Set("X-Ratelimit-Authorization", "Bearer rlt_from_the_client")
	h.Set("X-Ratelimit-Degraded", "true")
	r.send(t, gw, "127.0.0.3", path, h).wantAllowed(t, true)
	r.send(t, gw, "127.0.0.4", path, key(tag+"-a")).wantDenied(t)
	r.send(t, gw, "127.0.0.2", path, key(tag+"-b")).wantAllowed(t, true)
	for range 3 {
		r.send(t, gw, "127.0.0.2", path, nil).wantAllowed(t, false)
	}
	for _, got := range r.app.headers(path) {
		if v := got.Get("X-Ratelimit-Authorization"); v != "" {
			t.Errorf("the upstream got X-Ratelimit-Authorization %q", v)
		}
		if v := got.Get("X-Ratelimit-Degraded"); v != "" {
			t.Errorf("the upstream got X-Ratelimit-Degraded %q with the store up", v)
		}
	}
	if got := r.app.count(path); got != 6 {
		t.Errorf("the upstream got %d requests, want the 6 allowed", got)
	}
}

// testPath limits per path, without the query; the X-Forwarded-Uri and
// X-Original-URI a client sends do not choose the bucket.
func (r *gatewayRig) testPath(t *testing.T, gw *gateway) {
	tag := testenv.RandomName("path-")
	r.limitWithRule(t, "path", "/"+tag+"/*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	a, b, c := "/"+tag+"/a", "/"+tag+"/b", "/"+tag+"/c"
	r.send(t, gw, "127.0.0.2", a+"?page=1", nil).wantAllowed(t, true)
	r.send(t, gw, "127.0.0.3", a+"?page=2", nil).wantAllowed(t, true)
	r.send(t, gw, "127.0.0.4", a, nil).wantDenied(t)
	r.send(t, gw, "127.0.0.2", b, nil).wantAllowed(t, true)
	spoof := http.Header{"X-Forwarded-Uri": {b}, "X-Original-Uri": {b}}
	r.send(t, gw, "127.0.0.2", c, spoof).wantAllowed(t, true)
	r.send(t, gw, "127.0.0.2", c, spoof).wantAllowed(t, true)
	r.send(t, gw, "127.0.0.2", c, spoof).wantDenied(t)
	if got := r.app.count("/" + tag + "/"); got != 5 {
		t.Errorf("the upstream got %d requests, want the 5 allowed", got)
	}
}

// testAuthorization limits per value of the client's own Authorization
// header, which reaches the upstream as the client sent it.
func (r *gatewayRig) testAuthorization(t *testing.T, gw *gateway) {
	tag := testenv.RandomName("auth-")
	r.limitWithRule(t, "authorization", "Bearer "+tag+"-*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + tag
	user := func(u string) http.Header { return http.Header{"Authorization": {"Bearer " + tag + "-" + u}} }
	r.sendN(t, gw, "127.0.0.2", path, user("u1"), 2, 1)
	r.send(t, gw, "127.0.0.2", path, user("u2")).wantAllowed(t, true)
	got := r.app.headers(path)
	if len(got) != 3 {
		t.Fatalf("the upstream got %d requests, want the 3 allowed", len(got))
	}
	for i, want := range []string{"u1", "u1", "u2"} {
		if a := got[i].Get("Authorization"); a != "Bearer "+tag+"-"+want {
			t.Errorf("request %d reached the upstream with Authorization %q, want the client's %q", i, a, "Bearer "+tag+"-"+want)
		}
	}
}

// testOverride raises a bucket's burst over REST while its client is
// denied: the gateway lets it through within a second.
func (r *gatewayRig) testOverride(t *testing.T, gw *gateway) {
	tag := testenv.RandomName("override-")
	name := r.limitWithRule(t, "api_key", tag+"-*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + tag
	key := http.Header{"X-Api-Key": {tag + "-k"}}
	r.sendN(t, gw, "127.0.0.2", path, key, 1, 1)
	createOverride(t, r.admin, client.OverrideCreate{Limit: name, BucketID: tag + "-k", Burst: ptr(int64(10)), Count: ptr(int64(1)), Period: ptr("1h")})
	took := waitFor(t, time.Second, "the override through "+gw.name, func() bool {
		a := r.send(t, gw, "127.0.0.2", path, key)
		if a.status != http.StatusOK {
			a.wantDenied(t)
		}
		return a.status == http.StatusOK
	})
	t.Logf("measured: %s let the overridden bucket through %v after the override was created", gw.name, took.Round(time.Millisecond))
}

// testShadow: a shadow limit that is exceeded blocks nothing.
func (r *gatewayRig) testShadow(t *testing.T, gw *gateway) {
	tag := testenv.RandomName("shadow-")
	r.limitWithRule(t, "api_key", tag+"-*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1)), Count: ptr(int64(1)), Period: ptr("1h"), Shadow: ptr(true)})
	path := "/" + tag
	for range 4 {
		// A shadow limit's decisions are not in the RateLimit headers.
		r.send(t, gw, "127.0.0.2", path, http.Header{"X-Api-Key": {tag + "-k"}}).wantAllowed(t, false)
	}
	if got := r.app.count(path); got != 4 {
		t.Errorf("the upstream got %d requests, want 4", got)
	}
}

// testFailModes stops the store under each fail mode, then ratelimitd
// itself, and checks what each gateway answers a client whose bucket the
// store must be asked about (no denial of it is cached).
func (r *gatewayRig) testFailModes(t *testing.T) {
	tag := testenv.RandomName("fail-")
	r.limitWithRule(t, "api_key", tag+"-*", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(1)), Count: ptr(int64(1)), Period: ptr("1h")})
	path := "/" + tag
	key := func(gw *gateway) http.Header { return http.Header{"X-Api-Key": {tag + "-" + gw.name}} }

	t.Run("store down, open", func(t *testing.T) {
		r.redis.Stop()
		defer r.redis.Start()
		for _, gw := range r.gateways {
			before := r.app.count(path)
			a := r.send(t, gw, "127.0.0.2", path, key(gw))
			if a.status != http.StatusOK {
				t.Errorf("%s: %d %s with the store down in fail mode open, want the upstream's 200", gw.name, a.status, a.body)
				continue
			}
			got := r.app.headers(path)
			if len(got) != before+1 || got[before].Get("X-Ratelimit-Degraded") != "true" {
				t.Errorf("%s: the upstream got %d requests, the last %v; want one with X-Ratelimit-Degraded: true", gw.name, len(got)-before, got[len(got)-1])
			}
		}
	})

	t.Run("store down, closed", func(t *testing.T) {
		r.svc.kill()
		r.svc.env = append(r.svc.env, "RATELIMIT_FAIL_MODE=closed")
		r.svc.start()
		// Each gateway talks to the new process before the store goes.
		for _, gw := range r.gateways {
			waitFor(t, 10*time.Second, gw.name+" asking the restarted ratelimitd", func() bool {
				return r.send(t, gw, "127.0.0.2", "/"+testenv.RandomName("restarted-"), nil).status == http.StatusOK
			})
		}
		r.redis.Stop()
		before := r.app.count(path)
		for _, gw := range r.gateways {
			a := r.send(t, gw, "127.0.0.2", path, key(gw))
			if a.status != http.StatusServiceUnavailable || !positiveSeconds(a.header.Get("Retry-After")) {
				t.Errorf("%s: %d %v %s with the store down in fail mode closed, want 503 with Retry-After", gw.name, a.status, a.header, a.body)
			}
		}
		if got := r.app.count(path) - before; got != 0 {
			t.Errorf("%d requests reached the upstream, want none", got)
		}
	})

	t.Run("ratelimitd gone", func(t *testing.T) {
		r.svc.kill()
		before := r.app.count(path)
		want := map[string]int{"nginx": http.StatusServiceUnavailable, "haproxy": http.StatusServiceUnavailable, "caddy": http.StatusBadGateway}
		for _, gw := range r.gateways {
			if a := r.send(t, gw, "127.0.0.2", path, key(gw)); a.status != want[gw.name] {
				t.Errorf("%s: %d %s with ratelimitd gone, want %d", gw.name, a.status, a.body, want[gw.name])
			}
		}
		if got := r.app.count(path) - before; got != 0 {
			t.Errorf("%d requests reached the upstream, want none", got)
		}
	})
}

// testTokenRefused runs each gateway with a token that may not decide
// (scope support): ratelimitd refuses every call with 403, and no request
// reaches the upstream. nginx and HAProxy answer the client 503; Caddy
// passes ratelimitd's 403 on.
func (r *gatewayRig) testTokenRefused(t *testing.T) {
	support := createToken(t, r.admin, "support", client.ScopeSupport)
	env := gatewayEnv{upstream: r.app.addr, ratelimitd: r.svc.addr, token: support}
	want := map[string]int{"nginx": http.StatusServiceUnavailable, "haproxy": http.StatusServiceUnavailable, "caddy": http.StatusForbidden}
	path := "/" + testenv.RandomName("refused-")
	for _, kind := range gatewayKinds {
		gw := startGateway(t, kind, env)
		if a := r.send(t, gw, "127.0.0.2", path, nil); a.status != want[gw.name] || strings.Contains(fmt.Sprint(a.header)+a.body, support) {
			t.Errorf("%s with a token of scope support: %d %v %q, want %d without the token", gw.name, a.status, a.header, a.body, want[gw.name])
		}
	}
	if got := r.app.count(path); got != 0 {
		t.Errorf("%d requests reached the upstream, want none", got)
	}
}

// limitWithRule creates a limit of a random name and a rule of domain web
// (the one the configurations ask about) mapping the descriptor {key:
// value} onto it, and returns the limit's name.
func (r *gatewayRig) limitWithRule(t *testing.T, key, value string, l client.LimitPut) string {
	t.Helper()
	name := testenv.RandomName("gw_")
	putLimit(t, r.admin, name, l)
	res, err := r.admin.CreateRuleWithResponse(bg, client.RuleCreate{Domain: "web", Descriptor: []client.DescriptorEntry{{Key: key, Value: &value}}, Limit: name})
	if err != nil || res.JSON201 == nil {
		t.Fatalf("POST /v1/rules: %s", describe(res, err))
	}
	return name
}

// subnets hands out the third byte of the loopback /24s of the subtests'
// clients.
var subnets atomic.Int32

// nextSubnet returns "127.0.X." for a /24 of loopback addresses no other
// subtest uses.
func nextSubnet(t *testing.T) string {
	n := 10 + subnets.Add(1)
	if n > 250 {
		t.Fatal("out of loopback /24s for clients")
	}
	return fmt.Sprintf("127.0.%d.", n)
}

// reply is what a client got from a gateway.
type reply struct {
	status int
	header http.Header
	body   string
}

// wantAllowed fails the test unless the upstream answered; with limited,
// a rule matched, and the answer must carry ratelimitd's RateLimit
// headers as each of these gateways puts them on allowed answers.
func (a reply) wantAllowed(t *testing.T, limited bool) {
	t.Helper()
	if a.status != http.StatusOK || !strings.HasPrefix(a.body, "upstream ") {
		t.Errorf("got %d %v %q, want the upstream's 200", a.status, a.header, a.body)
		return
	}
	if got := a.header.Get("RateLimit") != "" && a.header.Get("RateLimit-Policy") != ""; got != limited {
		t.Errorf("allowed answer with RateLimit %q and RateLimit-Policy %q; want them %s", a.header.Get("RateLimit"), a.header.Get("RateLimit-Policy"), map[bool]string{true: "set", false: "absent"}[limited])
	}
}

// wantDenied fails the test unless the answer is a denial: 429 with
// Retry-After, the RateLimit headers and a problem+json body.
func (a reply) wantDenied(t *testing.T) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || !positiveSeconds(a.header.Get("Retry-After")) ||
		a.header.Get("RateLimit") == "" || a.header.Get("RateLimit-Policy") == "" ||
		a.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("got %d %v %q, want 429 with Retry-After, RateLimit, RateLimit-Policy and application/problem+json", a.status, a.header, a.body)
	}
}

// positiveSeconds reports whether v is a whole number of seconds above 0,
// as Retry-After is written.
func positiveSeconds(v string) bool {
	n, err := strconv.Atoi(v)
	return err == nil && n > 0
}

// send makes a GET request of path through gw from the loopback address
// from, with the headers h, and fails the test if it gets no answer or one
// that carries the gateways' token anywhere.
func (r *gatewayRig) send(t *testing.T, gw *gateway, from, path string, h http.Header) reply {
	t.Helper()
	a, err := r.get(gw, from, path, h)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// get is send for a goroutine of the test's: it returns the failure.
func (r *gatewayRig) get(gw *gateway, from, path string, h http.Header) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, gw.url+path, nil)
	if err != nil {
		return reply{}, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := clientFrom(from).Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("GET %s through %s from %s: %w", path, gw.name, from, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return reply{}, fmt.Errorf("GET %s through %s: reading the answer: %w", path, gw.name, err)
	}
	a := reply{status: res.StatusCode, header: res.Header, body: string(body)}
	if strings.Contains(fmt.Sprint(a.header), r.token) || strings.Contains(a.body, r.token) {
		return a, fmt.Errorf("the answer through %s carries the gateways' token: %v %q", gw.name, a.header, a.body)
	}
	return a, nil
}

// sendN sends allowed+denied requests one after the other and checks that
// the first allowed are allowed (by a rule) and the rest denied.
func (r *gatewayRig) sendN(t *testing.T, gw *gateway, from, path string, h http.Header, allowed, denied int) {
	t.Helper()
	for i := range allowed + denied {
		a := r.send(t, gw, from, path, h)
		if i < allowed {
			a.wantAllowed(t, true)
		} else {
			a.wantDenied(t)
		}
	}
}

var (
	clientsMu sync.Mutex
	clients   = map[string]*http.Client{}
)

// clientFrom returns the HTTP client whose connections come from the
// loopback address ip: the gateways see each as a client of its own.
func clientFrom(ip string) *http.Client {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if c, ok := clients[ip]; ok {
		return c
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c := &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 32},
		Timeout:   30 * time.Second,
	}
	clients[ip] = c
	return c
}

// upstream is the application behind the gateways: it answers every
// request 200 with "upstream " and the path, and records the path and
// headers of each.
type upstream struct {
	addr string
	mu   sync.Mutex
	got  []seen
}

// seen is a request the upstream got.
type seen struct {
	path   string
	header http.Header
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u.mu.Lock()
		u.got = append(u.got, seen{req.URL.Path, req.Header.Clone()})
		u.mu.Unlock()
		fmt.Fprintln(w, "upstream", req.URL.Path)
	}))
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

// count returns how many requests of a path beginning with prefix the
// upstream got.
func (u *upstream) count(prefix string) int { return len(u.headers(prefix)) }

// headers returns the headers of the requests of a path beginning with
// prefix that the upstream got, in order.
func (u *upstream) headers(prefix string) []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []http.Header
	for _, s := range u.got {
		if strings.HasPrefix(s.path, prefix) {
			out = append(out, s.header)
		}
	}
	return out
}

// checkNoToken fails the test if any request that reached the upstream
// carried the token.
func (u *upstream) checkNoToken(t *testing.T, token string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, s := range u.got {
		if strings.Contains(fmt.Sprint(s.header), token) {
			t.Errorf("a request of %s reached the upstream with the gateways' token: %v", s.path, s.header)
		}
	}
}

// gatewayEnv is what a user fills a configuration in with, as the
// environment variables the configurations name.
type gatewayEnv struct {
	listen     string // LISTEN_ADDR, 127.0.0.1:port
	upstream   string // UPSTREAM_ADDR
	ratelimitd string // RATELIMITD_ADDR
	token      string // RATELIMITD_TOKEN
}

func (e gatewayEnv) vars() []string {
	return []string{"LISTEN_ADDR=" + e.listen, "UPSTREAM_ADDR=" + e.upstream, "RATELIMITD_ADDR=" + e.ratelimitd, "RATELIMITD_TOKEN=" + e.token}
}

// gatewayKind says how one gateway runs from its configuration.
type gatewayKind struct {
	name string
	// binaries must be on PATH.
	binaries []string
	// command returns the gateway's command, with the configuration
	// filled in from e, and anything it writes in dir, a fresh directory.
	command func(t *testing.T, dir string, e gatewayEnv) *exec.Cmd
}

var gatewayKinds = []gatewayKind{
	{name: "nginx", binaries: []string{"nginx", "envsubst"}, command: nginxCommand},
	{name: "caddy", binaries: []string{"caddy"}, command: caddyCommand},
	{name: "haproxy", binaries: []string{"haproxy"}, command: haproxyCommand},
}

// nginxCommand fills the server block in with envsubst, as
// docs/gateways.md says, and runs it in a main configuration of the
// test's, as a user's /etc/nginx/nginx.conf includes it: one process in
// the foreground, its pid file, temporary files and logs its own.
func nginxCommand(t *testing.T, dir string, e gatewayEnv) *exec.Cmd {
	template, err := os.ReadFile(filepath.Join(gatewaysDir, "nginx", "ratelimitd.conf.template"))
	if err != nil {
		t.Fatal(err)
	}
	sub := exec.Command("envsubst", "$LISTEN_ADDR $UPSTREAM_ADDR $RATELIMITD_ADDR $RATELIMITD_TOKEN")
	sub.Env = append(os.Environ(), e.vars()...)
	sub.Stdin = bytes.NewReader(template)
	conf, err := sub.Output()
	if err != nil {
		t.Fatalf("envsubst: %v", err)
	}
	main := `events {}
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    include ratelimitd.conf;
}
`
	for name, content := range map[string][]byte{"nginx.conf": []byte(main), "ratelimitd.conf": conf} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	return exec.Command("nginx", "-p", dir+"/", "-c", "nginx.conf", "-e", "stderr",
		"-g", "daemon off; master_process off; pid nginx.pid;")
}

// caddyCommand runs the site block, imported into a Caddyfile of the
// test's whose global options turn the admin endpoint off and bind
// loopback only; Caddy's data and configuration directories are dir.
func caddyCommand(t *testing.T, dir string, e gatewayEnv) *exec.Cmd {
	site, err := filepath.Abs(filepath.Join(gatewaysDir, "caddy", "ratelimitd.caddy"))
	if err != nil {
		t.Fatal(err)
	}
	main := "{\n\tadmin off\n\tdefault_bind 127.0.0.1\n}\n\nimport " + site + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(e.listen)
	cmd := exec.Command("caddy", "run", "--adapter", "caddyfile", "--config", filepath.Join(dir, "Caddyfile"), "--pidfile", filepath.Join(dir, "caddy.pid"))
	cmd.Env = append(os.Environ(), e.vars()...)
	cmd.Env = append(cmd.Env, "SITE_ADDRESS=http://:"+port, "TRUSTED_PROXIES="+hopAddr+"/32",
		"HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	return cmd
}

// haproxyCommand runs haproxy.cfg where it is, in the foreground (which
// writes no pid file), without SO_REUSEPORT, so that a port another
// process holds is an error rather than shared.
func haproxyCommand(t *testing.T, dir string, e gatewayEnv) *exec.Cmd {
	cfg, err := filepath.Abs(filepath.Join(gatewaysDir, "haproxy", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("haproxy", "-db", "-dR", "-f", cfg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), e.vars()...)
	return cmd
}

// gateway is a running gateway process.
type gateway struct {
	name string
	url  string
	logs *testenv.LockedBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

// startGateway starts a gateway on a free loopback port and returns once
// it answers HTTP; it is stopped when the test ends, and its log printed
// if the test failed. Without one of its binaries it calls
// testenv.Unavailable.
func startGateway(t *testing.T, kind gatewayKind, e gatewayEnv) *gateway {
	t.Helper()
	for _, b := range kind.binaries {
		if _, err := exec.LookPath(b); err != nil {
			testenv.Unavailable(t, b, err)
		}
	}
	for attempt := 1; ; attempt++ {
		e.listen = "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
		g := &gateway{name: kind.name, url: "http://" + e.listen, logs: &testenv.LockedBuffer{}, done: make(chan struct{})}
		g.cmd = kind.command(t, t.TempDir(), e)
		g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
		// Should the test binary die, so does the gateway.
		g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := g.cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", kind.name, err)
		}
		go func() {
			_ = g.cmd.Wait()
			close(g.done)
		}()
		err := g.waitAnswering()
		if err == nil {
			t.Cleanup(func() {
				g.stop()
				if t.Failed() {
					t.Logf("log of %s:\n%s", g.name, tail(g.logs.String(), 100))
				}
			})
			return g
		}
		g.stop()
		if attempt == 3 || !strings.Contains(strings.ToLower(g.logs.String()), "address already in use") {
			t.Fatalf("%s: %v\n%s", kind.name, err, tail(g.logs.String(), 50))
		}
	}
}

// waitAnswering polls the gateway until it answers an HTTP request, of a
// path no test counts.
func (g *gateway) waitAnswering() error {
	deadline := time.Now().Add(startTimeout)
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		res, err := hc.Get(g.url + "/ready")
		if err == nil {
			res.Body.Close()
			return nil
		}
		select {
		case <-g.done:
			return errors.New("exited before answering")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not answering within %v: %v", startTimeout, err)
		}
	}
}

// stop ends the gateway with SIGTERM, and SIGKILL if it lingers.
func (g *gateway) stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-g.done:
	case <-ctx.Done():
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}
