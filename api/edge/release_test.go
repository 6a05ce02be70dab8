package edge

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

type countingObserver struct{ n int }

func (o *countingObserver) AppendRequestID(b []byte) []byte {
	o.n++
	return strconv.AppendInt(b, int64(o.n), 10)
}

func (*countingObserver) ObserveRequest(string, string, int, time.Duration) {}

// TestExchangeLetsGoOfTheBody: a pooled Exchange keeps nothing of the
// request it served, whichever way the route ended (an answer, an error,
// a panic, a body past its bound): a body held until the Exchange is used
// again would pin the request's reader, and what it reads from, for as
// long as the pool keeps it.
func TestExchangeLetsGoOfTheBody(t *testing.T) {
	var seen *Exchange
	keep := func(serve func(*Exchange, *http.Request) error) func(*Exchange, *http.Request) error {
		return func(x *Exchange, r *http.Request) error {
			seen = x
			return serve(x, r)
		}
	}
	read := func(_ *Exchange, r *http.Request) error {
		_, err := io.ReadAll(r.Body)
		return err
	}
	e := New(Config{Observer: &countingObserver{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Route{Path: "/ok", MaxBody: 100, Serve: keep(read)},
		Route{Path: "/error", Serve: keep(func(*Exchange, *http.Request) error { return errors.New("failed") })},
		Route{Path: "/panic", Serve: keep(func(*Exchange, *http.Request) error { panic("a bug") })},
		Route{Path: "/large", MaxBody: 4, Serve: keep(read)},
	)
	for _, path := range []string{"/ok", "/error", "/panic", "/large"} {
		seen = nil
		r := httptest.NewRequest(http.MethodPost, path, io.NopCloser(strings.NewReader("a body of some length")))
		r.ContentLength = -1
		e.ServeHTTP(httptest.NewRecorder(), r)
		if seen == nil {
			t.Fatalf("%s: the route did not run", path)
		}
		if seen.body.rc != nil {
			t.Errorf("%s: the Exchange holds the request's body after the request", path)
		}
	}
}
