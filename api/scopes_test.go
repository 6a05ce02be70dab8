package api_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/auth"
)

// protected lists every /v1/ route with the scopes that may use it, besides
// admin, which may use all.
var protected = []struct {
	method, path string
	scopes       []auth.Scope
}{
	{"GET", "/v1/whoami", []auth.Scope{auth.Support, auth.Decide}},
	{"GET", "/v1/status", []auth.Scope{auth.Support, auth.Decide}},
	{"POST", "/v1/tokens", nil},
	{"GET", "/v1/tokens", nil},
	{"GET", "/v1/tokens/:id", nil},
	{"DELETE", "/v1/tokens/:id", nil},
	{"PUT", "/v1/limits/:name", nil},
	{"GET", "/v1/limits", []auth.Scope{auth.Support, auth.Decide}},
	{"GET", "/v1/limits/:name", []auth.Scope{auth.Support, auth.Decide}},
	{"DELETE", "/v1/limits/:name", nil},
	{"POST", "/v1/overrides", []auth.Scope{auth.Support}},
	{"GET", "/v1/overrides", []auth.Scope{auth.Support}},
	{"GET", "/v1/overrides/:id", []auth.Scope{auth.Support}},
	{"PATCH", "/v1/overrides/:id", []auth.Scope{auth.Support}},
	{"DELETE", "/v1/overrides/:id", []auth.Scope{auth.Support}},
	{"GET", "/v1/overrides/:id/history", []auth.Scope{auth.Support}},
	{"POST", "/v1/rules", nil},
	{"GET", "/v1/rules", []auth.Scope{auth.Support, auth.Decide}},
	{"POST", "/v1/rules/match", []auth.Scope{auth.Support, auth.Decide}},
	{"GET", "/v1/rules/:id", []auth.Scope{auth.Support, auth.Decide}},
	{"PATCH", "/v1/rules/:id", nil},
	{"DELETE", "/v1/rules/:id", nil},
	{"POST", "/v1/import", nil},
	{"GET", "/v1/export", nil},
	{"POST", "/v1/check", []auth.Scope{auth.Decide, auth.Support}},
	{"POST", "/v1/spend", []auth.Scope{auth.Decide}},
	{"POST", "/v1/refund", []auth.Scope{auth.Decide}},
	{"POST", "/v1/settle", []auth.Scope{auth.Decide}},
	{"POST", "/v1/buckets/reset", []auth.Scope{auth.Support}},
	{"POST", "/v1/acquire", []auth.Scope{auth.Decide}},
	{"POST", "/v1/release", []auth.Scope{auth.Decide}},
	{"POST", "/v1/renew", []auth.Scope{auth.Decide}},
	{"POST", "/v1/decisions", []auth.Scope{auth.Decide}},
}

// TestScopes sends every protected route no token, an unknown one, a
// revoked one and a token of every scope: 401 for the first three, 403 for
// a scope the route does not allow, and something else for the rest.
func TestScopes(t *testing.T) {
	e := newEnv(t)
	var routes []string
	for _, r := range e.srv.Patterns() {
		if strings.Contains(r, " /v1/") {
			routes = append(routes, r)
		}
	}
	for _, p := range decide.Paths() {
		routes = append(routes, "POST "+p)
	}
	for _, p := range protected {
		routes = slices.DeleteFunc(routes, func(r string) bool { return r == p.method+" "+p.path })
	}
	if len(routes) > 0 {
		t.Fatalf("routes missing from this test: %v", routes)
	}

	tokens := map[auth.Scope]string{
		auth.Admin:   e.admin,
		auth.Support: e.token("support", auth.Support),
		auth.Decide:  e.token("decide", auth.Decide),
	}
	revoked := e.token("revoked", auth.Admin)
	all, err := e.db.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	e.do("DELETE", "/v1/tokens/"+all[len(all)-1].ID, e.admin, nil).expect(t, http.StatusNoContent)

	for _, p := range protected {
		path := strings.NewReplacer(":id", "someid", ":name", "SomeLimit").Replace(p.path)
		for _, token := range []string{"", "rlt_unknown", revoked} {
			res := e.do(p.method, path, token, nil, "Authorization", authorization(token))
			res.expect(t, http.StatusUnauthorized)
			if res.header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s: 401 without WWW-Authenticate", p.method, path)
			}
			res.problem(t)
		}
		for scope, token := range tokens {
			res := e.do(p.method, path, token, nil)
			allowed := scope == auth.Admin || slices.Contains(p.scopes, scope)
			switch {
			case allowed && (res.status == http.StatusUnauthorized || res.status == http.StatusForbidden):
				t.Errorf("%s %s with %s: %d", p.method, path, scope, res.status)
			case !allowed && res.status != http.StatusForbidden:
				t.Errorf("%s %s with %s: %d, want 403", p.method, path, scope, res.status)
			}
		}
	}
}

// authorization is the header for token; a malformed one when it is empty.
func authorization(token string) string {
	if token == "" {
		return "Basic dXNlcjpwYXNz"
	}
	return "Bearer " + token
}
