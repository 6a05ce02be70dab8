package ratelimit

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// newClient returns a Client of the fake with cfg, URL and Token filled
// in.
func newClient(t testing.TB, f *fakeratelimitd.Server, cfg Config) *Client {
	t.Helper()
	cfg.URL, cfg.Token = f.URL, fakeratelimitd.Token
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// queued returns the calls waiting in c's queue.
func queued(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// waitFor polls cond until it holds, failing the test after a generous
// bound that only a hang exceeds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// clock is a test clock that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_800_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// mustJSON is v as JSON.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b.Bytes())
}
