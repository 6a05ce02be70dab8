package decide_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/api/decide"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// panicking is a Limiter with a bug: every decision panics.
type panicking struct{}

func (panicking) Decide(context.Context, limiter.Op, []limiter.Request, []limiter.Decision) (limiter.Result, error) {
	panic("a bug")
}
func (panicking) Reset(context.Context, []limiter.Request) (int, error) { return 0, nil }
func (panicking) Snapshot() *limiter.Snapshot                           { return nil }
func (panicking) Acquire(context.Context, []limiter.Request, time.Duration) (limiter.LeaseResult, error) {
	panic("a bug")
}
func (panicking) Release(context.Context, string) (bool, error) { panic("a bug") }
func (panicking) Renew(context.Context, string, time.Duration) (limiter.Lease, error) {
	panic("a bug")
}
func (panicking) FailOpen() bool { return false }
func (panicking) DecideMany(context.Context, []limiter.Call, []limiter.Decision) []limiter.Decision {
	panic("a bug")
}

// allowAll authenticates any token as admin.
type allowAll struct{}

func (allowAll) Authenticate(string) (auth.Principal, bool) {
	return auth.Principal{Scope: auth.Admin}, true
}

// TestHandlerRefusals shows the answers that come before a decision, and
// that a panic below the handler is a masked 500, not a crash.
func TestHandlerRefusals(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tel := telemetry.New(telemetry.Config{}).Front("http")
	h := edge.New(edge.Config{Observer: tel, Logger: log}, decide.New(decide.Config{Limiter: panicking{}, Auth: allowAll{}, Observer: tel, Now: time.Now}).Routes()...)
	body := `{"buckets":[{"limit":"L","bucket_id":"1"}]}`
	large := `{"buckets":"` + strings.Repeat("x", 1<<20) + `"}`
	cases := []struct {
		name, method, path, ct, body string
		status                       int
		// length, when not 0, is the request's ContentLength.
		length int64
	}{
		{"panic", "POST", "/v1/spend", "application/json", body, http.StatusInternalServerError, 0},
		{"panic in an acquire", "POST", "/v1/acquire", "application/json", body, http.StatusInternalServerError, 0},
		{"panic in a release", "POST", "/v1/release", "application/json", `{"lease_id":"` + limiter.NewLeaseID() + `"}`, http.StatusInternalServerError, 0},
		{"method", "GET", "/v1/spend", "", "", http.StatusMethodNotAllowed, 0},
		{"media type", "POST", "/v1/check", "text/plain", body, http.StatusUnsupportedMediaType, 0},
		{"too large", "POST", "/v1/refund", "application/json", large, http.StatusRequestEntityTooLarge, 0},
		{"too large, of unknown length", "POST", "/v1/refund", "application/json", large, http.StatusRequestEntityTooLarge, -1},
		{"too large, longer than declared", "POST", "/v1/refund", "application/json", large, http.StatusRequestEntityTooLarge, 10},
		{"not ours", "POST", "/v1/limits", "application/json", body, http.StatusNotFound, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			req.Header.Set("Content-Type", c.ct)
			req.Header.Set("Authorization", "Bearer x")
			if c.length != 0 {
				req.ContentLength = c.length
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var p problem.Problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != c.status || p.Status != c.status ||
				w.Header().Get("Content-Type") != "application/problem+json" || p.RequestID == "" || p.RequestID != w.Header().Get("X-Request-Id") {
				t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
			}
			if c.status == http.StatusInternalServerError && (p.Detail != "internal error" || strings.Contains(w.Body.String(), "a bug")) {
				t.Errorf("a 500 shows its cause: %s", w.Body)
			}
			if c.status == http.StatusMethodNotAllowed && w.Header().Get("Allow") != "POST" {
				t.Errorf("Allow %q", w.Header().Get("Allow"))
			}
		})
	}
}
