package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// testStoreTimeout bounds the Redis stores' calls in these tests. They test
// decisions, not the fail mode, and a shared machine under -race can hold
// a burst of concurrent script calls past the 250 ms default: those 503s
// were no finding of the test (TestConcurrentSettles failed so on a clean
// clone). The fail mode's timings are tested in e2e.
const testStoreTimeout = 10 * time.Second

// stores are the bucket stores a limit's identity is tested on; nil is
// the in-process store newEnv makes.
var stores = []struct {
	name  string
	store func(t *testing.T) limiter.Store
}{
	{"memstore", func(*testing.T) limiter.Store { return nil }},
	{"redis", func(t *testing.T) limiter.Store {
		return redisstore.New(testenv.Redis(t), redisstore.Options{Prefix: testenv.RandomName("rltest:") + ":", Timeout: testStoreTimeout})
	}},
	{"cluster", func(t *testing.T) limiter.Store {
		opts, err := redisstore.ParseURL("redis+cluster://" + strings.Join(testenv.RedisCluster(t), ","))
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewUniversalClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		return redisstore.New(c, redisstore.Options{Prefix: testenv.RandomName("rltest:") + ":", Timeout: testStoreTimeout})
	}},
}

// TestRecreatedLimitStartsFull deletes limits whose buckets are empty, and
// denied from the denied cache, and creates them again under the old name
// or another: the new limits start with full buckets.
func TestRecreatedLimitStartsFull(t *testing.T) {
	for _, eng := range engines {
		for _, st := range stores {
			t.Run(eng.name+"/"+st.name, func(t *testing.T) {
				opts := eng.opts
				if s := st.store(t); s != nil {
					opts = append(opts[:len(opts):len(opts)], withStore(s))
				}
				e := newEnv(t, opts...)
				daily := obj{"id_format": "string", "burst": 1, "count": 1, "period": "24h"}
				exhaust := func(limit, id string) {
					t.Helper()
					if r, _ := e.decided("spend", e.admin, bucket(limit, id, 1)); !r.Allowed {
						t.Fatalf("first spend of %s/%s denied: %+v", limit, id, r)
					}
					// Twice denied: the second answer comes from the
					// denied cache.
					for range 2 {
						if r, _ := e.decided("spend", e.admin, bucket(limit, id, 1)); r.Allowed {
							t.Fatalf("spend of an empty %s/%s allowed", limit, id)
						}
					}
				}
				full := func(limit, id string, remaining int64) {
					t.Helper()
					r, _ := e.decided("spend", e.admin, bucket(limit, id, 1))
					if !r.Allowed || r.Decisions[0].Remaining != remaining {
						t.Errorf("first spend of the new %s/%s = %+v; want allowed with %d remaining", limit, id, r, remaining)
					}
				}
				remove := func(name string) {
					t.Helper()
					e.do("DELETE", "/v1/limits/"+name, e.admin, nil).expect(t, http.StatusNoContent)
				}

				// The reproduction: another limit.
				old := e.putLimit("OldA", daily)
				exhaust("OldA", "alice")
				remove("OldA")
				b := e.putLimit("NewB", obj{"id_format": "string", "burst": 100, "count": 100, "period": "1s"})
				if b["enum"] == old["enum"] {
					t.Errorf("NewB got OldA's enum %v", old["enum"])
				}
				full("NewB", "alice", 99)

				// The same name again.
				e.putLimit("OldA", daily)
				full("OldA", "alice", 0)

				// A catalogue name, which gets its enum again.
				catalogued := obj{"id_format": "reg_id", "burst": 1, "count": 1, "period": "24h"}
				e.putLimit("NewOrdersPerAccount", catalogued)
				exhaust("NewOrdersPerAccount", "123")
				remove("NewOrdersPerAccount")
				if l := e.putLimit("NewOrdersPerAccount", catalogued); l["enum"] != float64(3) {
					t.Errorf("NewOrdersPerAccount created again with enum %v, want 3", l["enum"])
				}
				full("NewOrdersPerAccount", "123", 0)
			})
		}
	}
}

// TestEnumsThroughTheAPI reproduces the enum answers the issue found wrong,
// on both engines: a retired enum, the largest enum, catalogue numbers.
func TestEnumsThroughTheAPI(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			body := func(enum any) obj {
				b := obj{"id_format": "string", "burst": 1, "count": 1, "period": "1s"}
				if enum != nil {
					b["enum"] = enum
				}
				return b
			}
			refused := func(name string, enum any) {
				t.Helper()
				before := e.rows()
				p := e.do("PUT", "/v1/limits/"+name, e.admin, body(enum)).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, "enum")
				e.unchanged(before)
			}

			// The largest enum, then one assigned: no overflow, no 5xx.
			if l := e.putLimit("A", body(limiter.MaxEnum)); l["enum"] != float64(limiter.MaxEnum) {
				t.Errorf("A has enum %v", l["enum"])
			}
			if l := e.putLimit("B", body(nil)); l["enum"] != float64(limiter.FirstAssignedEnum) {
				t.Errorf("B has enum %v, want %d", l["enum"], limiter.FirstAssignedEnum)
			}
			e.putLimit("C", body(nil)) // still loadable: the snapshot takes it
			e.waitLimit("C")

			// A deleted limit's enum stays retired.
			e.do("DELETE", "/v1/limits/B", e.admin, nil).expect(t, http.StatusNoContent)
			refused("B", limiter.FirstAssignedEnum)
			refused("Other", limiter.FirstAssignedEnum)
			if l := e.putLimit("B", body(nil)); l["enum"] == float64(limiter.FirstAssignedEnum) {
				t.Errorf("B created again with its retired enum")
			}

			// Catalogue numbers go to their names only.
			refused("MyLimit", 3)
			refused("NewOrdersPerAccount", 4)
			cat := obj{"id_format": "reg_id", "burst": 1, "count": 1, "period": "1s"}
			if l := e.putLimit("NewOrdersPerAccount", cat); l["enum"] != float64(3) {
				t.Errorf("NewOrdersPerAccount has enum %v, want 3", l["enum"])
			}
		})
	}
}

// TestOverrideRacesIDFormatChange creates an override while its limit's id
// format changes, many times: whatever order the two writes take, the
// stored override's bucket id is canonical under the limit's format as
// stored, and the format change is refused once the override exists.
func TestOverrideRacesIDFormatChange(t *testing.T) {
	const raw = "WWW.Example.co.uk"
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			for i := range 20 {
				name := fmt.Sprint("L", i)
				e.putLimit(name, obj{"id_format": "domain_or_cidr", "burst": 1, "count": 1, "period": "1s"})
				var wg sync.WaitGroup
				var created, changed *response
				wg.Go(func() {
					created = e.do("POST", "/v1/overrides", e.admin, obj{"limit": name, "bucket_id": raw, "unlimited": true})
				})
				wg.Go(func() {
					changed = e.do("PUT", "/v1/limits/"+name, e.admin, obj{"id_format": "domain", "burst": 1, "count": 1, "period": "1s"})
				})
				wg.Wait()
				created.expect(t, http.StatusCreated)
				if changed.status != http.StatusOK && changed.status != http.StatusConflict {
					t.Fatalf("PUT: %d %s", changed.status, changed.body)
				}
				l, err := e.db.GetLimit(context.Background(), name)
				if err != nil {
					t.Fatal(err)
				}
				want, err := bucketid.CanonicalOverride(l.IDFormat, raw)
				if err != nil {
					t.Fatal(err)
				}
				if got := created.object(t)["bucket_id"]; got != want {
					t.Errorf("trial %d: override stored as %v under a %s limit, where %s is %q", i, got, l.IDFormat, raw, want)
				}
			}
		})
	}
}
