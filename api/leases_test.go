package api_test

import (
	"maps"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// leaseLimit creates a concurrency limit of string ids through the API.
func (e *env) leaseLimit(name string, burst int, period string) {
	e.t.Helper()
	e.putLimit(name, obj{"id_format": "string", "kind": "concurrency", "burst": burst, "period": period})
}

// leaseAnswer is an acquire's answer.
type leaseAnswer struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
}

type acquired struct {
	result
	Lease *leaseAnswer `json:"lease"`
}

// acquire sends an acquire that must be answered 200, with ttl_ms unless
// ttl is 0, and decodes it.
func (e *env) acquire(token string, ttl time.Duration, buckets ...obj) (acquired, *response) {
	e.t.Helper()
	body := obj{"buckets": buckets}
	if ttl != 0 {
		body["ttl_ms"] = ttl.Milliseconds()
	}
	res := e.do("POST", "/v1/acquire", token, body).expect(e.t, http.StatusOK)
	var a acquired
	res.json(e.t, &a)
	if len(a.Decisions) != len(buckets) || (a.Lease != nil) != a.Allowed {
		e.t.Fatalf("acquire: %s", res.body)
	}
	return a, res
}

// held returns a decision's held units, failing when it has none.
func held(t *testing.T, d decision) int64 {
	t.Helper()
	if d.Held == nil {
		t.Fatalf("no held in %+v", d)
	}
	return *d.Held
}

// TestLeaseStory is the lease story of docs/api.md, step by step, on
// every store.
func TestLeaseStory(t *testing.T) {
	storeEnvs(t, testLeaseStory)
}

func testLeaseStory(t *testing.T, e *env) {
	e.leaseLimit("ModelCalls", 3, "30s")
	e.limit("PerAccount", "reg_id", 3, 3, "3s")
	token := e.token("gateway", auth.Decide)
	t0 := e.clock.Now()

	// Two of three units, for the limit's period.
	first, res := e.acquire(token, 0, bucket("ModelCalls", "acct-42", 2))
	d := first.Decisions[0]
	if !first.Allowed || first.Lease == nil || !limiter.ValidLeaseID(first.Lease.ID) || !first.Lease.ExpiresAt.Equal(t0.Add(30*time.Second)) ||
		held(t, d) != 2 || d.Remaining != 1 || d.ResetAfterMS != 30000 || d.Period != "30s" || d.Burst != 3 || d.Count != 3 ||
		first.ResetAfterMS != 30000 || first.Degraded {
		t.Fatalf("first acquire: %s", res.body)
	}
	wantHeaders(t, res, `"ModelCalls";q=3;qu="concurrent-requests";w=30`, `"ModelCalls";r=1;t=30`, "")

	// 10 s later two more do not fit: nothing is held, and the earliest
	// expiry, 20 s away, is when they could.
	e.clock.Advance(10 * time.Second)
	denied, res := e.acquire(token, 10*time.Second, bucket("ModelCalls", "acct-42", 2))
	d = denied.Decisions[0]
	if denied.Allowed || denied.Lease != nil || d.reason() != "limited" || held(t, d) != 2 || d.Remaining != 1 ||
		d.RetryAfterMS != 20000 || denied.RetryAfterMS != 20000 || denied.ResetAfterMS != 20000 {
		t.Fatalf("denied acquire: %s", res.body)
	}
	if !contains(res.body, `"lease":null`) {
		t.Errorf("a denied acquire's lease is not null: %s", res.body)
	}
	wantHeaders(t, res, `"ModelCalls";q=3;qu="concurrent-requests";w=30`, `"ModelCalls";r=1;t=20`, "20")

	// A check reads the bucket without taking anything.
	r, res := e.decided("check", token, bucket("ModelCalls", "acct-42", 0))
	if d := r.Decisions[0]; !r.Allowed || held(t, d) != 2 || d.Remaining != 1 {
		t.Fatalf("check: %s", res.body)
	}
	wantHeaders(t, res, `"ModelCalls";q=3;qu="concurrent-requests";w=30`, `"ModelCalls";r=1;t=20`, "")
	if r, _ := e.decided("check", token, bucket("ModelCalls", "acct-42", 2)); r.Allowed || held(t, r.Decisions[0]) != 2 {
		t.Fatalf("check of 2: %+v", r)
	}
	// Rate decisions have no held.
	if _, res := e.decided("check", token, bucket("PerAccount", "42", 0)); contains(res.body, "held") {
		t.Errorf("a rate decision with held: %s", res.body)
	}

	// Renewed, the lease outlives its first expiry.
	res = e.do("POST", "/v1/renew", token, obj{"lease_id": first.Lease.ID}).expect(t, http.StatusOK)
	var renewed struct {
		Lease    leaseAnswer
		Degraded bool
	}
	res.json(t, &renewed)
	if renewed.Lease.ID != first.Lease.ID || !renewed.Lease.ExpiresAt.Equal(t0.Add(40*time.Second)) || renewed.Degraded {
		t.Fatalf("renew: %s", res.body)
	}
	e.clock.Advance(25 * time.Second)
	if r, _ := e.decided("check", token, bucket("ModelCalls", "acct-42", 0)); held(t, r.Decisions[0]) != 2 {
		t.Fatalf("after the first expiry: %+v", r.Decisions[0])
	}
	res = e.do("POST", "/v1/renew", token, obj{"lease_id": first.Lease.ID, "ttl_ms": 5000}).expect(t, http.StatusOK)
	res.json(t, &renewed)
	if !renewed.Lease.ExpiresAt.Equal(t0.Add(40 * time.Second)) {
		t.Fatalf("renew for 5 s at 35 s: %s", res.body)
	}

	// Released, its units are free at once; a second release is no error.
	for _, want := range []string{`{"released":true,"degraded":false}`, `{"released":false,"degraded":false}`} {
		res := e.do("POST", "/v1/release", token, obj{"lease_id": first.Lease.ID}).expect(t, http.StatusOK)
		if got := strings.TrimSpace(string(res.body)); got != want {
			t.Errorf("release: %s, want %s", got, want)
		}
	}
	if r, _ := e.decided("check", token, bucket("ModelCalls", "acct-42", 0)); held(t, r.Decisions[0]) != 0 || r.Decisions[0].Remaining != 3 {
		t.Fatalf("after the release: %+v", r.Decisions[0])
	}
	p := e.do("POST", "/v1/renew", token, obj{"lease_id": first.Lease.ID}).expect(t, http.StatusNotFound).problem(t)
	if !strings.Contains(p.Detail, "another's") {
		t.Errorf("404 detail %q", p.Detail)
	}

	// Expiry frees the units without a release.
	short, _ := e.acquire(token, time.Second, bucket("ModelCalls", "acct-42", 3))
	e.clock.Advance(time.Second)
	if again, _ := e.acquire(token, 0, bucket("ModelCalls", "acct-42", 3)); !again.Allowed || held(t, again.Decisions[0]) != 3 {
		t.Fatalf("after an expiry: %+v", again)
	}
	e.do("POST", "/v1/renew", token, obj{"lease_id": short.Lease.ID}).expect(t, http.StatusNotFound)
}

// TestLeaseKinds: a lease takes concurrency buckets only, and those are
// never spent, refunded or settled; each refusal names the bucket's limit.
// A lease of two buckets holds both or neither, on every store: on a Redis
// Cluster the two may lie in different slots.
func TestLeaseKinds(t *testing.T) {
	storeEnvs(t, testLeaseKinds)
}

func testLeaseKinds(t *testing.T, e *env) {
	e.leaseLimit("Jobs", 2, "1m")
	e.leaseLimit("Exports", 5, "10s")
	e.limit("PerAccount", "reg_id", 3, 3, "3s")
	for _, op := range []string{"spend", "refund"} {
		p := e.decide(op, e.admin, bucket("PerAccount", "1", 1), bucket("Jobs", "a", 1)).expect(t, http.StatusUnprocessableEntity).problem(t)
		wantFields(t, p, "buckets[1].limit")
	}
	p := e.do("POST", "/v1/settle", e.admin, obj{"buckets": []obj{settle("Jobs", "a", 0, 1)}}).expect(t, http.StatusUnprocessableEntity).problem(t)
	wantFields(t, p, "buckets[0].limit")
	p = e.do("POST", "/v1/acquire", e.admin, obj{"buckets": []obj{bucket("Jobs", "a", 1), bucket("PerAccount", "1", 1)}}).
		expect(t, http.StatusUnprocessableEntity).problem(t)
	wantFields(t, p, "buckets[1].limit")
	// The ttl is checked against the shortest period of the buckets.
	p = e.do("POST", "/v1/acquire", e.admin, obj{"buckets": []obj{bucket("Jobs", "a", 1), bucket("Exports", "a", 1)}, "ttl_ms": 10001}).
		expect(t, http.StatusUnprocessableEntity).problem(t)
	wantFields(t, p, "ttl_ms")
	if msg := fieldErrors(p)["ttl_ms"]; !strings.Contains(msg, "10000") {
		t.Errorf("ttl_ms: %q", msg)
	}
	// Both buckets or neither.
	a, _ := e.acquire(e.admin, 0, bucket("Jobs", "a", 2), bucket("Exports", "a", 1))
	if !a.Allowed || !a.Lease.ExpiresAt.Equal(e.clock.Now().Add(10*time.Second)) {
		t.Fatalf("acquire of two: %+v", a)
	}
	b, _ := e.acquire(e.admin, 0, bucket("Exports", "a", 1), bucket("Jobs", "a", 1))
	if b.Allowed || !b.Decisions[0].Allowed || b.Decisions[1].Allowed || held(t, b.Decisions[0]) != 1 {
		t.Fatalf("all or nothing: %+v", b)
	}
	c, _ := e.acquire(e.admin, 0, bucket("Jobs", "a", 3))
	if c.Allowed || c.Decisions[0].reason() != "cost_exceeds_burst" || c.RetryAfterMS != -1 {
		t.Fatalf("beyond the burst: %+v", c)
	}
}

// TestAcquiresAreExactUnderConcurrency: concurrent acquires through HTTP
// on a bucket of burst N admit exactly N, on every store.
func TestAcquiresAreExactUnderConcurrency(t *testing.T) {
	storeEnvs(t, testAcquiresAreExact)
}

func testAcquiresAreExact(t *testing.T, e *env) {
	const burst, tries = 8, 40
	e.leaseLimit("Calls", burst, "1m")
	token := e.token("gateway", auth.Decide)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range tries {
		wg.Go(func() {
			res := e.do("POST", "/v1/acquire", token, obj{"buckets": []obj{bucket("Calls", "x", 1)}})
			if res.status != http.StatusOK {
				t.Errorf("%d %s", res.status, res.body)
				return
			}
			var a acquired
			res.json(t, &a)
			if a.Allowed && a.Lease != nil {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != burst {
		t.Fatalf("admitted %d of %d, want %d", admitted.Load(), tries, burst)
	}
	if r, _ := e.decided("check", token, bucket("Calls", "x", 0)); held(t, r.Decisions[0]) != burst {
		t.Fatalf("held %+v", r.Decisions[0])
	}
}

// TestLeaseOverrides: an override sets a bucket's burst, and its period
// is the longest its leases live; burst 0 blocks the bucket, and an
// unlimited one is always allowed. On every store.
func TestLeaseOverrides(t *testing.T) {
	storeEnvs(t, testLeaseOverrides)
}

func testLeaseOverrides(t *testing.T, e *env) {
	e.leaseLimit("Calls", 2, "1m")
	e.override(obj{"limit": "Calls", "bucket_id": "big", "burst": 5, "period": "1m"})
	e.override(obj{"limit": "Calls", "bucket_id": "brief", "burst": 2, "period": "5s"})
	e.override(obj{"limit": "Calls", "bucket_id": "banned", "burst": 0, "period": "1m"})
	e.override(obj{"limit": "Calls", "bucket_id": "free", "unlimited": true})
	if a, _ := e.acquire(e.admin, 0, bucket("Calls", "big", 5)); !a.Allowed || a.Decisions[0].Source != "override" || a.Decisions[0].Burst != 5 {
		t.Errorf("override: %+v", a)
	}
	if a, _ := e.acquire(e.admin, 0, bucket("Calls", "brief", 1)); !a.Allowed || !a.Lease.ExpiresAt.Equal(e.clock.Now().Add(5*time.Second)) {
		t.Errorf("an override's period: %+v", a)
	}
	p := e.do("POST", "/v1/acquire", e.admin, obj{"buckets": []obj{bucket("Calls", "brief", 1)}, "ttl_ms": 5001}).expect(t, http.StatusUnprocessableEntity).problem(t)
	wantFields(t, p, "ttl_ms")
	a, res := e.acquire(e.admin, 0, bucket("Calls", "banned", 1))
	if a.Allowed || a.Decisions[0].reason() != "blocked" || a.RetryAfterMS != -1 {
		t.Errorf("blocked: %+v", a)
	}
	wantHeaders(t, res, `"Calls";q=0;qu="concurrent-requests";w=60`, `"Calls";r=0;t=0`, "")
	if a, _ := e.acquire(e.admin, 0, bucket("Calls", "free", 1000)); !a.Allowed || a.Decisions[0].Source != "unlimited" {
		t.Errorf("unlimited: %+v", a)
	}
}

// downStores are the stores that can fail, each with the client of its
// kind; the fail modes do not apply to the in-process store, which never
// fails.
var downStores = []struct{ name, scheme string }{{"redis", "redis"}, {"cluster", "redis+cluster"}}

// downStore returns a store whose Redis server was started and stopped:
// every call is refused, as when Redis goes away.
func downStore(t *testing.T, scheme string) limiter.Store {
	rs := testenv.RedisServer(t)
	rs.Stop()
	opts, err := redisstore.ParseURL(scheme + "://" + rs.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewUniversalClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return redisstore.New(c, redisstore.Options{Prefix: testenv.RandomName("rltest:") + ":"})
}

// TestLeaseFailModes: with the store down, the lease routes answer as the
// fail mode says: open, allowed and degraded, releasing nothing; closed, a
// 503 that carries no answer.
func TestLeaseFailModes(t *testing.T) {
	id := limiter.NewLeaseID()
	for _, st := range downStores {
		t.Run(st.name+"/open", func(t *testing.T) {
			e := newEnv(t, failOpen(), withStore(downStore(t, st.scheme)))
			e.leaseLimit("Calls", 2, "30s")
			a, res := e.acquire(e.admin, 0, bucket("Calls", "a", 1))
			if !a.Allowed || !a.Degraded || a.Lease == nil || !a.Lease.ExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) {
				t.Fatalf("acquire: %s", res.body)
			}
			wantHeaders(t, res, "", "", "")
			for _, lease := range []string{a.Lease.ID, id} {
				res := e.do("POST", "/v1/release", e.admin, obj{"lease_id": lease}).expect(t, http.StatusOK)
				if got := strings.TrimSpace(string(res.body)); got != `{"released":false,"degraded":true}` {
					t.Errorf("release: %s", got)
				}
			}
			var renewed struct {
				Lease    leaseAnswer
				Degraded bool
			}
			e.do("POST", "/v1/renew", e.admin, obj{"lease_id": id, "ttl_ms": 5000}).expect(t, http.StatusOK).json(t, &renewed)
			if renewed.Lease.ID != id || !renewed.Degraded || !renewed.Lease.ExpiresAt.Equal(e.clock.Now().Add(5*time.Second)) {
				t.Errorf("renew: %+v", renewed)
			}
			e.do("POST", "/v1/renew", e.admin, obj{"lease_id": id}).expect(t, http.StatusOK).json(t, &renewed)
			if !renewed.Lease.ExpiresAt.Equal(e.clock.Now().Add(limiter.MaxLeasePeriod)) {
				t.Errorf("renew without ttl_ms: %+v", renewed)
			}
			// Still a 422 for what no store needs to refuse.
			e.do("POST", "/v1/renew", e.admin, obj{"lease_id": "lse_x"}).expect(t, http.StatusUnprocessableEntity)
		})

		t.Run(st.name+"/closed", func(t *testing.T) {
			e := newEnv(t, withStore(downStore(t, st.scheme)))
			e.leaseLimit("Calls", 2, "30s")
			for path, body := range map[string]obj{
				"/v1/acquire": {"buckets": []obj{bucket("Calls", "a", 1)}},
				"/v1/release": {"lease_id": id},
				"/v1/renew":   {"lease_id": id},
				"/v1/check":   {"buckets": []obj{bucket("Calls", "a", 0)}},
			} {
				res := e.do("POST", path, e.admin, body).expect(t, http.StatusServiceUnavailable)
				if p := res.problem(t); p.RequestID == "" || contains(res.body, "allowed") || contains(res.body, "released") || contains(res.body, "refused") {
					t.Errorf("%s: %s", path, res.body)
				}
			}
		})
	}
}

// TestHostileLeaseBodies sends the bodies a careless or hostile client
// sends to the lease routes, on both engines and every store: each is a
// 400 or 422 naming the field, never a 5xx, and nothing is held or freed.
func TestHostileLeaseBodies(t *testing.T) {
	for _, eng := range engines {
		for _, st := range stores {
			t.Run(eng.name+"/"+st.name, func(t *testing.T) {
				opts := eng.opts
				if s := st.store(t); s != nil {
					opts = append(opts[:len(opts):len(opts)], withStore(s))
				}
				testHostileLeaseBodies(t, newEnv(t, opts...))
			})
		}
	}
}

func testHostileLeaseBodies(t *testing.T, e *env) {
	e.leaseLimit("Calls", 2, "30s")
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	lease, _ := e.acquire(e.admin, 0, bucket("Calls", "d", 1))
	id := lease.Lease.ID
	ttl := "must be an integer from 1 to 86400000 (milliseconds); leave it out for the longest the lease's limits allow"
	leaseID := "must be a lease id as acquire returns it (lse_ and 26 characters)"
	acquire := func(more string) string {
		return `{"buckets":[{"limit":"Calls","bucket_id":"d"}]` + more + `}`
	}
	cases := []struct {
		path, body string
		status     int
		// errors are the problem's field errors, exactly; nil
		// checks none.
		errors map[string]string
	}{
		{"/v1/acquire", acquire(`,"ttl_ms":0`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":-1`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":-0`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":86400001`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":99999999999999999999`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":-99999999999999999999`), 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/acquire", acquire(`,"ttl_ms":30001`), 422, nil},
		{"/v1/acquire", acquire(`,"ttl_ms":1.5`), 400, map[string]string{"ttl_ms": "must be an integer"}},
		{"/v1/acquire", acquire(`,"ttl_ms":1e3`), 400, map[string]string{"ttl_ms": "must be an integer"}},
		{"/v1/acquire", acquire(`,"ttl_ms":"1000"`), 400, nil},
		{"/v1/acquire", acquire(`,"ttl_ms":null`), 400, nil},
		{"/v1/acquire", acquire(`,"ttl_ms":1000,"ttl_ms":2000`), 400, map[string]string{"ttl_ms": "duplicate key"}},
		{"/v1/acquire", acquire(`,"lease_id":"x"`), 400, map[string]string{"lease_id": "unknown field"}},
		{"/v1/acquire", `{"buckets":[{"limit":"Calls","bucket_id":"d","cost":0}]}`, 422, nil},
		{"/v1/acquire", `{"buckets":[{"limit":"Calls","bucket_id":"d","cost":-1}],"ttl_ms":0}`, 422, nil},
		{"/v1/acquire", `{"buckets":[{"limit":"Calls","bucket_id":"d","cost":99999999999999999999}]}`, 422, nil},
		{"/v1/acquire", `{"buckets":[{"limit":"Calls","bucket_id":"d"},{"limit":"Calls","bucket_id":"d"}]}`, 422, nil},
		{"/v1/acquire", `{"buckets":[{"limit":"Nope","bucket_id":"d"}],"ttl_ms":1000}`, 422, nil},
		{"/v1/acquire", "{\"buckets\":[{\"limit\":\"Calls\",\"bucket_id\":\"d\xff\"}]}", 400, nil},
		{"/v1/acquire", `{"buckets":[{"limit":"Calls","bucket_id":"a\u0000b"}]}`, 422, nil},
		{"/v1/acquire", `{"buckets":[]}`, 422, map[string]string{"buckets": "must hold at least 1 items"}},
		{"/v1/acquire", `{"ttl_ms":1000}`, 422, map[string]string{"buckets": "is required"}},
		{"/v1/release", `{}`, 422, map[string]string{"lease_id": "is required"}},
		{"/v1/release", `{"lease_id":""}`, 422, map[string]string{"lease_id": leaseID}},
		{"/v1/release", `{"lease_id":"` + strings.ToUpper(id) + `"}`, 422, map[string]string{"lease_id": leaseID}},
		{"/v1/release", `{"lease_id":"` + id + `a"}`, 422, map[string]string{"lease_id": leaseID}},
		{"/v1/release", `{"lease_id":"../../etc/passwd"}`, 422, map[string]string{"lease_id": leaseID}},
		{"/v1/release", `{"lease_id":"lse_\u0000"}`, 422, nil},
		{"/v1/release", "{\"lease_id\":\"lse_\xff\"}", 400, nil},
		{"/v1/release", `{"lease_id":12}`, 400, map[string]string{"lease_id": "must be a string"}},
		{"/v1/release", `{"lease_id":null}`, 400, nil},
		{"/v1/release", `{"lease_id":"` + id + `","lease_id":"` + id + `"}`, 400, map[string]string{"lease_id": "duplicate key"}},
		{"/v1/release", `{"lease_id":"` + id + `","ttl_ms":1000}`, 400, map[string]string{"ttl_ms": "unknown field"}},
		{"/v1/renew", `{"lease_id":"` + id + `","ttl_ms":0}`, 422, map[string]string{"ttl_ms": ttl}},
		{"/v1/renew", `{"lease_id":"` + id + `","ttl_ms":30001}`, 422, nil},
		{"/v1/renew", `{"lease_id":"nope","ttl_ms":-5}`, 422, map[string]string{"lease_id": leaseID, "ttl_ms": ttl}},
		{"/v1/renew", `{"ttl_ms":99999999999999999999}`, 422, map[string]string{"lease_id": "is required", "ttl_ms": ttl}},
		{"/v1/renew", `{"lease_id":"` + id + `","ttl_ms":1.0}`, 400, nil},
		{"/v1/renew", `[]`, 400, nil},
	}
	for _, c := range cases {
		t.Run(c.path+" "+c.body, func(t *testing.T) {
			p := e.do("POST", c.path, e.admin, c.body).expect(t, c.status).problem(t)
			if len(p.Errors) == 0 {
				t.Errorf("no field named: %+v", p)
			}
			if c.errors == nil {
				return
			}
			got := fieldErrors(p)
			// The wording of a wrong type is input's; only its start
			// is checked.
			for f, msg := range c.errors {
				if strings.HasPrefix(got[f], msg) {
					got[f] = msg
				}
			}
			if !maps.Equal(got, c.errors) {
				t.Errorf("errors %v, want %v", p.Errors, c.errors)
			}
		})
	}
	// The errors the Limiter finds come in body order too: the bucket's
	// before its cost's.
	for body, want := range map[string]string{
		`{"buckets":[{"limit":"Nope","bucket_id":"d","cost":0}]}`:                                    "buckets[0].limit buckets[0].cost",
		`{"buckets":[{"limit":"PerAccount","bucket_id":"1","cost":0}]}`:                              "buckets[0].limit buckets[0].cost",
		`{"buckets":[{"limit":"Calls","bucket_id":"d"},{"limit":"Calls","bucket_id":"d","cost":0}]}`: "buckets[1] buckets[1].cost",
	} {
		p := e.do("POST", "/v1/acquire", e.admin, body).expect(t, 422).problem(t)
		var got []string
		for _, f := range p.Errors {
			got = append(got, f.Field)
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s: errors %+v, want %s", body, p.Errors, want)
		}
	}
	// Nothing was held or freed: the one lease still holds its unit.
	if r, _ := e.decided("check", e.admin, bucket("Calls", "d", 0)); held(t, r.Decisions[0]) != 1 {
		t.Errorf("held %+v", r.Decisions[0])
	}
}

// TestLeaseMetrics counts leases by limit and event, never by bucket, on
// every store.
func TestLeaseMetrics(t *testing.T) {
	storeEnvs(t, testLeaseMetrics)
}

func testLeaseMetrics(t *testing.T, e *env) {
	e.leaseLimit("Calls", 5, "30s")
	a, _ := e.acquire(e.admin, 0, bucket("Calls", "secret-bucket", 1))
	// A second lease outlives the short one, so that Redis keeps the
	// bucket's key until an acquire finds the short lease expired, however
	// slowly the test runs: Redis expires keys on its own clock, which the
	// test's does not move.
	e.acquire(e.admin, 0, bucket("Calls", "secret-bucket", 1))
	e.acquire(e.admin, time.Second, bucket("Calls", "secret-bucket", 1))
	e.do("POST", "/v1/renew", e.admin, obj{"lease_id": a.Lease.ID}).expect(t, http.StatusOK)
	e.do("POST", "/v1/release", e.admin, obj{"lease_id": a.Lease.ID}).expect(t, http.StatusOK)
	e.clock.Advance(2 * time.Second)
	// The next acquire on the bucket finds the short lease expired.
	if r, _ := e.acquire(e.admin, 0, bucket("Calls", "secret-bucket", 3)); !r.Allowed || held(t, r.Decisions[0]) != 4 {
		t.Fatalf("after the expiry: %+v", r)
	}
	e.acquire(e.admin, 0, bucket("Calls", "secret-bucket", 2))
	body := string(e.do("GET", "/metrics", "", nil).expect(t, http.StatusOK).body)
	for _, line := range []string{
		`ratelimitd_leases_total{event="acquired",limit="Calls"} 4`,
		`ratelimitd_leases_total{event="released",limit="Calls"} 1`,
		`ratelimitd_leases_total{event="renewed",limit="Calls"} 1`,
		`ratelimitd_leases_total{event="expired",limit="Calls"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="Calls",op="acquire",result="allowed"} 3`,
		`ratelimitd_decisions_total{frontend="http",limit="Calls",op="acquire",result="near_limit"} 1`,
		`ratelimitd_decisions_total{frontend="http",limit="Calls",op="acquire",result="denied"} 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("no line %q", line)
		}
	}
	if strings.Contains(body, "secret-bucket") {
		t.Error("a bucket id in the metrics")
	}
}

// TestLeaseCountsAddUp leaves leases to expire, releases and renews
// others, on every store, stepping the service's clock, and compares the
// counters with what the buckets hold: acquired - released - expired is
// the leases held (each of one unit here), once the sweep that follows
// every expiry has run. Before, an expired lease that no acquire found
// was dropped uncounted.
func TestLeaseCountsAddUp(t *testing.T) {
	storeEnvs(t, testLeaseCountsAddUp)
}

func testLeaseCountsAddUp(t *testing.T, e *env) {
	e.leaseLimit("Jobs", 1000, "1m")
	r := rand.New(rand.NewPCG(28, 4))
	var buckets []obj
	for i := range 8 {
		buckets = append(buckets, obj{"limit": "Jobs", "bucket_id": "job-" + strconv.Itoa(i), "cost": 0})
	}
	var live []string
	for round := range 6 {
		for range 25 {
			b := obj{"limit": "Jobs", "bucket_id": "job-" + strconv.Itoa(r.IntN(len(buckets))), "cost": 1}
			ttl := []time.Duration{time.Second, 3 * time.Second, 20 * time.Second, 0}[r.IntN(4)]
			if a, _ := e.acquire(e.admin, ttl, b); a.Lease != nil {
				live = append(live, a.Lease.ID)
			}
		}
		for _, id := range live {
			switch r.IntN(5) {
			case 0:
				e.do("POST", "/v1/release", e.admin, obj{"lease_id": id}).expect(t, http.StatusOK)
			case 1:
				// A renewal of a lease that expired meanwhile is a 404.
				e.do("POST", "/v1/renew", e.admin, obj{"lease_id": id, "ttl_ms": 5000})
			}
		}
		e.clock.Advance(time.Duration(1+r.IntN(12)) * time.Second)
		var counted, held int64
		deadline := time.Now().Add(10 * time.Second)
		for {
			counted = leaseCount(t, e, "acquired") - leaseCount(t, e, "released") - leaseCount(t, e, "expired")
			var res result
			e.do("POST", "/v1/check", e.admin, obj{"buckets": buckets}).expect(t, http.StatusOK).json(t, &res)
			held = 0
			for _, d := range res.Decisions {
				held += *d.Held
			}
			if counted == held || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if counted != held {
			t.Fatalf("round %d: acquired - released - expired = %d, but the buckets hold %d", round, counted, held)
		}
	}
	if leaseCount(t, e, "expired") == 0 {
		t.Fatal("no lease was counted expired")
	}
}

// leaseCount reads ratelimitd_leases_total of the limit Jobs for event.
func leaseCount(t *testing.T, e *env, event string) int64 {
	t.Helper()
	body := string(e.do("GET", "/metrics", "", nil).expect(t, http.StatusOK).body)
	prefix := `ratelimitd_leases_total{event="` + event + `",limit="Jobs"} `
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	return 0
}
