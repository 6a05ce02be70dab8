// Package testenv gives tests the real services they need: a fresh Postgres
// database, a Redis key prefix, a Redis Cluster, a browser. When a service
// is missing, a test is skipped on a developer's machine and fails in CI
// (CI=true), so that CI can never pass by skipping.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// Unavailable ends the test because a service it needs is missing: a
// failure in CI, a skip elsewhere.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is required in CI but unavailable: %v", service, err)
	}
	t.Skipf("%s unavailable (%v); CI=true makes this a failure", service, err)
}

// Getenv returns the environment variable key, or def when it is empty.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// RandomName returns prefix followed by 12 random hex digits, for names of
// databases and key prefixes that concurrent test runs must not share.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
