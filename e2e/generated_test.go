//go:build linux

package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// moduleRoot is where openapi.yaml, go.mod and node_modules are; tests
// run in e2e/.
const moduleRoot = ".."

// TestGeneratedGoClient generates a Go client from openapi.yaml with
// oapi-codegen's default settings (the package name and output file are
// all its configuration says) and runs testdata/tour/main.go with it
// against a fresh service: the README's tour and what a client author
// tripped over (a PATCH sending expires_at null, YAML in and out, the
// import's 422, a path that is no limit name).
func TestGeneratedGoClient(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pkg := filepath.Join(dir, "ratelimitd")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "oapi-codegen.yaml")
	writeFile(t, config, "package: ratelimitd\noutput: "+filepath.Join(pkg, "client.gen.go")+"\ngenerate:\n  models: true\n  client: true\n")
	// The generator is the version go.mod pins as a tool.
	run(t, exec.Command("go", "tool", "oapi-codegen", "-config", config, "openapi.yaml"), moduleRoot)

	// A module of its own, requiring what this one does, so that the
	// client builds with the versions this repository is tested with.
	mod, err := os.ReadFile(filepath.Join(moduleRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	first, rest, _ := strings.Cut(string(mod), "\n")
	if !strings.HasPrefix(first, "module ") {
		t.Fatalf("go.mod begins with %q, not its module", first)
	}
	// The replace directive of the client's module names it relative to
	// the repository, which the copy is not in.
	clientDir, err := filepath.Abs(filepath.Join(moduleRoot, "client"))
	if err != nil {
		t.Fatal(err)
	}
	rest = strings.ReplaceAll(rest, "=> ./client", "=> "+clientDir)
	writeFile(t, filepath.Join(dir, "go.mod"), "module tour\n"+rest)
	copyFile(t, filepath.Join(moduleRoot, "go.sum"), filepath.Join(dir, "go.sum"))
	copyFile(t, filepath.Join("testdata", "tour", "main.go"), filepath.Join(dir, "main.go"))
	run(t, exec.Command("go", "build", "-o", "tour", "."), dir)

	tour := exec.Command(filepath.Join(dir, "tour"))
	tour.Env = tourEnv(t)
	t.Log(run(t, tour, dir))
}

// TestGeneratedTypeScriptClient generates TypeScript types from
// openapi.yaml with openapi-typescript's default settings, compiles
// testdata/tour/tour.ts, which calls the service through openapi-fetch,
// with tsc --strict, and runs it with node against a fresh service. The
// tools are the versions package-lock.json pins (npm ci installs them).
func TestGeneratedTypeScriptClient(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Unavailable(t, "Node.js", err)
	}
	modules, err := filepath.Abs(filepath.Join(moduleRoot, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(modules, ".bin")
	for _, tool := range []string{"openapi-typescript", "tsc"} {
		if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
			testenv.Unavailable(t, tool+" (npm ci installs it)", err)
		}
	}
	// The types are generated from the repository's root, as the README's
	// reader runs the generator: whatever configuration of Redocly's the
	// root holds must not refuse the spec. The tour is a project of its
	// own.
	dir := t.TempDir()
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "package.json"), `{"type": "module"}`+"\n")
	copyFile(t, filepath.Join("testdata", "tour", "tour.ts"), filepath.Join(dir, "tour.ts"))
	root, err := filepath.Abs(moduleRoot)
	if err != nil {
		t.Fatal(err)
	}
	run(t, exec.Command(filepath.Join(bin, "openapi-typescript"), "openapi.yaml", "-o", filepath.Join(dir, "api.d.ts")), root)
	run(t, exec.Command(filepath.Join(bin, "tsc"), "--strict", "--target", "es2022", "--module", "nodenext", "--types", "node", "tour.ts"), dir)

	tour := exec.Command(node, "tour.js")
	tour.Env = tourEnv(t)
	t.Log(run(t, tour, dir))
}

// tourEnv starts a fresh service and returns the environment of a tour
// program: the process's own, with RATELIMIT_URL and
// RATELIMIT_ADMIN_TOKEN. The URL is a proxy that checks every answer
// against openapi.yaml, so that the tour's expectations and the contract
// cannot drift apart.
func tourEnv(t *testing.T) []string {
	svc := newService(t, "ratelimitd", options{})
	target, err := url.Parse(svc.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: testenv.Validating(t, http.DefaultTransport, 1),
	})
	t.Cleanup(proxy.Close)
	return append(os.Environ(), "RATELIMIT_URL="+proxy.URL, "RATELIMIT_ADMIN_TOKEN="+svc.bootstrap)
}

// run runs cmd in dir and returns its output, failing the test with it
// when cmd fails.
func run(t *testing.T, cmd *exec.Cmd, dir string) string {
	t.Helper()
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(data))
}
