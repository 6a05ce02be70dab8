package ratelimitd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is this repository's module path; rules name its packages
// relative to it, with a leading "./".
const module = "github.com/ratelimitd/ratelimitd"

// importRule says that the packages matching pkg must not depend, directly
// or through another package, on anything matching forbid but not allow,
// unless the package also matches except. A pattern ending in "/..."
// covers a package and every package below it, so that rules keep applying
// to packages added later (api/decide, say); nonStd covers every package
// outside the standard library. Only the code that is built counts: a
// _test.go file may import what it needs to test.
type importRule struct {
	pkg    string
	forbid []string
	allow  []string
	except []string
	why    string
}

// nonStd is the pattern of every package outside the standard library:
// those whose first path element holds a dot (a domain), this module's
// included. The standard library's own vendored packages (vendor/...) are
// not.
const nonStd = "<not the standard library>"

// importRules are the dependency rules of the house style: dependencies
// point inward, and only cmd knows the concrete types.
var importRules = []importRule{
	{pkg: "./limiter", forbid: []string{nonStd},
		why: "the engine imports the standard library only; it is handed what it needs of bucketid and rules (limiter.Parsers)"},
	{pkg: "./limiter/...", forbid: []string{"./api/...", "./cmd/...", "./db/..."},
		why: "the stores import limiter, never the API, the database or the wiring"},
	{pkg: "./limiter/...", forbid: []string{"./limiter/bucketid", "./limiter/rules"},
		except: []string{"./limiter/bucketid", "./limiter/rules"},
		why:    "id formats and rules are leaves: neither the engine nor its stores import them"},
	{pkg: "./limiter/bucketid", forbid: []string{nonStd},
		allow: []string{"./limiter", "golang.org/x/net/idna", "golang.org/x/net/publicsuffix", "golang.org/x/text/..."},
		why:   "the id formats import the engine's vocabulary, IDNA and the public suffix list, nothing else"},
	{pkg: "./client/clientip", forbid: []string{nonStd},
		why: "the client address through trusted proxies is shared by the server's forward auth and the services' client, so it imports the standard library only"},
	{pkg: "./client/...", forbid: serverDeps,
		why: "services build the Go client into their own binaries, which must not carry the server's dependencies"},
	{pkg: "./limiter/rules", forbid: []string{nonStd}, allow: []string{"./limiter"},
		why: "the rules import the engine's vocabulary, nothing else"},
	{pkg: "./db/...", forbid: []string{"./api/...", "./cmd/..."},
		why: "the database layer imports limiter, never the API or the wiring"},
	{pkg: "./api/...", forbid: []string{
		"./db/...", "./migrations/...", "./limiter/memstore", "./limiter/redisstore",
		"github.com/jackc/pgx/...", "github.com/redis/go-redis/...", "modernc.org/sqlite/...",
	},
		why: "the API declares the interfaces it consumes; cmd passes it the concrete types"},
	{pkg: "./api/...", forbid: []string{"./internal/telemetry", "github.com/prometheus/..."},
		why: "the front ends see the narrow observer interfaces they declare; cmd wires telemetry to them"},
	{pkg: "./api/...", forbid: []string{"go.opentelemetry.io/..."},
		why: "the front ends take tracing as hooks, nil when it is off, that cmd hands them from internal/telemetry"},
	{pkg: "./limiter/...", forbid: []string{"go.opentelemetry.io/..."},
		why: "the engine and the stores take tracing as a hook in limiter.Config, nil when it is off"},
	{pkg: "./api/decide/...", forbid: []string{"./api", "./limitfile/...", "./loader/...", "github.com/labstack/echo/..."},
		why: "the decision routes share the edge (api/problem) with the admin API, never the admin API itself"},
	{pkg: "./api/rls/...", forbid: []string{"./api", "./limitfile/...", "./loader/...", "github.com/labstack/echo/..."},
		why: "Envoy's front shares the edge (api/problem) with the admin API, never the admin API itself"},
	{pkg: "./api/forwardauth/...", forbid: []string{"./api", "./api/rls/...", "./limitfile/...", "./loader/...", "github.com/labstack/echo/..."},
		why: "the gateways' front shares the edge and the matcher of descriptors with the others, never the admin API or Envoy's front"},
	{pkg: "./api/descriptor", forbid: []string{"./api/...", "./limitfile/...", "./loader/...", "github.com/labstack/echo/...", "google.golang.org/..."},
		why: "the one matcher of descriptors serves Envoy's front and forward auth alike, so it knows neither protocol nor the admin API"},
	{pkg: "./api/problem", forbid: []string{"github.com/labstack/echo/..."},
		why: "the one edge serves every HTTP stack, so it knows none of them"},
	{pkg: "./internal/telemetry", forbid: []string{"./api/...", "./db/...", "./cmd/..."},
		why: "telemetry is wired by cmd into the front ends, and knows none of them"},
	{pkg: "./...", forbid: []string{"./api/..."}, except: []string{"./api/...", "./cmd/..."},
		why: "only cmd wires the API to the concrete types"},
	{pkg: "./...", forbid: []string{"./limiter/storetest", "./internal/testenv", "./client/internal/fakeratelimitd"},
		except: []string{"./limiter/storetest", "./internal/testenv", "./client/internal/fakeratelimitd"},
		why:    "test helpers are imported by _test.go files only"},
}

// serverDeps are the dependencies of the server that a service importing
// the Go client must not get: the database drivers and migrations, the
// Redis client, the admin API's framework, the OpenTelemetry SDK and
// Prometheus.
var serverDeps = []string{
	"github.com/jackc/pgx/...", "modernc.org/sqlite/...", "github.com/pressly/goose/...",
	"github.com/redis/go-redis/...", "github.com/labstack/echo/...",
	"go.opentelemetry.io/otel/sdk/...", "github.com/prometheus/...",
}

// clientModule is the directory of the Go client's module, nested in this
// one: `go list ./...` here does not descend into it, so the rules list
// its packages there.
const clientModule = "client"

// listedPackage is what `go list -json` says of a package that the rules
// read.
type listedPackage struct {
	ImportPath string
	Deps       []string
}

// TestImportRules fails when a package of this module or of the client's
// depends on one the house style keeps it from, so that the layering
// cannot drift.
func TestImportRules(t *testing.T) {
	var pkgs []listedPackage
	for _, dir := range []string{".", clientModule} {
		out := goCommand(t, "-C", dir, "list", "-json=ImportPath,Deps", "./...")
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p listedPackage
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("decoding go list: %v", err)
			}
			pkgs = append(pkgs, p)
		}
	}
	for _, r := range importRules {
		if !slices.ContainsFunc(pkgs, func(p listedPackage) bool { return matches(r.pkg, p.ImportPath) }) {
			t.Errorf("rule %q: no package matches %s; update the rule after a move", r.why, r.pkg)
		}
	}
	for _, v := range importViolations(pkgs, importRules) {
		t.Error(v)
	}
}

// TestClientModuleRequires fails when the client module's go.mod requires
// one of the server's dependencies, or the server's module: a service that
// requires the client would get them in its module graph, and a test of
// the client could import them unseen by TestImportRules, which reads what
// is built.
func TestClientModuleRequires(t *testing.T) {
	var mod struct {
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(goCommand(t, "-C", clientModule, "mod", "edit", "-json"), &mod); err != nil {
		t.Fatalf("decoding go mod edit -json: %v", err)
	}
	if len(mod.Require) == 0 {
		t.Fatal("client/go.mod requires nothing: was it read?")
	}
	for _, r := range mod.Require {
		if r.Path == module || slices.ContainsFunc(serverDeps, func(f string) bool { return matches(f, r.Path) }) {
			t.Errorf("client/go.mod requires %s, which a service requiring the client must not get", r.Path)
		}
	}
}

// goCommand runs the go command with args and returns its standard output,
// failing the test with its standard error.
func goCommand(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, exit.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// TestImportViolations shows that the check reports a forbidden dependency,
// direct or indirect, and honours the exceptions.
func TestImportViolations(t *testing.T) {
	pkgs := []listedPackage{
		{ImportPath: module + "/api/decide", Deps: []string{"context", "github.com/jackc/pgx/v5/pgconn"}},
		{ImportPath: module + "/limiter", Deps: []string{"errors", "vendor/golang.org/x/net/idna", module + "/loader", "golang.org/x/net/idna"}},
		{ImportPath: module + "/limiter/bucketid", Deps: []string{"golang.org/x/net/idna", "golang.org/x/text/unicode/norm", module + "/limiter", module + "/limiter/rules", "golang.org/x/sys/cpu"}},
		{ImportPath: module + "/limiter/memstore", Deps: []string{module + "/limiter", module + "/limiter/bucketid"}},
		{ImportPath: module + "/limiter/rules", Deps: []string{"strings", module + "/limiter"}},
		{ImportPath: module + "/cmd/ratelimitd", Deps: []string{module + "/api", module + "/db"}},
		{ImportPath: module + "/loader", Deps: []string{module + "/limiter", module + "/limiter/bucketid", module + "/limiter/rules"}},
	}
	got := importViolations(pkgs, importRules)
	const engine = ": the engine imports the standard library only; it is handed what it needs of bucketid and rules (limiter.Parsers)"
	const leaves = ": id formats and rules are leaves: neither the engine nor its stores import them"
	const ids = ": the id formats import the engine's vocabulary, IDNA and the public suffix list, nothing else"
	want := []string{
		module + "/api/decide depends on github.com/jackc/pgx/v5/pgconn: the API declares the interfaces it consumes; cmd passes it the concrete types",
		module + "/limiter depends on " + module + "/loader" + engine,
		module + "/limiter depends on golang.org/x/net/idna" + engine,
		module + "/limiter/bucketid depends on " + module + "/limiter/rules" + ids,
		module + "/limiter/bucketid depends on golang.org/x/sys/cpu" + ids,
		module + "/limiter/memstore depends on " + module + "/limiter/bucketid" + leaves,
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// importViolations lists, in package order, each dependency that breaks a
// rule.
func importViolations(pkgs []listedPackage, rules []importRule) []string {
	var out []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !matches(r.pkg, p.ImportPath) || slices.ContainsFunc(r.except, func(e string) bool { return matches(e, p.ImportPath) }) {
				continue
			}
			for _, d := range p.Deps {
				if slices.ContainsFunc(r.forbid, func(f string) bool { return matches(f, d) }) &&
					!slices.ContainsFunc(r.allow, func(a string) bool { return matches(a, d) }) {
					out = append(out, p.ImportPath+" depends on "+d+": "+r.why)
				}
			}
		}
	}
	return out
}

// matches reports whether the import path fits the pattern: "./" stands
// for the module, a trailing "/..." takes in the packages below, and
// nonStd every package outside the standard library.
func matches(pattern, path string) bool {
	if pattern == nonStd {
		first, _, _ := strings.Cut(path, "/")
		return strings.Contains(first, ".")
	}
	if rest, ok := strings.CutPrefix(pattern, "./"); ok {
		pattern = module + "/" + rest
	}
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == prefix || strings.HasPrefix(path, prefix+"/")
	}
	return path == pattern
}
