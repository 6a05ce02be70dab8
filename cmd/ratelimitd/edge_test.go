package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/ratelimitd/ratelimitd"
	"github.com/ratelimitd/ratelimitd/api/edge"
)

// TestEdgeOfEveryRoute sends every operation of openapi.yaml, the
// decision routes among them, with a header block over 64 KiB, over
// HTTP/1.1 and HTTP/2 without TLS: each is a 431 problem carrying its
// request id, and nothing is done: the acquires so refused hold no lease.
// A block of 1.1 MiB, past net/http's own default bound, is a problem
// too. A route the edge does not serve cannot pass this test, whoever
// adds it.
func TestEdgeOfEveryRoute(t *testing.T) {
	s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_edge"})
	s.waitReady(t)
	if code, body := s.call(t, "PUT", "/v1/limits/Jobs", "rlt_edge", `{"kind":"concurrency","id_format":"string","burst":1,"count":1,"period":"1m"}`); code != http.StatusCreated {
		t.Fatalf("creating a limit: %d %s", code, body)
	}
	doc, err := openapi3.NewLoader().LoadFromData(ratelimitd.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	clients := map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "HTTP/2": {Transport: h2}}
	param := regexp.MustCompile(`\{[^}]+\}`)
	body := `{"buckets":[{"limit":"Jobs","bucket_id":"a"}]}`
	n := 0
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			for proto, c := range clients {
				status, ct, p, id := send(t, c, method, s.url+param.ReplaceAllString(path, "x"), body, 70<<10)
				if method == http.MethodHead && id != "" {
					// The answer to a HEAD has no body.
					p = problemBody{Status: status, RequestID: id}
				}
				if status != http.StatusRequestHeaderFieldsTooLarge || ct != "application/problem+json" || p.Status != status || p.RequestID == "" || p.RequestID != id {
					t.Errorf("%s %s over %s: %d %q %+v, request id %q; want a 431 problem with its request id", method, path, proto, status, ct, p, id)
				}
				n++
			}
		}
	}
	if n < 40 {
		t.Fatalf("only %d requests sent", n)
	}
	if status, ct, p, _ := send(t, http.DefaultClient, "POST", s.url+"/v1/spend", body, 1100<<10); status != http.StatusRequestHeaderFieldsTooLarge || ct != "application/problem+json" || p.Status != status {
		t.Errorf("1.1 MiB of headers: %d %q %+v", status, ct, p)
	}
	code, answer := s.call(t, "POST", "/v1/acquire", "rlt_edge", body)
	var acquired struct{ Allowed bool }
	if err := json.Unmarshal([]byte(answer), &acquired); code != http.StatusOK || err != nil || !acquired.Allowed {
		t.Errorf("acquiring the only unit after the refused acquires: %d %s", code, answer)
	}
}

// problemBody is what a test reads of a problem.
type problemBody struct {
	Status    int    `json:"status"`
	RequestID string `json:"request_id"`
}

// send sends a request with a header of extra bytes and returns the
// answer's status, content type, problem and request id.
func send(t *testing.T, c *http.Client, method, url, body string, extra int) (int, string, problemBody, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer rlt_edge")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Big", strings.Repeat("a", extra))
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p problemBody
	b, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(b, &p)
	return res.StatusCode, res.Header.Get("Content-Type"), p, res.Header.Get("X-Request-Id")
}

// TestWhatNetHTTPAnswersItself pins what docs/operations.md says stays
// plain text, because net/http answers it before any handler runs: a
// header block past edge.ServerHeaderBytes, and a malformed Host.
func TestWhatNetHTTPAnswersItself(t *testing.T) {
	s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_edge"})
	addr := strings.TrimPrefix(s.url, "http://")
	for _, c := range []struct {
		name, request string
		status        int
	}{
		{"headers past the server's bound", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", edge.ServerHeaderBytes+8192) + "\r\n\r\n", 431},
		{"a malformed Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The server may answer and close before it has read all of a
			// long request.
			go func() { _, _ = io.WriteString(conn, c.request) }()
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if res.StatusCode != c.status || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
				t.Errorf("%d %q, want net/http's plain %d", res.StatusCode, res.Header.Get("Content-Type"), c.status)
			}
		})
	}
}
