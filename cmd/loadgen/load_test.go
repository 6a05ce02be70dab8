package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCheckTarget(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080/v1/spend": true,
		"http://127.1.2.3:1/":            true,
		"http://[::1]:8080/x?y=1":        true,
		"http://localhost:8080/":         true,
		"http://10.0.0.1:8080/":          false,
		"http://example.com/":            false,
		"http://[2001:db8::1]:80/":       false,
		"https://127.0.0.1/":             false,
		"http://user:pw@127.0.0.1/":      false,
		"127.0.0.1:8080":                 false,
	} {
		_, err := checkTarget(raw)
		if (err == nil) != ok {
			t.Errorf("%s: err %v, want ok %v", raw, err, ok)
		}
	}
	u, err := checkTarget("http://127.0.0.1/x")
	if err != nil || u.Host != "127.0.0.1:80" {
		t.Fatalf("default port: %v %v", u, err)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-c", "0"},
		{"-d", "0s"},
		{"-ids", "0"},
		{"-rate", "-1"},
		{"-format", "xml"},
		{"-method", "GE T"},
		{"-token", "a\nb"},
		{"-url", "http://192.0.2.1/"},
		{"-body", "x", "-body-file", "/dev/null"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestRequests(t *testing.T) {
	cfg, err := parseFlags([]string{"-url", "http://127.0.0.1:9/v1/spend?x=1", "-token", "s3cret",
		"-body", `{"id":"{id}","again":"{id}"}`, "-ids", "3", "-id-base", "41"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	reqs := cfg.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	body := `{"id":"43","again":"43"}`
	want := "POST /v1/spend?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUser-Agent: ratelimitd-loadgen\r\n" +
		"Authorization: Bearer s3cret\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n" + body
	if string(reqs[2]) != want {
		t.Fatalf("request:\n%q\nwant\n%q", reqs[2], want)
	}
	// Each request parses as what it claims to be.
	r, err := http.ReadRequest(bufioReader(reqs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != `{"id":"41","again":"41"}` || r.Header.Get("Authorization") != "Bearer s3cret" {
		t.Fatalf("parsed %q %v", b, r.Header)
	}

	cfg, err = parseFlags([]string{"-url", "http://127.0.0.1:9/readyz", "-ids", "5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if reqs := cfg.requests(); len(reqs) != 1 || !strings.HasPrefix(string(reqs[0]), "GET /readyz HTTP/1.1\r\n") ||
		strings.Contains(string(reqs[0]), "Content-Length") {
		t.Fatalf("a GET without a body: %q", reqs)
	}
}

// idServer answers the body's "id" back: 200 with {"ok":true}, except 503
// for id 3 and a body without "ok" for id 4; every fifth answer closes the
// connection. It counts the requests it answered.
type idServer struct {
	mu  sync.Mutex
	ids map[string]int
	n   int
}

func (s *idServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ ID string }
	_ = json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	s.ids[req.ID]++
	s.n++
	closing := s.n%5 == 0
	s.mu.Unlock()
	if closing {
		w.Header().Set("Connection", "close")
	}
	switch req.ID {
	case "3":
		w.WriteHeader(http.StatusServiceUnavailable)
	case "4":
		_, _ = io.WriteString(w, `{"nope":true}`)
	default:
		_, _ = io.WriteString(w, `{"ok":true}`)
	}
}

func TestLoad(t *testing.T) {
	srv := &idServer{ids: map[string]int{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-url", ts.URL + "/v1/spend", "-body", `{"id":"{id}"}`, "-ids", "4",
		"-c", "4", "-d", "300ms", "-warmup", "100ms", "-expect", `"ok"`, "-format", "json"}, &out, &errOut)
	if err == nil {
		t.Fatal("no error for a run with errors")
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Requests == 0 || rep.Status["200"] == 0 || rep.Status["503"] == 0 {
		t.Fatalf("report: %+v", rep)
	}
	// Connection i sends ids i+1, i+1+4, ...: each connection one id.
	if rep.ErrorKinds["status"] != rep.Status["503"] || rep.ErrorKinds["body"] == 0 {
		t.Fatalf("errors %v for statuses %v", rep.ErrorKinds, rep.Status)
	}
	if rep.Errors != rep.ErrorKinds["status"]+rep.ErrorKinds["body"] {
		t.Fatalf("errors %d, kinds %v", rep.Errors, rep.ErrorKinds)
	}
	if !strings.Contains(rep.FirstError, "status 503") && !strings.Contains(rep.FirstError, "expected text") {
		t.Fatalf("first error %q", rep.FirstError)
	}
	// The warm-up's requests were answered and not counted.
	srv.mu.Lock()
	answered := uint64(srv.n)
	srv.mu.Unlock()
	if answered <= rep.Requests {
		t.Fatalf("the server answered %d, the report counts %d: the warm-up was counted", answered, rep.Requests)
	}
}

// TestLoadRate: with -rate, no more requests go out than were scheduled,
// and a server that answers correctly gives no error.
func TestLoadRate(t *testing.T) {
	srv := &idServer{ids: map[string]int{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	cfg, err := parseFlags([]string{"-url", ts.URL, "-body", `{"id":"{id}"}`, "-ids", "2", "-c", "3",
		"-d", "500ms", "-warmup", "0s", "-rate", "100", "-expect", "ok"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := load(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors != 0 || rep.Requests == 0 {
		t.Fatalf("report: %+v", rep)
	}
	// 100/s for 0.5 s over 3 connections: at most 50 slots plus one per
	// connection for the rounding.
	if rep.Requests > 53 {
		t.Fatalf("%d requests sent at 100/s in 0.5 s", rep.Requests)
	}
}

// TestLoadUnreachable: a port nobody listens on gives connect errors, and
// the run still ends on time.
func TestLoadUnreachable(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	cfg, err := parseFlags([]string{"-url", url, "-c", "2", "-d", "200ms", "-warmup", "0s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := load(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ErrorKinds["connect"] == 0 || rep.Errors != rep.ErrorKinds["connect"] {
		t.Fatalf("report: %+v", rep)
	}
	// A liveness check: the run is bounded by its duration and timeout.
	if took := time.Since(start); took > cfg.duration+cfg.timeout {
		t.Fatalf("the run took %v", took)
	}
}

// TestReportFormats: every format renders, and tsv is one line.
func TestReportFormats(t *testing.T) {
	rep := &report{Name: "x", URL: "http://127.0.0.1:1/", Connections: 1, Requests: 10, Errors: 1, RPS: 5,
		Status: map[string]uint64{"200": 9, "500": 1}, ErrorKinds: map[string]uint64{"status": 1}, FirstError: "status 500"}
	for _, f := range []string{"text", "json", "tsv"} {
		var b bytes.Buffer
		if err := rep.write(&b, f); err != nil || b.Len() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
		if f == "tsv" && strings.Count(b.String(), "\n") != 1 {
			t.Fatalf("tsv: %q", b.String())
		}
		if f == "text" && !strings.Contains(b.String(), "200: 9, 500: 1") {
			t.Fatalf("text: %s", b.String())
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
