package api_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/forwardauth"
)

// echoParam matches the parameters of echo's route patterns: ":name" and
// the trailing wildcard "*".
var echoParam = regexp.MustCompile(`:([A-Za-z_]+)|\*$`)

// TestRoutesMatchSpec fails when a registered route is missing from
// openapi.yaml or an operation of openapi.yaml has no route.
func TestRoutesMatchSpec(t *testing.T) {
	e := newEnv(t)
	doc, err := openapi3.NewLoader().LoadFromData(ratelimitd.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	var registered []string
	routes := e.srv.Patterns()
	for _, p := range decide.Paths() {
		routes = append(routes, "POST "+p)
	}
	for path, methods := range forwardauth.Paths() {
		for _, m := range methods {
			registered = append(registered, m+" "+path)
		}
	}
	for _, r := range routes {
		method, path, _ := strings.Cut(r, " ")
		path = echoParam.ReplaceAllStringFunc(path, func(p string) string {
			if p == "*" {
				return "{path}"
			}
			return "{" + p[1:] + "}"
		})
		registered = append(registered, method+" "+path)
	}
	for _, r := range registered {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not in openapi.yaml", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(registered, d) {
			t.Errorf("openapi.yaml describes %s, which has no route", d)
		}
	}
}
