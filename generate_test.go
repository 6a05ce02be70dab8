package ratelimitd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestGeneratedUpToDate regenerates the Go client into a temporary
// directory, with the committed configuration and the generator this
// module pins as a tool, and fails when client/client.gen.go differs:
// openapi.yaml changed without `make generate`, or the file was edited by
// hand. It lives in this module, not the client's, so that the client
// module requires neither the generator nor its YAML reader.
func TestGeneratedUpToDate(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the pinned oapi-codegen: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join("client", "oapi-codegen.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The configuration names its output, which wins over -o, so a copy
	// writes elsewhere; paths in it are relative to the repository's root,
	// where the generator runs.
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("client/oapi-codegen.yaml: %v", err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "client.gen.go")
	cfg["output"] = out
	raw, err = yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "oapi-codegen.yaml")
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(goBin, "tool", "oapi-codegen", "-config", cfgPath, "openapi.yaml")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go tool oapi-codegen: %v\n%s", err, msg)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("client", "client.gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("client/client.gen.go is not what openapi.yaml generates; run make generate.\n%s", firstDifference(got, want))
	}
}

// firstDifference describes the first line where the committed file (got)
// and the generated one (want) differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return fmt.Sprintf("first difference at line %d:\ncommitted: %s\ngenerated: %s", i+1, gl, wl)
		}
	}
	return "the files differ"
}
