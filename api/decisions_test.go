package api_test

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/storetest"
)

// result is a decision answer.
type result struct {
	Allowed      bool       `json:"allowed"`
	RetryAfterMS int64      `json:"retry_after_ms"`
	ResetAfterMS int64      `json:"reset_after_ms"`
	Degraded     bool       `json:"degraded"`
	Decisions    []decision `json:"decisions"`
}

type decision struct {
	Limit        string  `json:"limit"`
	BucketID     string  `json:"bucket_id"`
	Allowed      bool    `json:"allowed"`
	Reason       *string `json:"reason"`
	Held         *int64  `json:"held"`
	Remaining    int64   `json:"remaining"`
	Debt         int64   `json:"debt"`
	RetryAfterMS int64   `json:"retry_after_ms"`
	ResetAfterMS int64   `json:"reset_after_ms"`
	Burst        int64   `json:"burst"`
	Count        int64   `json:"count"`
	Period       string  `json:"period"`
	Unit         string  `json:"unit"`
	Capped       *bool   `json:"capped"`
	Source       string  `json:"source"`
	Shadow       bool    `json:"shadow"`
}

func (d decision) reason() string {
	if d.Reason == nil {
		return "null"
	}
	return *d.Reason
}

// decided sends a decision that must be answered 200 and decodes it.
func (e *env) decided(op, token string, buckets ...obj) (result, *response) {
	e.t.Helper()
	res := e.decide(op, token, buckets...).expect(e.t, http.StatusOK)
	var r result
	res.json(e.t, &r)
	if len(r.Decisions) != len(buckets) {
		e.t.Fatalf("%d decisions for %d buckets", len(r.Decisions), len(buckets))
	}
	return r, res
}

// waitFor waits until the loader's snapshot satisfies cond.
func (e *env) waitFor(what string, cond func(*limiter.Snapshot) bool) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s := e.limiter.Snapshot(); s != nil && cond(s) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the snapshot never had %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitLimit waits until the snapshot holds the limit.
func (e *env) waitLimit(name string) {
	e.t.Helper()
	e.waitFor("limit "+name, func(s *limiter.Snapshot) bool { _, ok := s.Limit(name); return ok })
}

// waitSource waits until a bucket's decisions come from source.
func (e *env) waitSource(limit, id string, source limiter.Source) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("%s for %s %s", source, limit, id), func(s *limiter.Snapshot) bool {
		r, err := s.Resolve(limit, id, e.clock.Now())
		return err == nil && r.Source == source
	})
}

func TestDecisions(t *testing.T) {
	e := newEnv(t)
	decide := e.token("checkout", auth.Decide)
	e.limit("PerAccount", "reg_id", 3, 3, "3s")
	e.limit("PerIP", "ip_address", 10, 10, "10s")
	e.putLimit("Shadowed", obj{"id_format": "string", "burst": 1, "count": 1, "period": "1m", "shadow": true})
	e.override(obj{"limit": "PerAccount", "bucket_id": "666", "burst": 0, "count": 1, "period": "1s"})
	e.override(obj{"limit": "PerAccount", "bucket_id": "7", "unlimited": true})
	e.waitLimit("Shadowed")
	e.waitSource("PerAccount", "7", limiter.SourceUnlimited)
	e.waitSource("PerAccount", "666", limiter.SourceOverride)

	t.Run("allowed", func(t *testing.T) {
		r, res := e.decided("spend", decide, obj{"limit": "PerAccount", "bucket_id": "0042"})
		d := r.Decisions[0]
		if !r.Allowed || r.RetryAfterMS != 0 || r.ResetAfterMS != 1000 || r.Degraded {
			t.Errorf("result %+v", r)
		}
		if d != (decision{Limit: "PerAccount", BucketID: "42", Allowed: true, Remaining: 2, ResetAfterMS: 1000,
			Burst: 3, Count: 3, Period: "3s", Unit: "requests", Source: "default"}) {
			t.Errorf("decision %+v", d)
		}
		wantHeaders(t, res, `"PerAccount";q=3;w=3`, `"PerAccount";r=2;t=1`, "")
	})

	t.Run("limited", func(t *testing.T) {
		e.decided("spend", decide, bucket("PerAccount", "43", 3))
		e.clock.Advance(10 * time.Millisecond)
		r, res := e.decided("spend", decide, bucket("PerAccount", "43", 1))
		d := r.Decisions[0]
		if r.Allowed || d.Allowed || d.reason() != "limited" || d.RetryAfterMS != 990 || r.RetryAfterMS != 990 ||
			d.ResetAfterMS != 2990 || d.Remaining != 0 {
			t.Errorf("result %+v", r)
		}
		// t is when a retry can succeed (draft-ietf-httpapi-ratelimit-headers-11
		// example B.1.4), as Retry-After says, not when the bucket is full.
		wantHeaders(t, res, `"PerAccount";q=3;w=3`, `"PerAccount";r=0;t=1`, "1")
		// Rounded up: 0.5 ms later, retry_after is still a whole 990 ms.
		e.clock.Advance(500 * time.Microsecond)
		r, _ = e.decided("check", decide, bucket("PerAccount", "43", 1))
		if r.RetryAfterMS != 990 {
			t.Errorf("retry_after_ms %d, want 990 (989.5 rounded up)", r.RetryAfterMS)
		}
	})

	t.Run("blocked", func(t *testing.T) {
		r, res := e.decided("spend", decide, bucket("PerAccount", "666", 1))
		d := r.Decisions[0]
		if r.Allowed || d.reason() != "blocked" || d.RetryAfterMS != -1 || r.RetryAfterMS != -1 || d.Source != "override" || d.Burst != 0 {
			t.Errorf("result %+v", r)
		}
		wantHeaders(t, res, `"PerAccount";q=0;w=1`, `"PerAccount";r=0;t=0`, "")
	})

	t.Run("cost_exceeds_burst", func(t *testing.T) {
		r, res := e.decided("spend", decide, bucket("PerAccount", "44", 4))
		d := r.Decisions[0]
		if r.Allowed || d.reason() != "cost_exceeds_burst" || d.RetryAfterMS != -1 || d.Remaining != 3 {
			t.Errorf("result %+v", r)
		}
		if res.header.Get("Retry-After") != "" {
			t.Error("Retry-After for a request that can never succeed")
		}
	})

	t.Run("unlimited", func(t *testing.T) {
		r, res := e.decided("spend", decide, bucket("PerAccount", "007", 1000))
		d := r.Decisions[0]
		if !r.Allowed || d.Source != "unlimited" || d.Remaining != 3 || d.Burst != 3 || d.BucketID != "7" {
			t.Errorf("result %+v", r)
		}
		wantHeaders(t, res, "", "", "")
	})

	t.Run("shadow", func(t *testing.T) {
		e.decided("spend", decide, bucket("Shadowed", "a", 1))
		r, res := e.decided("spend", decide, bucket("Shadowed", "a", 1), bucket("PerIP", "192.0.2.1", 1))
		d := r.Decisions[0]
		if !r.Allowed || d.Allowed || !d.Shadow || d.reason() != "limited" || r.RetryAfterMS != 0 {
			t.Errorf("result %+v", r)
		}
		// The headers describe the bucket that can deny.
		wantHeaders(t, res, `"PerIP";q=10;w=10`, `"PerIP";r=9;t=1`, "")
	})

	t.Run("most restrictive", func(t *testing.T) {
		_, res := e.decided("check", decide, bucket("PerIP", "192.0.2.9", 5), bucket("PerAccount", "45", 2))
		wantHeaders(t, res, `"PerAccount";q=3;w=3`, `"PerAccount";r=1;t=2`, "")
		r, res := e.decided("spend", decide, bucket("PerIP", "192.0.2.9", 10), bucket("PerAccount", "45", 4), bucket("PerAccount", "46", 1))
		if r.Allowed || r.RetryAfterMS != -1 {
			t.Errorf("result %+v", r)
		}
		wantHeaders(t, res, `"PerAccount";q=3;w=3`, `"PerAccount";r=3;t=0`, "")
	})

	t.Run("check spends nothing, refund gives back", func(t *testing.T) {
		for range 3 {
			if r, _ := e.decided("check", decide, bucket("PerAccount", "50", 3)); !r.Allowed || r.Decisions[0].Remaining != 0 {
				t.Fatalf("check %+v", r)
			}
		}
		e.decided("spend", decide, bucket("PerAccount", "50", 3))
		r, res := e.decided("refund", decide, bucket("PerAccount", "50", 2))
		if d := r.Decisions[0]; !r.Allowed || d.Remaining != 2 || d.reason() != "null" {
			t.Errorf("refund %+v", r)
		}
		wantHeaders(t, res, `"PerAccount";q=3;w=3`, `"PerAccount";r=2;t=1`, "")
		r, _ = e.decided("refund", decide, bucket("PerAccount", "51", 1))
		if r.Allowed || r.Decisions[0].Allowed {
			t.Errorf("refund to a full bucket %+v", r)
		}
		if r, _ := e.decided("check", decide, bucket("PerAccount", "50", 0)); r.Decisions[0].Remaining != 2 {
			t.Errorf("inspect %+v", r)
		}
	})

	t.Run("reset", func(t *testing.T) {
		e.decided("spend", decide, bucket("PerAccount", "60", 3))
		e.do("POST", "/v1/buckets/reset", decide, obj{"buckets": []obj{{"limit": "PerAccount", "bucket_id": "60"}}}).
			expect(t, http.StatusForbidden)
		res := e.do("POST", "/v1/buckets/reset", e.token("desk", auth.Support),
			obj{"buckets": []obj{{"limit": "PerAccount", "bucket_id": "060"}, {"limit": "PerIP", "bucket_id": "::1"}}}).expect(t, http.StatusOK).object(t)
		if res["reset"] != float64(2) {
			t.Errorf("reset %v", res)
		}
		if r, _ := e.decided("check", decide, bucket("PerAccount", "60", 0)); r.Decisions[0].Remaining != 3 {
			t.Errorf("after reset %+v", r)
		}
		p := e.do("POST", "/v1/buckets/reset", e.admin, obj{"buckets": []obj{
			{"limit": "Nope", "bucket_id": "1"}, {"limit": "PerAccount"}, {"limit": "PerAccount", "bucket_id": "x"},
			{"limit": "PerIP", "bucket_id": "::1"}, {"limit": "PerIP", "bucket_id": "0:0::1"},
		}}).expect(t, http.StatusUnprocessableEntity).problem(t)
		wantFields(t, p, "buckets[0].limit", "buckets[1].bucket_id", "buckets[2].bucket_id", "buckets[4]")
	})
}

// wantHeaders checks the rate-limit headers of a decision; "" wants none.
func wantHeaders(t *testing.T, res *response, policy, limit, retryAfter string) {
	t.Helper()
	for name, want := range map[string]string{"RateLimit-Policy": policy, "RateLimit": limit, "Retry-After": retryAfter} {
		if got := res.header.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

// TestInvalidDecisions sends requests that must be refused with one 422
// naming every bad field, and shows that nothing was spent.
func TestInvalidDecisions(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.limit("PerName", "domain", 5, 5, "5s")
	e.waitLimit("PerName")
	many := make([]obj, 101)
	for i := range many {
		many[i] = bucket("PerAccount", "1", 1)
	}
	cases := map[string]struct {
		buckets []obj
		fields  []string
	}{
		"no buckets":    {[]obj{}, []string{"buckets"}},
		"101 buckets":   {many, []string{"buckets", "buckets[1]"}},
		"duplicate":     {[]obj{bucket("PerAccount", "1", 1), bucket("PerAccount", "0001", 1)}, []string{"buckets[1]"}},
		"negative cost": {[]obj{bucket("PerAccount", "1", -1)}, []string{"buckets[0].cost"}},
		"unknown limit": {[]obj{bucket("PerAccount", "1", 1), bucket("Nope", "1", 1)}, []string{"buckets[1].limit"}},
		"bad id":        {[]obj{bucket("PerName", "-bad-.com", 1), bucket("PerAccount", "1", 1)}, []string{"buckets[0].bucket_id"}},
		"everything": {[]obj{
			bucket("PerAccount", "1", -5), {"bucket_id": "1"}, bucket("Nope", "1", 1), bucket("PerName", "a..b", 1),
			bucket("PerAccount", "01", 1), {"limit": "PerName", "bucket_id": "x.com", "cost": 1, "extra": true},
		}, []string{"buckets[0].cost", "buckets[1].limit", "buckets[2].limit", "buckets[3].bucket_id", "buckets[4]"}},
	}
	for _, op := range []string{"check", "spend", "refund"} {
		for name, c := range cases {
			t.Run(op+"/"+name, func(t *testing.T) {
				res := e.decide(op, e.admin, c.buckets...)
				want := http.StatusUnprocessableEntity
				if name == "everything" {
					// The unknown field is the wrong shape: a 400 first.
					want, c.fields = http.StatusBadRequest, []string{"buckets[5].extra"}
				}
				p := res.expect(t, want).problem(t)
				if name == "101 buckets" {
					// buckets[1] and on repeat buckets[0]: the count and
					// every repeat among the first 100 are named; the
					// buckets beyond the most a batch holds are not read.
					if len(p.Errors) != 100 || fieldErrors(p)["buckets"] == "" || fieldErrors(p)["buckets[100]"] != "" {
						t.Errorf("errors %v", p.Errors)
					}
					return
				}
				wantFields(t, p, c.fields...)
			})
		}
	}
	// The same without the unknown field: one 422 with everything.
	p := e.decide("spend", e.admin, bucket("PerAccount", "1", -5), obj{"bucket_id": "1"}, bucket("Nope", "1", 1),
		bucket("PerName", "a..b", 1), bucket("PerAccount", "01", 1)).expect(t, http.StatusUnprocessableEntity).problem(t)
	wantFields(t, p, "buckets[0].cost", "buckets[1].limit", "buckets[2].limit", "buckets[3].bucket_id", "buckets[4]")
	if fieldErrors(p)["buckets[1].limit"] != "is required" {
		t.Errorf("missing limit: %q", fieldErrors(p)["buckets[1].limit"])
	}

	r, _ := e.decided("check", e.admin, bucket("PerAccount", "1", 0))
	if r.Decisions[0].Remaining != 5 {
		t.Errorf("a refused request spent: %+v", r)
	}
}

var errStoreDown = errors.New("connection refused")

func TestDegraded(t *testing.T) {
	e := newEnv(t, failOpen(), withStore(storetest.Down{Err: errStoreDown}))
	e.limit("PerAccount", "reg_id", 3, 3, "3s")
	e.override(obj{"limit": "PerAccount", "bucket_id": "666", "burst": 0, "count": 1, "period": "1s"})
	e.waitSource("PerAccount", "666", limiter.SourceOverride)

	r, res := e.decided("spend", e.admin, bucket("PerAccount", "1", 1))
	if !r.Allowed || !r.Degraded || !r.Decisions[0].Allowed || r.Decisions[0].Remaining != 0 {
		t.Errorf("degraded %+v", r)
	}
	wantHeaders(t, res, "", "", "")
	// A blocked bucket needs no store: it still denies.
	r, res = e.decided("spend", e.admin, bucket("PerAccount", "1", 1), bucket("PerAccount", "666", 1))
	if r.Allowed || !r.Degraded || r.Decisions[1].reason() != "blocked" {
		t.Errorf("degraded and blocked %+v", r)
	}
	wantHeaders(t, res, `"PerAccount";q=0;w=1`, `"PerAccount";r=0;t=0`, "")
	e.do("POST", "/v1/buckets/reset", e.admin, obj{"buckets": []obj{{"limit": "PerAccount", "bucket_id": "1"}}}).
		expect(t, http.StatusServiceUnavailable)
}

func TestFailClosed(t *testing.T) {
	e := newEnv(t, withStore(storetest.Down{Err: errStoreDown}))
	e.limit("PerAccount", "reg_id", 3, 3, "3s")
	e.waitLimit("PerAccount")
	for _, op := range []string{"check", "spend", "refund"} {
		res := e.decide(op, e.admin, bucket("PerAccount", "1", 1)).expect(t, http.StatusServiceUnavailable)
		p := res.problem(t)
		if p.RequestID == "" || p.RequestID != res.header.Get("X-Request-Id") || res.header.Get("Retry-After") == "" {
			t.Errorf("problem %+v, headers %v", p, res.header)
		}
		if contains(res.body, "allowed") || contains(res.body, "refused") {
			t.Errorf("a 503 says more than it should: %s", res.body)
		}
	}
	e.do("GET", "/readyz", "", nil).expect(t, http.StatusServiceUnavailable)
}

// TestOverrideTakesEffect shows that an override created over HTTP
// changes decisions within a second: the database tells the loader, with
// no write waiting for it.
func TestOverrideTakesEffect(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, append(engine.opts, noSync())...)
			decide := e.token("checkout", auth.Decide)
			e.limit("PerAccount", "reg_id", 1, 1, "1h")
			e.waitLimit("PerAccount")
			e.decided("spend", decide, bucket("PerAccount", "9", 1))
			if r, _ := e.decided("spend", decide, bucket("PerAccount", "9", 1)); r.Allowed {
				t.Fatal("the second spend was allowed")
			}
			e.override(obj{"limit": "PerAccount", "bucket_id": "009", "unlimited": true})
			deadline := time.Now().Add(time.Second)
			for {
				r, _ := e.decided("spend", decide, bucket("PerAccount", "9", 1))
				if r.Allowed && r.Decisions[0].Source == "unlimited" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the override does not apply after a second: %+v", r)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestWritesAreReadByTheNextDecision: once a write is answered, the next
// decision on the same process sees it, even with no change notification
// at all: the write waited for the snapshot to hold it.
func TestWritesAreReadByTheNextDecision(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, append(engine.opts, silent())...)
			decide := e.token("checkout", auth.Decide)
			e.limit("PerAccount", "reg_id", 1, 1, "1h")
			if r, _ := e.decided("spend", decide, bucket("PerAccount", "9", 1)); !r.Allowed || r.Decisions[0].Source != "default" {
				t.Fatalf("the first spend after the limit's creation: %+v", r)
			}
			o := e.override(obj{"limit": "PerAccount", "bucket_id": "009", "unlimited": true})
			if r, _ := e.decided("spend", decide, bucket("PerAccount", "9", 1)); !r.Allowed || r.Decisions[0].Source != "unlimited" {
				t.Fatalf("the spend after the override's creation: %+v", r)
			}
			e.do("PATCH", "/v1/overrides/"+o["id"].(string), e.admin, obj{"enabled": false}).expect(t, http.StatusOK)
			if r, _ := e.decided("spend", decide, bucket("PerAccount", "9", 1)); r.Allowed || r.Decisions[0].Source != "default" {
				t.Fatalf("the spend after the override's disabling: %+v", r)
			}
			e.do("DELETE", "/v1/overrides/"+o["id"].(string), e.admin, nil).expect(t, http.StatusNoContent)
			e.do("DELETE", "/v1/limits/PerAccount", e.admin, nil).expect(t, http.StatusNoContent)
			e.decide("spend", decide, bucket("PerAccount", "9", 1)).expect(t, http.StatusUnprocessableEntity)
		})
	}
}

// TestHostileDecisionBodies sends the bodies a careless or hostile client
// sends to every route on buckets, on both engines: each is a clear 4xx
// naming the field, and nothing is spent.
func TestHostileDecisionBodies(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			e.limit("PerAccount", "reg_id", 5, 5, "5s")
			e.limit("Named", "string", 5, 5, "5s")
			e.waitLimit("Named")
			cases := []struct {
				name, body string
				status     int
				// errors are the problem's field errors, exactly.
				errors map[string]string
			}{
				{"duplicate key", `{"buckets":[{"limit":"Named","bucket_id":"d","cost":5,"cost":0}]}`, 400,
					map[string]string{"buckets[0].cost": "duplicate key"}},
				{"duplicate buckets", `{"buckets":[{"limit":"Named","bucket_id":"d"}],"buckets":[]}`, 400,
					map[string]string{"buckets": "duplicate key"}},
				{"duplicate escaped key", `{"buckets":[{"limit":"Named","bucket_id":"d","bucket_\u0069d":"e"}]}`, 400,
					map[string]string{"buckets[0].bucket_id": "duplicate key"}},
				{"invalid UTF-8", "{\"buckets\":[{\"limit\":\"Named\",\"bucket_id\":\"user\xff\"}]}", 400,
					map[string]string{"buckets[0].bucket_id": "is not valid UTF-8"}},
				{"invalid UTF-8 in a key", "{\"buckets\":[{\"limit\":\"Named\",\"bucket_id\":\"d\",\"\xfe\":1}]}", 400,
					map[string]string{"buckets[0]": "is not valid UTF-8"}},
				{"invalid UTF-8 outside JSON", "{\"buckets\":[]}\xff", 400,
					map[string]string{"body": "is not valid UTF-8"}},
				{"unpaired surrogate", `{"buckets":[{"limit":"Named","bucket_id":"user\ud800"}]}`, 400,
					map[string]string{"buckets[0].bucket_id": "is not valid UTF-8"}},
				{"unpaired low surrogate", `{"buckets":[{"limit":"Named","bucket_id":"user\udc00\ud83d\ude00"}]}`, 400,
					map[string]string{"buckets[0].bucket_id": "is not valid UTF-8"}},
				{"NUL in a bucket id", `{"buckets":[{"limit":"Named","bucket_id":"a\u0000b"}]}`, 422, nil},
				{"NUL in a limit", `{"buckets":[{"limit":"Named\u0000","bucket_id":"d"}]}`, 422, nil},
				{"raw control character", "{\"buckets\":[{\"limit\":\"Named\",\"bucket_id\":\"a\x01b\"}]}", 400, nil},
				{"huge cost", `{"buckets":[{"limit":"Named","bucket_id":"d","cost":99999999999999999999}]}`, 422,
					map[string]string{"buckets[0].cost": "must be an integer from 0 to 9223372036854775807"}},
				{"huge negative cost", `{"buckets":[{"limit":"Named","bucket_id":"d","cost":-99999999999999999999}]}`, 422,
					map[string]string{"buckets[0].cost": "must be an integer from 0 to 9223372036854775807"}},
				{"negative cost", `{"buckets":[{"limit":"Named","bucket_id":"d","cost":-1}]}`, 422,
					map[string]string{"buckets[0].cost": "must be an integer from 0 to 9223372036854775807"}},
			}
			wantField := map[string]string{"NUL in a bucket id": "buckets[0].bucket_id", "NUL in a limit": "buckets[0].limit"}
			for _, op := range []string{"check", "spend", "refund"} {
				for _, c := range cases {
					t.Run(op+"/"+c.name, func(t *testing.T) {
						p := e.do("POST", "/v1/"+op, e.admin, c.body).expect(t, c.status).problem(t)
						if f, ok := wantField[c.name]; ok {
							wantFields(t, p, f)
						}
						if c.errors != nil && !maps.Equal(fieldErrors(p), c.errors) {
							t.Errorf("errors %+v, want %v", p.Errors, c.errors)
						}
					})
				}
			}
			r, _ := e.decided("check", e.admin, bucket("Named", "d", 0), bucket("Named", "user\ufffd", 0))
			for _, d := range r.Decisions {
				if d.Remaining != 5 {
					t.Errorf("a refused request spent: %+v", d)
				}
			}
		})
	}
}
