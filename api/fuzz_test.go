package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// FuzzDecisionHandlers sends arbitrary bodies to the decision, lease,
// bulk, override, limit, reset and token routes of a whole service: no
// answer may be a 5xx (a panic is one), nor any request of /v1/decisions,
// every answer must match openapi.yaml, and an error never carries a
// decision.
func FuzzDecisionHandlers(f *testing.F) {
	e := newEnv(f)
	e.leaseLimit("Calls", 3, "30s")
	e.quota("Daily", "day", "Europe/Paris", 10)
	e.limit("PerAccount", "reg_id", 5, 5, "1s")
	e.limit("PerName", "domain_or_cidr", 5, 5, "1s")
	e.putLimit("Shadowed", obj{"id_format": "fqdn_set", "burst": 1, "count": 1, "period": "1h", "shadow": true})
	o := e.override(obj{"limit": "PerAccount", "bucket_id": "666", "burst": 0, "count": 1, "period": "1s"})
	e.override(obj{"limit": "Calls", "bucket_id": "wide", "burst": 10, "period": "1m"})
	e.override(obj{"limit": "Daily", "bucket_id": "blocked", "count": 0})
	// The write routes that take JSON bodies.
	fuzzTargets := []struct{ method, path string }{
		{"POST", "/v1/spend"},
		{"POST", "/v1/check"},
		{"POST", "/v1/refund"},
		{"POST", "/v1/overrides"},
		{"PUT", "/v1/limits/Fuzzed"},
		{"POST", "/v1/buckets/reset"},
		{"PATCH", "/v1/overrides/" + o["id"].(string)},
		{"POST", "/v1/tokens"},
		{"POST", "/v1/acquire"},
		{"POST", "/v1/release"},
		{"POST", "/v1/renew"},
		{"POST", "/v1/decisions"},
	}
	lease := limiter.NewLeaseID()
	seeds := []string{
		`{"buckets":[{"limit":"PerAccount","bucket_id":"12345678","cost":1}]}`,
		`{"buckets":[{"limit":"PerName","bucket_id":"WWW.Example.co.uk","cost":3},{"limit":"Shadowed","bucket_id":"b.example,a.example"}]}`,
		`{"buckets":[{"limit":"PerAccount","bucket_id":"666"},{"limit":"PerName","bucket_id":"2001:db8::1"}]}`,
		`{"buckets":[{"limit":"PerAccount","bucket_id":"1","cost":-1},{"limit":"Nope","bucket_id":"1"}]}`,
		`{"buckets":[{"limit":"PerAccount","bucket_id":"1","cost":1e999}]}`,
		`{"limit":"PerAccount","bucket_id":"0042","burst":1,"count":1,"period":"1s","comment":"ü","expires_at":"2999-01-01T00:00:00Z"}`,
		`{"limit":"PerName","bucket_id":"192.0.2.1/32","unlimited":true,"enabled":false,"expires_at":null}`,
		`{"id_format":"string","burst":1,"count":1,"period":"1ms","description":"x","shadow":true,"enum":7}`,
		`{"id_format":"reg_id","burst":9223372036854775807,"count":1,"period":"2562047h"}`,
		`{"name":"Fuzzed","id_format":"ip_address","burst":1,"count":1000,"period":"1ms"}`,
		`{"burst":5,"expires_at":null,"unlimited":false,"comment":"\u2028"}`,
		`{"name":"fuzz","scope":"decide"}`,
		`{"buckets":[{"limit":"Calls","bucket_id":"a","cost":2}],"ttl_ms":1000}`,
		`{"buckets":[{"limit":"Calls","bucket_id":"a"},{"limit":"PerAccount","bucket_id":"1"}],"ttl_ms":0}`,
		`{"buckets":[{"limit":"Daily","bucket_id":"a","cost":4},{"limit":"Daily","bucket_id":"blocked"}]}`,
		`{"buckets":[{"limit":"Calls","bucket_id":"wide","cost":10}],"ttl_ms":60000}`,
		`{"id_format":"string","kind":"concurrency","burst":2,"period":"1s"}`,
		`{"id_format":"string","calendar":"month","time_zone":"Pacific/Chatham","count":1}`,
		`{"limit":"Daily","bucket_id":"b","count":5}`,
		`{"limit":"Calls","bucket_id":"b","burst":1,"period":"24h"}`,
		`{"lease_id":"` + lease + `"}`,
		`{"lease_id":"` + lease + `","ttl_ms":99999999999999999999}`,
		`{"requests":[{"op":"spend","buckets":[{"limit":"PerAccount","bucket_id":"1"}]},{"buckets":[{"limit":"Calls","bucket_id":"a"}],"op":"check"}]}`,
		`{"requests":[{"op":"settle","buckets":[{"limit":"Daily","bucket_id":"a","reserved":1,"actual":3}]},{"op":"acquire","buckets":[{"limit":"Calls","bucket_id":"a"}],"ttl_ms":5}]}`,
		`{"requests":[{"op":"renew","lease_id":"` + lease + `"},{"op":"release","lease_id":"x"},{"op":"frob"},5]}`,
		`[]`, `null`, `{`, ``, `{"buckets":[{}]}`,
	}
	for i, s := range seeds {
		for j := range fuzzTargets {
			if (i+j)%2 == 0 {
				f.Add(uint8(j), []byte(s))
			}
		}
	}
	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		e := e.withT(t)
		route := fuzzTargets[int(target)%len(fuzzTargets)]
		res := e.do(route.method, route.path, e.admin, body)
		if res.status >= 500 {
			t.Fatalf("%s %s %q: %d %s", route.method, route.path, body, res.status, res.body)
		}
		if res.status < 300 {
			// Nor may a request of /v1/decisions be a 5xx.
			if strings.Contains(string(res.body), `"status":5`) {
				t.Fatalf("%s %q: %s", route.path, body, res.body)
			}
			return
		}
		p := res.problem(t)
		if p.Status != res.status {
			t.Fatalf("problem status %d in a %d", p.Status, res.status)
		}
		var fields map[string]json.RawMessage
		res.json(t, &fields)
		if _, ok := fields["allowed"]; ok || strings.Contains(string(fields["decisions"]), "allowed") {
			t.Fatalf("an error carries a decision: %s", res.body)
		}
		if res.status == http.StatusBadRequest || res.status == http.StatusUnprocessableEntity {
			if len(p.Errors) == 0 && res.status == http.StatusUnprocessableEntity {
				t.Fatalf("a 422 names no field: %s", res.body)
			}
		}
	})
}
