//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binary is the service binary that TestMain builds once for every test.
var binary string

// raceBuild builds the service with the race detector when
// RATELIMIT_E2E_RACE=true: slower, so the latencies it shows are not the
// service's, but a data race under a fault then fails the test (see
// checkLog).
var raceBuild = os.Getenv("RATELIMIT_E2E_RACE") == "true"

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ratelimitd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "ratelimitd")
	args := []string{"build", "-o", binary}
	if raceBuild {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/ratelimitd")...)
	cmd.Dir = ".." // the module's root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the service: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
