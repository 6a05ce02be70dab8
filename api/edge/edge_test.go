package edge_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/problem"
)

// observer numbers requests and keeps what was observed.
type observer struct {
	mu   sync.Mutex
	seq  int
	seen []string // "route method status"
}

func (o *observer) AppendRequestID(b []byte) []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	return strconv.AppendInt(append(b, "id-"...), int64(o.seq), 10)
}

func (o *observer) ObserveRequest(route, method string, status int, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, route+" "+method+" "+strconv.Itoa(status))
}

func (o *observer) last() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[len(o.seen)-1]
}

// testEdge serves routes that tell what reached them.
func testEdge(t *testing.T, log io.Writer) (*edge.Edge, *observer) {
	t.Helper()
	obs := &observer{}
	echo := func(x *edge.Exchange, r *http.Request) error {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		x.AddHeader("X-Answer", append(x.Values(), "yes"...))
		_, _ = x.Write(append([]byte(r.URL.Path+" "), body...))
		return nil
	}
	routes := []edge.Route{
		{Method: http.MethodPost, Path: "/v1/exact", MaxBody: 10, Serve: echo},
		{Path: "/v1/tree/", Serve: echo},
		{Path: "/v1/tree/deeper/", Serve: func(x *edge.Exchange, _ *http.Request) error {
			x.SetRoute("/v1/tree/deeper/{x}")
			return problem.Errorf(http.StatusConflict, "deeper")
		}},
		{Path: "/v1/panic", Serve: func(*edge.Exchange, *http.Request) error { panic("a bug") }},
		{Path: "/v1/late", Serve: func(x *edge.Exchange, _ *http.Request) error {
			x.WriteHeader(http.StatusAccepted)
			return errors.New("after the answer began")
		}},
		{Path: "/v1/silent", Serve: func(*edge.Exchange, *http.Request) error { return nil }},
		{Path: "/v1/failed", Serve: func(x *edge.Exchange, _ *http.Request) error {
			x.Fail(errors.New("a database's text"))
			return nil
		}},
	}
	return edge.New(edge.Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(log, nil))}, routes...), obs
}

// TestEdge shows what every route gets from the edge: routing by exact
// path and by the longest prefix, the method, the header block's and the
// body's bounds, the request id on every answer, errors and panics as
// problems, and each request counted by its route's pattern.
func TestEdge(t *testing.T) {
	var log bytes.Buffer
	e, obs := testEdge(t, &log)
	cases := []struct {
		name, method, path, body string
		// length, when not 0, is the request's ContentLength.
		length  int64
		header  int
		status  int
		answer  string
		counted string
	}{
		{"exact", "POST", "/v1/exact", "0123456789", 0, 0, 200, "/v1/exact 0123456789", "/v1/exact POST 200"},
		{"prefix", "GET", "/v1/tree/a/b", "", 0, 0, 200, "/v1/tree/a/b ", "/v1/tree/ GET 200"},
		{"the longest prefix", "GET", "/v1/tree/deeper/x", "", 0, 0, 409, "", "/v1/tree/deeper/{x} GET 409"},
		{"no route", "GET", "/v1/exact/more", "", 0, 0, 404, "", " GET 404"},
		{"method", "GET", "/v1/exact", "", 0, 0, 405, "", "/v1/exact GET 405"},
		{"headers", "POST", "/v1/exact", "", 0, 64 << 10, 431, "", "/v1/exact POST 431"},
		{"headers of an unknown route", "GET", "/nowhere", "", 0, 64 << 10, 431, "", " GET 431"},
		{"declared body", "POST", "/v1/exact", "0123456789a", 0, 0, 413, "", "/v1/exact POST 413"},
		{"undeclared body", "POST", "/v1/exact", "0123456789a", -1, 0, 413, "", "/v1/exact POST 413"},
		{"body longer than declared", "POST", "/v1/exact", "0123456789a", 3, 0, 413, "", "/v1/exact POST 413"},
		{"the default bound", "POST", "/v1/tree/x", strings.Repeat("a", edge.DefaultMaxBody+1), -1, 0, 413, "", "/v1/tree/ POST 413"},
		{"panic", "GET", "/v1/panic", "", 0, 0, 500, "", "/v1/panic GET 500"},
		{"error after the answer began", "GET", "/v1/late", "", 0, 0, 202, "", "/v1/late GET 202"},
		{"nothing written", "GET", "/v1/silent", "", 0, 0, 200, "", "/v1/silent GET 200"},
		{"failed", "GET", "/v1/failed", "", 0, 0, 500, "", "/v1/failed GET 500"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			if c.length != 0 {
				req.ContentLength = c.length
			}
			if c.header > 0 {
				req.Header.Set("X-Big", strings.Repeat("a", c.header))
			}
			w := httptest.NewRecorder()
			e.ServeHTTP(w, req)
			id := w.Header().Get("X-Request-Id")
			if w.Code != c.status || id == "" {
				t.Fatalf("%d, request id %q: %s", w.Code, id, w.Body)
			}
			if got := obs.last(); got != c.counted {
				t.Errorf("counted as %q, want %q", got, c.counted)
			}
			switch {
			case c.status < 300:
				if w.Body.String() != c.answer {
					t.Errorf("answer %q, want %q", w.Body, c.answer)
				}
				if c.answer != "" && w.Header().Get("X-Answer") != "yes" {
					t.Errorf("the route's header is missing: %v", w.Header())
				}
			default:
				var p problem.Problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != c.status || p.RequestID != id ||
					w.Header().Get("Content-Type") != "application/problem+json" {
					t.Fatalf("not a problem of %d with the request id: %v %s", c.status, w.Header(), w.Body)
				}
				if c.status == 500 && (p.Detail != "internal error" || strings.Contains(w.Body.String(), "a bug") || strings.Contains(w.Body.String(), "database")) {
					t.Errorf("a 500 shows its cause: %s", w.Body)
				}
				if c.status == 405 && w.Header().Get("Allow") != "POST" {
					t.Errorf("Allow %q", w.Header().Get("Allow"))
				}
			}
		})
	}
	for _, want := range []string{"a bug", "after the answer began", "a database's text"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log does not hold %q: %s", want, log.String())
		}
	}
}

// TestTwoRoutesOfOnePath: a route registered twice is a programming
// error, which New refuses at once.
func TestTwoRoutesOfOnePath(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New accepted two routes of one path")
		}
	}()
	serve := func(*edge.Exchange, *http.Request) error { return nil }
	edge.New(edge.Config{Observer: &observer{}}, edge.Route{Path: "/a", Serve: serve}, edge.Route{Path: "/a", Serve: serve})
}

// discard is a ResponseWriter that keeps nothing but the status.
type discard struct {
	header http.Header
	status int
}

func (w *discard) Header() http.Header         { return w.header }
func (w *discard) WriteHeader(status int)      { w.status = status }
func (w *discard) Write(b []byte) (int, error) { return len(b), nil }

// quiet numbers requests without a lock or memory.
type quiet struct{}

func (quiet) AppendRequestID(b []byte) []byte                   { return append(b, "id"...) }
func (quiet) ObserveRequest(string, string, int, time.Duration) {}

// TestEdgeAllocatesOnlyTheHeaders: what the edge adds to a request that
// reads a body and answers with a header of its own is the answer's
// headers, one string and one slice for all of them; the decisions' speed
// depends on it.
func TestEdgeAllocatesOnlyTheHeaders(t *testing.T) {
	buf := make([]byte, 64)
	e := edge.New(edge.Config{Observer: quiet{}}, edge.Route{Method: http.MethodPost, Path: "/v1/spend", Serve: func(x *edge.Exchange, r *http.Request) error {
		if _, err := r.Body.Read(buf); err != nil && err != io.EOF {
			return err
		}
		x.AddHeader("Ratelimit", append(x.Values(), `"L";r=1;t=1`...))
		_, err := x.Write(buf[:2])
		return err
	}})
	body := strings.NewReader("{}")
	req := httptest.NewRequest(http.MethodPost, "/v1/spend", body)
	w := &discard{header: http.Header{}}
	// The fewest of many requests: the race detector makes sync.Pool
	// drop what it holds at random, and the request after allocates anew.
	fewest := uint64(1 << 62)
	var before, after runtime.MemStats
	for range 200 {
		body.Reset("{}")
		req.Body = io.NopCloser(body) // the test's own allocation
		clear(w.header)
		runtime.ReadMemStats(&before)
		e.ServeHTTP(w, req)
		runtime.ReadMemStats(&after)
		fewest = min(fewest, after.Mallocs-before.Mallocs)
	}
	if w.status != http.StatusOK || w.header.Get("Ratelimit") == "" || w.header.Get("X-Request-Id") != "id" {
		t.Fatalf("%d %v", w.status, w.header)
	}
	if fewest > 2 {
		t.Errorf("%d allocations per request, want 2 for the headers", fewest)
	}
}
