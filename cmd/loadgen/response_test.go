package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

type wantResponse struct {
	status int
	body   string
	close  bool
}

// readAll parses every response of stream, read in pieces by rd.
func readAll(t *testing.T, rd io.Reader) ([]wantResponse, error) {
	t.Helper()
	r := newResponseReader(rd)
	var out []wantResponse
	for {
		var resp response
		err := r.read(&resp)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, wantResponse{resp.status, string(resp.body), resp.close})
	}
}

func TestResponseReader(t *testing.T) {
	for _, c := range []struct {
		name   string
		stream string
		want   []wantResponse
	}{
		{"content length",
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"allowed\":1}",
			[]wantResponse{{200, `{"allowed":1}`, false}}},
		{"two on one connection",
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabHTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 3\r\n\r\nxyz",
			[]wantResponse{{200, "ab", false}, {422, "xyz", false}}},
		{"chunked with extension and trailer",
			"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nWiki\r\nA\r\npedia in c\r\n0\r\nX-Trailer: 1\r\n\r\n" +
				"HTTP/1.1 204 No Content\r\n\r\n",
			[]wantResponse{{200, "Wikipedia in c", false}, {204, "", false}}},
		{"connection close",
			"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
			[]wantResponse{{503, "x", true}}},
		{"HTTP/1.0 closes unless kept alive",
			"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: Keep-Alive\r\n\r\nxHTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\ny",
			[]wantResponse{{200, "x", false}, {200, "y", true}}},
		{"body to the end of the stream",
			"HTTP/1.1 200 OK\r\n\r\nuntil the end",
			[]wantResponse{{200, "until the end", true}}},
		{"bare LF and no reason",
			"HTTP/1.1 200\nContent-Length: 2\n\nok",
			[]wantResponse{{200, "ok", false}}},
		{"304 has no body whatever its length",
			"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
			[]wantResponse{{304, "", false}, {200, "", false}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for name, rd := range map[string]io.Reader{
				"whole":       strings.NewReader(c.stream),
				"byte a time": iotest.OneByteReader(strings.NewReader(c.stream)),
				"half":        iotest.HalfReader(strings.NewReader(c.stream)),
			} {
				got, err := readAll(t, rd)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if len(got) != len(c.want) {
					t.Fatalf("%s: got %+v, want %+v", name, got, c.want)
				}
				for i := range got {
					if got[i] != c.want[i] {
						t.Errorf("%s: response %d is %+v, want %+v", name, i, got[i], c.want[i])
					}
				}
			}
		})
	}
}

func TestResponseReaderErrors(t *testing.T) {
	for _, c := range []struct {
		name, stream string
		malformed    bool
	}{
		{"not HTTP", "SMTP ready\r\n\r\n", true},
		{"HTTP/2 status line", "HTTP/2 200 OK\r\n\r\n", true},
		{"status not a number", "HTTP/1.1 2x0 OK\r\n\r\n", true},
		{"status without space", "HTTP/1.1 200OK\r\n\r\n", true},
		{"informational", "HTTP/1.1 100 Continue\r\n\r\n", true},
		{"header without colon", "HTTP/1.1 200 OK\r\nBroken\r\n\r\n", true},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", true},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", true},
		{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n", true},
		{"gzip coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", true},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", true},
		{"chunk without CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n", true},
		{"huge header", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", maxHeaderBytes) + "\r\n\r\n", true},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", false},
		{"cut in the header", "HTTP/1.1 200 OK\r\nContent-Le", false},
		{"cut in a chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := readAll(t, strings.NewReader(c.stream))
			switch {
			case err == nil:
				t.Fatal("no error")
			case c.malformed && !errors.Is(err, errMalformed):
				t.Fatalf("got %v, want a malformed response", err)
			case !c.malformed && !errors.Is(err, io.ErrUnexpectedEOF):
				t.Fatalf("got %v, want an unexpected EOF", err)
			}
		})
	}
}

// TestResponseReaderAllocates: once its buffers have grown, parsing a
// response allocates nothing.
func TestResponseReaderAllocates(t *testing.T) {
	one := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: a-1\r\nContent-Length: 13\r\n\r\n{\"allowed\":1}"
	rd := strings.NewReader(one)
	r := newResponseReader(rd)
	var resp response
	allocs := testing.AllocsPerRun(100, func() {
		rd.Reset(one)
		if err := r.read(&resp); err != nil || resp.status != 200 {
			t.Fatal(resp.status, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per response", allocs)
	}
}

func FuzzResponseReader(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n")
	f.Add("HTTP/1.0 500 x\r\n\r\nbody")
	f.Fuzz(func(t *testing.T, stream string) {
		r := newResponseReader(iotest.HalfReader(strings.NewReader(stream)))
		var resp response
		for range 100 {
			if err := r.read(&resp); err != nil {
				return
			}
			if resp.status < 200 || resp.status > 999 || len(resp.body) > len(stream) {
				t.Fatalf("status %d, body of %d bytes from %d", resp.status, len(resp.body), len(stream))
			}
		}
	})
}
