package testenv

import (
	"os/exec"
	"testing"
)

// defaultChromium is where Debian's chromium package installs the browser.
const defaultChromium = "/usr/bin/chromium"

// Chromium returns the path of the browser that drives the admin page's
// tests: RATELIMIT_TEST_CHROMIUM, or /usr/bin/chromium. A bare name is
// looked up in PATH. Without an executable browser it calls Unavailable:
// a skip on a developer's machine, a failure in CI.
func Chromium(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath(Getenv("RATELIMIT_TEST_CHROMIUM", defaultChromium))
	if err != nil {
		Unavailable(t, "chromium", err)
	}
	return path
}
