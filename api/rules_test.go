package api_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

func TestRules(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.limit("PerIP", "ip_address", 10, 10, "1m")
			e.limit("PerText", "string", 10, 10, "1m")
			res := e.do("POST", "/v1/rules", e.admin, obj{
				"domain": "edge", "descriptor": []obj{{"key": "remote_address"}}, "limit": "PerIP",
			}).expect(t, http.StatusCreated)
			r := res.object(t)
			id, _ := r["id"].(string)
			if loc := res.header.Get("Location"); loc != "/v1/rules/"+id || id == "" {
				t.Errorf("Location %q for %v", loc, r)
			}
			if d := r["descriptor"].([]any)[0].(map[string]any); d["key"] != "remote_address" || d["value"] != nil {
				t.Errorf("descriptor %v", r["descriptor"])
			}
			// The rule is in the snapshot when the answer comes.
			mapped := entriesOf("remote_address", "::ffff:10.0.0.1")
			if r, ok := e.limiter.Snapshot().Match("edge", mapped); !ok || r.Limit != "PerIP" || rules.BucketID(r, mapped) != "::ffff:10.0.0.1" {
				t.Errorf("Match = %+v, %v", r, ok)
			}
			e.do("POST", "/v1/rules", e.admin, obj{
				"domain": "edge", "descriptor": []obj{{"key": "remote_address"}}, "limit": "PerText",
			}).expect(t, http.StatusConflict)
			e.do("POST", "/v1/rules", e.admin, obj{
				"domain": "edge", "descriptor": []obj{{"key": "path", "value": "/api*"}, {"key": "user"}}, "limit": "PerText",
			}).expect(t, http.StatusCreated)
			modes := e.do("POST", "/v1/rules", e.admin, obj{
				"domain": "other", "descriptor": []obj{{"key": "k", "value": "v"}}, "limit": "PerText",
				"replaces": []obj{{"name": "PerIP"}}, "quota_mode": true,
			}).expect(t, http.StatusCreated).object(t)
			if rep, _ := modes["replaces"].([]any); len(rep) != 1 || rep[0].(map[string]any)["name"] != "PerIP" || modes["quota_mode"] != true {
				t.Errorf("replaces and quota_mode: %v", modes)
			}
			if r, ok := e.limiter.Snapshot().Match("other", entriesOf("k", "v")); !ok || len(r.Replaces) != 1 || !r.QuotaMode {
				t.Errorf("the snapshot's rule: %+v, %v", r, ok)
			}

			var list struct {
				Rules []struct {
					ID, Domain, Limit string
				}
			}
			e.do("GET", "/v1/rules?domain=edge", e.token("reader", auth.Decide), nil).expect(t, http.StatusOK).json(t, &list)
			if len(list.Rules) != 2 || list.Rules[0].ID != id {
				t.Errorf("edge rules %+v", list.Rules)
			}
			e.do("GET", "/v1/rules", e.admin, nil).expect(t, http.StatusOK).json(t, &list)
			if len(list.Rules) != 3 {
				t.Errorf("all rules %+v", list.Rules)
			}
			// A request descriptor looked up: the rule, limit and canonical bucket.
			m := e.do("POST", "/v1/rules/match", e.token("staff-match", auth.Support), obj{
				"domain": "edge", "descriptor": []obj{{"key": "remote_address", "value": "::ffff:10.0.0.7"}},
			}).expect(t, http.StatusOK).object(t)
			if m["limit"] != "PerIP" || m["bucket_id"] != "10.0.0.7" || m["rule"].(map[string]any)["id"] != id {
				t.Errorf("match %v", m)
			}
			e.do("POST", "/v1/rules/match", e.admin, obj{"domain": "edge", "descriptor": []obj{{"key": "nothing", "value": "x"}}}).
				expect(t, http.StatusNotFound)
			p := e.do("POST", "/v1/rules/match", e.admin, obj{"domain": "edge", "descriptor": []obj{{"key": "remote_address", "value": "nope"}}}).
				expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "descriptor")
			e.do("GET", "/v1/rules/"+id, e.admin, nil).expect(t, http.StatusOK)
			e.do("GET", "/v1/rules/nope", e.admin, nil).expect(t, http.StatusNotFound)

			// A limit used by rules cannot go.
			e.do("DELETE", "/v1/limits/PerIP", e.admin, nil).expect(t, http.StatusConflict)
			got := e.do("PATCH", "/v1/rules/"+id, e.admin, obj{"limit": "PerText"}).expect(t, http.StatusOK).object(t)
			if got["limit"] != "PerText" {
				t.Errorf("patched %v", got)
			}
			e.do("DELETE", "/v1/limits/PerIP", e.admin, nil).expect(t, http.StatusNoContent)
			e.do("DELETE", "/v1/rules/"+id, e.admin, nil).expect(t, http.StatusNoContent)
			e.do("DELETE", "/v1/rules/"+id, e.admin, nil).expect(t, http.StatusNotFound)
			if _, ok := e.limiter.Snapshot().Match("edge", entriesOf("remote_address", "10.0.0.1")); ok {
				t.Error("a deleted rule still matches")
			}

			// Only admins write; support reads.
			support := e.token("staff", auth.Support)
			e.do("POST", "/v1/rules", support, obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "PerText"}).expect(t, http.StatusForbidden)
			e.do("GET", "/v1/rules", support, nil).expect(t, http.StatusOK)
			e.do("GET", "/v1/rules", "", nil).expect(t, http.StatusUnauthorized)
		})
	}
}

func TestRulesBadInput(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.limit("PerIP", "ip_address", 10, 10, "1m")
			before := e.rows()
			invalid := func(body any, fields ...string) {
				t.Helper()
				p := e.do("POST", "/v1/rules", e.admin, body).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, fields...)
			}
			invalid(obj{"domain": "", "descriptor": []obj{}, "limit": "9"}, "domain", "descriptor", "limit")
			invalid(obj{"domain": "d\x00", "descriptor": []obj{{"key": "k\u0085"}, {"key": "", "value": ""}}, "limit": "PerIP"},
				"domain", "descriptor[0].key", "descriptor[1].key", "descriptor[1].value")
			invalid(obj{"domain": strings.Repeat("d", 257), "descriptor": []obj{{"key": "k", "value": strings.Repeat("v", 257)}}, "limit": "PerIP"},
				"domain", "descriptor[0].value")
			many := make([]obj, 17)
			for i := range many {
				many[i] = obj{"key": "k"}
			}
			invalid(obj{"domain": "d", "descriptor": many, "limit": "PerIP"}, "descriptor")
			invalid(obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "Missing"}, "limit")
			// Two free values make a bucket id only the string format takes.
			invalid(obj{"domain": "d", "descriptor": []obj{{"key": "a"}, {"key": "b"}}, "limit": "PerIP"}, "limit")
			invalid(obj{"descriptor": []obj{{"value": "v"}}}, "domain", "descriptor[0].key", "limit")
			// As envoyproxy/ratelimit: no empty replaces entry, and none
			// naming the rule's own limit.
			invalid(obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "PerIP", "replaces": []obj{{"name": "Other"}, {"name": ""}}},
				"replaces[1].name")
			invalid(obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "PerIP", "replaces": []obj{{"name": "PerIP"}}}, "replaces[0].name")

			bad := func(body string) {
				t.Helper()
				e.do("POST", "/v1/rules", e.admin, body).expect(t, http.StatusBadRequest)
			}
			bad(`{"domain":"d","domain":"e","descriptor":[{"key":"k"}],"limit":"PerIP"}`)
			bad(`{"domain":"d","descriptor":[{"key":"k","extra":1}],"limit":"PerIP"}`)
			bad("{\"domain\":\"d\xff\",\"descriptor\":[{\"key\":\"k\"}],\"limit\":\"PerIP\"}")
			bad(`{"domain":"d","descriptor":{"key":"k"},"limit":"PerIP"}`)
			bad(`{"domain":null,"descriptor":[{"key":"k"}],"limit":"PerIP"}`)
			bad(`{"domain":"d","descriptor":[{"key":1e400}],"limit":"PerIP"}`)
			e.unchanged(before)
			if rules, err := e.db.ListRules(t.Context(), ""); err != nil || len(rules) != 0 {
				t.Errorf("rules after refused requests: %v, %v", rules, err)
			}

			r := e.do("POST", "/v1/rules", e.admin, obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "PerIP"}).
				expect(t, http.StatusCreated).object(t)
			p := e.do("PATCH", "/v1/rules/"+r["id"].(string), e.admin, obj{}).expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "limit")
			e.do("PATCH", "/v1/rules/"+r["id"].(string), e.admin, obj{"limit": "PerIP", "domain": "x"}).expect(t, http.StatusBadRequest)
			// A rule may not take a limit it replaces.
			e.limit("Other", "ip_address", 10, 10, "1m")
			rr := e.do("POST", "/v1/rules", e.admin, obj{"domain": "d", "descriptor": []obj{{"key": "r"}}, "limit": "PerIP", "replaces": []obj{{"name": "Other"}}}).
				expect(t, http.StatusCreated).object(t)
			p = e.do("PATCH", "/v1/rules/"+rr["id"].(string), e.admin, obj{"limit": "Other"}).expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "limit")
		})
	}
}

// TestRuleRacesLimitDeletion: a rule created while its limit is deleted
// either exists with its limit, or neither does; never a rule without a
// limit, and never a 5xx.
func TestRuleRacesLimitDeletion(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			for range 10 {
				e.limit("L", "string", 10, 10, "1m")
				var wg sync.WaitGroup
				var create, del *response
				wg.Go(func() {
					create = e.do("POST", "/v1/rules", e.admin, obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "L"})
				})
				wg.Go(func() { del = e.do("DELETE", "/v1/limits/L", e.admin, nil) })
				wg.Wait()
				switch {
				case create.status == http.StatusCreated && del.status == http.StatusConflict:
					e.do("DELETE", "/v1/rules/"+create.object(t)["id"].(string), e.admin, nil).expect(t, http.StatusNoContent)
					e.do("DELETE", "/v1/limits/L", e.admin, nil).expect(t, http.StatusNoContent)
				case create.status == http.StatusUnprocessableEntity && del.status == http.StatusNoContent:
				default:
					t.Fatalf("create %d %s, delete %d %s", create.status, create.body, del.status, del.body)
				}
			}
		})
	}
}

// entriesOf makes a request descriptor of keys and values.
func entriesOf(kv ...string) []limiter.DescriptorEntry {
	var out []limiter.DescriptorEntry
	for i := 0; i < len(kv); i += 2 {
		out = append(out, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestEnvoyImportExport(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			doc := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n" +
				"  - key: remote_address\n    value: 10.0.0.9\n    rate_limit: {unlimited: true}\n"
			yaml := func(method, path, body string) *response {
				return e.do(method, path, e.admin, body, "Content-Type", "application/yaml")
			}
			got := yaml("POST", "/v1/import?kind=envoy&dry_run=true", doc).expect(t, http.StatusOK).object(t)
			if got["created"] != float64(3) {
				t.Errorf("dry run %v", got)
			}
			got = yaml("POST", "/v1/import?kind=envoy", doc).expect(t, http.StatusOK).object(t)
			if got["created"] != float64(3) {
				t.Errorf("import %v", got)
			}
			if r, ok := e.limiter.Snapshot().Match("edge", entriesOf("remote_address", "10.0.0.9")); !ok || r.Limit != "edge.remote_address" {
				t.Errorf("imported rule %+v, %v", r, ok)
			}
			out := e.do("GET", "/v1/export?kind=envoy&domain=edge", e.admin, nil).expect(t, http.StatusOK)
			got = yaml("POST", "/v1/import?kind=envoy", string(out.body)).expect(t, http.StatusOK).object(t)
			if got["unchanged"] != float64(3) {
				t.Errorf("the export imports as %v:\n%s", got, out.body)
			}
			p := yaml("POST", "/v1/import?kind=envoy", "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").
				expect(t, http.StatusUnprocessableEntity).object(t)
			if errs := p["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["line"] != float64(4) {
				t.Errorf("errors %v", p["errors"])
			}
			// A file without the rule: the answer lists it as it was.
			got = yaml("POST", "/v1/import?kind=envoy", "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1}\n").
				expect(t, http.StatusOK).object(t)
			if removed, _ := got["removed"].([]any); len(removed) != 1 || removed[0].(map[string]any)["limit"] != "edge.remote_address" {
				t.Errorf("removed %v", got["removed"])
			}
			wantFields(t, e.do("GET", "/v1/export?kind=envoy", e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t), "domain")
			wantFields(t, e.do("GET", "/v1/export?kind=defaults&domain=edge", e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t), "domain")
		})
	}
}

// TestEnvoyMergeImport adds a file to a domain's rules through the API,
// refuses the same file again with its line and writes nothing, and
// refuses merge where it means nothing, on both engines.
func TestEnvoyMergeImport(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			first := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
			second := "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
			e.importYAML("kind=envoy", first).expect(t, http.StatusOK)
			got := e.importYAML("kind=envoy&merge=true", second).expect(t, http.StatusOK).object(t)
			if got["created"] != float64(2) || got["removed"] != nil {
				t.Errorf("merge: %v", got)
			}
			for _, entries := range [][]limiter.DescriptorEntry{entriesOf("remote_address", "10.0.0.1"), entriesOf("path", "/login")} {
				if _, ok := e.limiter.Snapshot().Match("edge", entries); !ok {
					t.Errorf("after the merge %v matches no rule", entries)
				}
			}
			before := e.rows()
			var res importResult
			e.importYAML("kind=envoy&merge=true", first).expect(t, http.StatusUnprocessableEntity).json(t, &res)
			if len(res.Errors) != 1 || res.Errors[0].Line != 3 || !strings.Contains(res.Errors[0].Message, "has this descriptor already") {
				t.Errorf("a merge of a descriptor the domain has: %+v", res.Errors)
			}
			for _, query := range []string{"kind=defaults&merge=true", "kind=envoy&merge=maybe", "kind=overrides&merge=true&dry_run=true"} {
				wantFields(t, e.importYAML(query, first).expect(t, http.StatusUnprocessableEntity).problem(t), "merge")
			}
			e.unchanged(before)
			if n := len(e.limiter.Snapshot().Rules()); n != 2 {
				t.Errorf("%d rules after refused merges, want 2", n)
			}
		})
	}
}
