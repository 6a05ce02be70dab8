//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// The limits every service of TestFailover spends, none of which refills
// during a test: a rate limit (one token a day), a calendar quota (a
// year) and a concurrency limit whose leases live an hour.
const (
	foBurst = 90
	foQuota = 45
	foCalls = 45
	// foPace is each worker's time between requests: with two spenders, a
	// quota spender and an acquirer per service, four services on two
	// topologies stay well within what the machine serves.
	foPace = 40 * time.Millisecond
	// foLag is how long the primary's replicas are stopped before it
	// dies: the replication lag of the failover, long enough that
	// decisions fall in it.
	foLag = 300 * time.Millisecond
)

// TestFailover kills the Redis primary that holds the buckets, with
// SIGKILL, under concurrent spends, quota spends and acquires, on a
// Sentinel set (a primary, two replicas, three Sentinels) and on a Cluster
// (three primaries with a replica each; the primary of the slot dies). Four
// services share each topology: fail mode open and closed, each without
// and with RATELIMIT_REDIS_WAIT_REPLICAS=1, with the default timeouts.
// Just before the death the primary's replicas stop and lose their links
// to it for foLag, as a congested or partitioned network would do it, so
// that the failover has a replication lag to forget, deterministically:
// the writes made in it exist only on the primary.
//
// Every answer must be a decision or the fail mode's (open: allowed,
// degraded; closed: 503 with Retry-After), and the service must decide
// normally again without a restart once a replica is promoted (on the
// Cluster, whose shard then has no replica, the dead primary is started
// again as an orchestrator would, and rejoins as the new primary's
// replica). Each service spends its limits to the end; then:
//
//   - without the option, the decisions admitted beyond each limit are at
//     most those answered between the moment the replicas were known to
//     hold every earlier write (a marker written and WAITed for) and the
//     primary's death: a failover forgets at most the replication lag;
//   - with it, none (fewer than the limit, even: a take not acknowledged
//     in time is answered by the fail mode, yet spent on the primary): no
//     take answered while the replicas were stopped, and every lease
//     granted is still held after.
//
// Every lease granted is renewed at the end: one the failover forgot is
// 404 and counted in ratelimitd_lease_renewals_not_found_total, and the
// renewals change nothing the bucket holds (nothing was recreated).
// /readyz and /v1/status say 503 and unavailable during the failover, and
// after it /v1/status names the promoted replica; the switch is one log
// line and ratelimitd_store_primary_changes_total. The figures are logged
// as "measured:" lines; none is asserted but the bounds above.
func TestFailover(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		set := testenv.NewRedisSentinel(t)
		testFailover(t, failoverSetup{name: "sentinel", url: set.URL(), primary: set.Primary, replicas: set.Replicas})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		rc := testenv.NewRedisReplicatedCluster(t)
		tag := testenv.RandomName("fo")
		primary, replica := rc.Shard(t, "{"+tag+"}")
		survivor := rc.Primaries[slices.IndexFunc(rc.Primaries, func(p *testenv.RedisProcess) bool { return p != primary })]
		testFailover(t, failoverSetup{name: "cluster", url: rc.URL(), tag: tag, primary: primary, replicas: []*testenv.RedisProcess{replica},
			// The shard is left without a replica, and the services that
			// wait for one can take nothing until the dead primary is
			// back, as the new primary's replica.
			afterPromotion: func(t *testing.T) {
				waitPromoted(t, survivor, replica)
				primary.Start()
			}})
	})
}

// failoverSetup is a topology whose primary a test kills.
type failoverSetup struct {
	name string
	// url is RATELIMIT_REDIS_URL.
	url string
	// tag, when not empty, is the hash tag of every service's prefix:
	// their keys then share one slot, which primary serves.
	tag      string
	primary  *testenv.RedisProcess
	replicas []*testenv.RedisProcess
	// afterPromotion, when not nil, runs after the kill.
	afterPromotion func(t *testing.T)
}

// foService is a service of TestFailover and what it saw.
type foService struct {
	name string
	svc  *service
	mode string
	wait int
	c    *client.ClientWithResponses
	work *foWork
	// ready and status watch /readyz and /v1/status.
	ready  *readiness
	status *statusWatch
}

func testFailover(t *testing.T, fs failoverSetup) {
	db, bootstrap := testenv.Postgres(t), testenv.RandomName("bootstrap-")
	var svcs []*foService
	for _, mode := range []string{"open", "closed"} {
		for _, wait := range []int{0, 1} {
			name := fmt.Sprintf("%s-%s-wait%d", fs.name, mode, wait)
			prefix := testenv.RandomName(name+"-") + ":"
			if fs.tag != "" {
				prefix = "{" + fs.tag + "}:" + prefix
			}
			// The default timeouts, as production runs.
			opts := options{databaseURL: db, redisURL: fs.url, redisPrefix: prefix, failMode: mode, bootstrap: bootstrap,
				env: []string{"RATELIMIT_REDIS_TIMEOUT=250ms", "RATELIMIT_REDIS_WAIT_REPLICAS=" + strconv.Itoa(wait)}}
			svcs = append(svcs, &foService{name: name, svc: newService(t, name, opts), mode: mode, wait: wait})
		}
	}
	admin := svcs[0].svc.admin()
	putLimit(t, admin, "FoSpends", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(foBurst)), Count: ptr(int64(1)), Period: ptr("24h")})
	putLimit(t, admin, "FoQuota", client.LimitPut{IDFormat: client.IDFormatString, Calendar: ptr(client.CalendarYear), Count: ptr(int64(foQuota))})
	putLimit(t, admin, "FoCalls", client.LimitPut{IDFormat: client.IDFormatString, Kind: ptr(client.LimitKindConcurrency), Burst: ptr(int64(foCalls)), Period: ptr("1h")})
	token := createToken(t, admin, "failover", client.ScopeDecide)
	for _, s := range svcs {
		s.c = newClient(t, s.svc.url, token, 50)
		for _, limit := range []string{"FoSpends", "FoQuota", "FoCalls"} {
			waitKnown(t, s.c, limit, "warm")
		}
	}
	for _, s := range svcs {
		s.ready, s.status = watchReadiness(t, s.svc), watchStatus(t, s.c)
		s.work = startFoWork(t, s.c)
	}
	waitFor(t, 30*time.Second, "a third of each limit spent on every service", func() bool {
		for _, s := range svcs {
			if s.work.allowed(foSpend) < foBurst/3 || s.work.allowed(foQuotaSpend) < foQuota/3 || s.work.allowed(foAcquire) < foCalls/3 {
				return false
			}
		}
		return true
	})

	// Everything answered before synced is on the replicas. Then they
	// stop, and the primary drops its links to them: what it writes
	// from then on is on it alone, not even in a socket's buffer that a
	// replica would read when it resumes.
	synced := markReplicated(t, fs.primary, "{"+fs.tag+"}:failover-marker", len(fs.replicas))
	for _, r := range fs.replicas {
		r.Pause()
	}
	dropReplicas(t, fs.primary)
	pausedAt := time.Now()
	time.Sleep(foLag)
	killedAt := time.Now()
	fs.primary.Stop()
	for _, r := range fs.replicas {
		r.Resume()
	}
	resumedAt := time.Now()
	for _, s := range svcs {
		s.work.killed.Store(true)
	}
	if fs.afterPromotion != nil {
		fs.afterPromotion(t)
	}
	for _, s := range svcs {
		s.work.waitSpent(t, s.name, 90*time.Second)
	}
	t.Logf("measured: failover %s: the replicas stopped %v after the marker, the primary killed %v after that, the replicas resumed %v after the kill",
		fs.name, pausedAt.Sub(synced).Round(time.Millisecond), killedAt.Sub(pausedAt).Round(time.Millisecond), resumedAt.Sub(killedAt).Round(time.Millisecond))

	var promoted []string
	for _, r := range fs.replicas {
		promoted = append(promoted, r.Addr())
	}
	for _, s := range svcs {
		t.Run(s.name, func(t *testing.T) {
			checkFailover(t, s, fs.primary.Addr(), promoted, failoverTimes{synced: synced, paused: pausedAt, killed: killedAt, resumed: resumedAt})
		})
	}
}

// failoverTimes are the moments of a failover: the replicas known to hold
// every earlier write, stopped, the primary killed, the replicas resumed.
type failoverTimes struct{ synced, paused, killed, resumed time.Time }

// checkFailover checks and reports what one service saw of the failover.
func checkFailover(t *testing.T, s *foService, primary string, replicas []string, at failoverTimes) {
	samples := s.work.halt()
	want := degraded
	if s.mode == "closed" {
		want = unavailable
	}
	// Every answer is a decision or the fail mode's.
	var abnormal []sample
	for _, kind := range foKinds {
		for _, x := range samples[kind] {
			switch x.answer {
			case normal:
			case want:
				abnormal = append(abnormal, x)
			default:
				t.Errorf("a %s answered %v (%s); want a decision or %v", kind, x.answer, x.what, want)
			}
		}
	}

	// Over-admission, per limit: what was admitted beyond it against what
	// was answered in the replication lag.
	var figures []string
	limits := map[string]int{foSpend: foBurst, foQuotaSpend: foQuota, foAcquire: foCalls}
	for _, kind := range foKinds {
		admitted, lagged, inPause := 0, 0, 0
		for _, x := range samples[kind] {
			if x.answer != normal || !x.allowed {
				continue
			}
			admitted++
			if x.end().After(at.synced) && x.start.Before(at.killed) {
				lagged++
			}
			// Started once the replicas had surely stopped, before they
			// came back.
			if x.start.After(at.paused.Add(50*time.Millisecond)) && x.start.Before(at.resumed) {
				inPause++
			}
		}
		over := admitted - limits[kind]
		figures = append(figures, fmt.Sprintf("%s %d beyond %d (%d answered in the lag)", kind, over, limits[kind], lagged))
		switch {
		case s.wait == 0 && over > lagged:
			t.Errorf("%s: %d admitted beyond the limit of %d, more than the %d answered in the replication lag", kind, over, limits[kind], lagged)
		case s.wait > 0 && over > 0:
			// Fewer is expected: a take the replicas did not acknowledge
			// is answered by the fail mode, and stays on the primary
			// when the primary survives it.
			t.Errorf("%s: %d admitted beyond the limit of %d with the replicas' acknowledgement, want none", kind, over, limits[kind])
		case s.wait > 0 && inPause != 0:
			t.Errorf("%s: %d takes answered while the replicas could acknowledge nothing", kind, inPause)
		}
	}

	// Every lease granted is renewed: those the failover forgot are 404,
	// and the renewals change nothing the bucket holds. (It may hold
	// more than the leases renewed: an acquire answered by the fail mode
	// after its script ran holds its unit until it expires.)
	held := func() int64 {
		d := check(t, s.c, "FoCalls", "acct", 0)
		if d.Held == nil {
			t.Fatalf("a check of a concurrency bucket without held: %+v", d)
		}
		return *d.Held
	}
	heldBefore := held()
	renewed, forgotten := 0, 0
	for _, id := range s.work.leaseIDs() {
		// A renewal is a write that waits for the replicas, when the
		// service does: on a loaded machine one may be late, and the fail
		// mode answers; another attempt tells.
		for attempt := 1; ; attempt++ {
			res, err := s.c.RenewWithResponse(bg, client.RenewRequest{LeaseID: id})
			switch {
			case err == nil && res.JSON200 != nil && !res.JSON200.Degraded:
				renewed++
			case err == nil && res.ApplicationProblemJSON404 != nil:
				forgotten++
			case err == nil && attempt < 20 && (res.JSON200 != nil || res.ApplicationProblemJSON503 != nil):
				time.Sleep(100 * time.Millisecond)
				continue
			default:
				t.Errorf("renewing a lease after the failover: %s", describe(res, err))
			}
			break
		}
	}
	if after := held(); after != heldBefore || int64(renewed) > heldBefore {
		t.Errorf("the bucket held %d units before the renewals and %d after; %d leases renewed, %d not found", heldBefore, after, renewed, forgotten)
	}
	if s.wait > 0 && forgotten > 0 {
		t.Errorf("%d leases granted with the replicas' acknowledgement were forgotten", forgotten)
	}
	m := s.svc.metrics("ratelimitd_lease_renewals_not_found_total", "ratelimitd_store_primary_changes_total")
	if got := m["ratelimitd_lease_renewals_not_found_total"]; got != float64(forgotten) {
		t.Errorf("ratelimitd_lease_renewals_not_found_total %v, want the %d renewals answered 404", got, forgotten)
	}

	// What operators see: /readyz and /v1/status during and after, the
	// metric and the log line of the switch.
	probes := s.ready.halt()
	down, ok := firstAfter(probes, at.killed, http.StatusServiceUnavailable)
	if !ok {
		t.Errorf("/readyz never answered 503 after the primary was killed")
	}
	up, ok := firstAfter(probes, down.at, http.StatusOK)
	if !ok {
		t.Errorf("/readyz did not answer 200 again")
	}
	statuses := s.status.halt()
	unavailableAt := slices.IndexFunc(statuses, func(p statusProbe) bool { return p.at.After(at.killed) && !p.available })
	if unavailableAt < 0 {
		t.Errorf("/v1/status never said the store unavailable after the primary was killed")
	}
	h := status(t, s.c).StoreHealth
	if !h.Available || len(h.Primaries) == 0 || slices.Contains(h.Primaries, primary) || h.PrimaryChanges != 1 ||
		h.PrimaryChangedAt == nil || h.PrimaryChangedAt.Before(at.killed.Add(-time.Second)) || h.WaitReplicas != s.wait {
		t.Errorf("/v1/status after the failover: %+v (killed at %v)", h, at.killed)
	}
	to := ""
	for _, p := range h.Primaries {
		if slices.Contains(replicas, p) {
			to = p
		}
	}
	if to == "" {
		t.Errorf("/v1/status after the failover names %v, none of the replicas %v", h.Primaries, replicas)
	}
	if got := m["ratelimitd_store_primary_changes_total"]; got != 1 {
		t.Errorf("ratelimitd_store_primary_changes_total %v, want 1", got)
	}
	line := `"msg":"the store's primary changed","from":"` + primary + `","to":"` + to + `"`
	if n := strings.Count(s.svc.logs.String(), line); n != 1 {
		t.Errorf("%d log lines with %s, want 1", n, line)
	}

	// How long the fail mode answered, from the kill.
	var first, last time.Time
	for _, x := range abnormal {
		if first.IsZero() || x.start.Before(first) {
			first = x.start
		}
		if x.end().After(last) {
			last = x.end()
		}
	}
	firstNormal := time.Time{}
	for _, kind := range foKinds {
		for _, x := range samples[kind] {
			if x.answer == normal && x.start.After(at.killed) && (firstNormal.IsZero() || x.end().Before(firstNormal)) {
				firstNormal = x.end()
			}
		}
	}
	since := func(x time.Time) string {
		if x.IsZero() {
			return "-"
		}
		return x.Sub(at.killed).Round(time.Millisecond).String()
	}
	t.Logf("measured: %s: %d fail-mode answers (%v), the first begun %s and the last ended %s after the kill; first decision after the kill %s; /readyz 503 from %s to %s",
		s.name, len(abnormal), want, since(first), since(last), since(firstNormal), since(down.at), since(up.at))
	t.Logf("measured: %s: admitted %s; leases renewed after the failover %d, forgotten %d", s.name, strings.Join(figures, ", "), renewed, forgotten)
}

// The kinds of work of a service in TestFailover.
const (
	foSpend      = "spends"
	foQuotaSpend = "quota"
	foAcquire    = "leases"
)

var foKinds = []string{foSpend, foQuotaSpend, foAcquire}

// foWork is the load of one service of TestFailover: two spenders, a quota
// spender and an acquirer, each paced by foPace, each stopping once the
// primary was killed and its limit answers five denials in a row.
type foWork struct {
	// killed is set once the primary was killed.
	killed atomic.Bool
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	samples map[string][]sample
	// leases are the ids of the leases granted by a decision.
	leases []string
}

func startFoWork(t *testing.T, c *client.ClientWithResponses) *foWork {
	w := &foWork{stop: make(chan struct{}), samples: map[string][]sample{}}
	worker := func(kind string, op func() (sample, string)) {
		w.wg.Go(func() {
			denials := 0
			for {
				select {
				case <-w.stop:
					return
				case <-time.After(foPace):
				}
				s, lease := op()
				w.mu.Lock()
				w.samples[kind] = append(w.samples[kind], s)
				if lease != "" {
					w.leases = append(w.leases, lease)
				}
				w.mu.Unlock()
				if s.answer == normal && !s.allowed {
					denials++
				} else {
					denials = 0
				}
				if denials >= 5 && w.killed.Load() {
					return
				}
			}
		})
	}
	spendOn := func(limit, id string) func() (sample, string) {
		return func() (sample, string) { return spend(c, bucket(limit, id)), "" }
	}
	worker(foSpend, spendOn("FoSpends", "shared"))
	worker(foSpend, spendOn("FoSpends", "shared"))
	worker(foQuotaSpend, spendOn("FoQuota", "acct"))
	worker(foAcquire, func() (sample, string) { return acquire(c, "FoCalls", "acct") })
	t.Cleanup(func() { w.halt() })
	return w
}

// allowed counts the takes of a kind that a decision allowed so far.
func (w *foWork) allowed(kind string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.samples[kind] {
		if s.answer == normal && s.allowed {
			n++
		}
	}
	return n
}

// waitSpent waits until every worker has stopped, its limit spent, and
// fails the test after within.
func (w *foWork) waitSpent(t *testing.T, name string, within time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		w.mu.Lock()
		defer w.mu.Unlock()
		counts := map[string]map[answer]int{}
		for kind, s := range w.samples {
			counts[kind] = count(s)
		}
		t.Fatalf("%s: the limits not spent within %v of the failover: %v", name, within, counts)
	}
}

// halt stops the workers and returns their samples.
func (w *foWork) halt() map[string][]sample {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples
}

func (w *foWork) leaseIDs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.leases)
}

// acquire asks for a lease of one unit and classifies the answer as spend
// does; it returns the lease's id when a decision granted it.
func acquire(c *client.ClientWithResponses, limit, id string) (sample, string) {
	s := sample{bucket: id, start: time.Now()}
	res, err := c.AcquireWithResponse(withTiming(context.Background(), &s.latency),
		client.AcquireRequest{Buckets: []client.LeaseBucket{{Limit: limit, BucketID: id}}})
	lease := ""
	switch {
	case err != nil:
		if s.latency == 0 {
			s.latency = time.Since(s.start)
		}
		s.answer, s.what = other, err.Error()
	case res.JSON200 != nil:
		s.allowed, s.answer = res.JSON200.Allowed, normal
		switch {
		case res.JSON200.Degraded && !res.JSON200.Allowed:
			s.answer, s.what = other, "degraded but denied"
		case res.JSON200.Degraded:
			s.answer = degraded
		case res.JSON200.Allowed && res.JSON200.Lease != nil:
			lease = res.JSON200.Lease.ID
		case res.JSON200.Allowed:
			s.answer, s.what = other, "allowed without a lease"
		}
	case res.StatusCode() == http.StatusServiceUnavailable && res.ApplicationProblemJSON503 != nil &&
		res.HTTPResponse.Header.Get("Retry-After") != "":
		s.answer = unavailable
	default:
		s.answer, s.what = other, fmt.Sprintf("%d %s", res.StatusCode(), res.Body)
	}
	return s, lease
}

// statusProbe is one answer of /v1/status.
type statusProbe struct {
	at        time.Time
	available bool
}

// statusWatch polls /v1/status every 100 ms until halted.
type statusWatch struct {
	stop, done chan struct{}
	mu         sync.Mutex
	probes     []statusProbe
}

func watchStatus(t *testing.T, c *client.ClientWithResponses) *statusWatch {
	w := &statusWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			p := statusProbe{at: time.Now()}
			if res, err := c.StatusWithResponse(bg); err == nil && res.JSON200 != nil {
				p.available = res.JSON200.StoreHealth.Available
				w.mu.Lock()
				w.probes = append(w.probes, p)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { w.halt() })
	return w
}

func (w *statusWatch) halt() []statusProbe {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.probes)
}

// markReplicated writes a marker on the primary and waits until its n
// replicas acknowledge it, and with it every write the primary made
// before: a decision answered before the returned time is on them.
func markReplicated(t *testing.T, primary *testenv.RedisProcess, key string, n int) time.Time {
	t.Helper()
	at := time.Now()
	c := redis.NewClient(&redis.Options{Addr: primary.Addr(), ContextTimeoutEnabled: true, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	// WAIT covers the writes of its own connection: one pipeline.
	wait := redis.NewIntCmd(ctx, "wait", n, 5000)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, "1", time.Minute)
		return p.Process(ctx, wait)
	})
	if err != nil || wait.Val() != int64(n) {
		t.Fatalf("the marker on %s: %v, acknowledged by %d of %d replicas", primary.Addr(), err, wait.Val(), n)
	}
	return at
}

// dropReplicas closes the primary's connections to its replicas.
func dropReplicas(t *testing.T, primary *testenv.RedisProcess) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: primary.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := c.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica on %s: %v", primary.Addr(), err)
	}
}

// waitPromoted waits until the Cluster, as the node survivor sees it,
// has promoted replica.
func waitPromoted(t *testing.T, survivor, replica *testenv.RedisProcess) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: survivor.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	waitFor(t, 30*time.Second, "the replica "+replica.Addr()+" promoted", func() bool {
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		shards, err := c.ClusterShards(ctx).Result()
		for _, sh := range shards {
			for _, n := range sh.Nodes {
				if n.Role == "master" && n.Health == "online" && net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) == replica.Addr() {
					return err == nil
				}
			}
		}
		return false
	})
}
