package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// tokens knows one secret, of scope decide.
type tokens struct{}

func (tokens) Authenticate(secret string) (auth.Principal, bool) {
	return auth.Principal{Name: "svc", Scope: auth.Decide}, secret == "s3cret"
}

func TestAuthorize(t *testing.T) {
	for _, c := range []struct {
		header    string
		scopes    []auth.Scope
		status    int
		challenge bool
	}{
		{"Bearer s3cret", []auth.Scope{auth.Decide}, 0, false},
		{"bearer s3cret", []auth.Scope{auth.Decide}, 0, false},
		{"", []auth.Scope{auth.Decide}, http.StatusUnauthorized, true},
		{"Basic s3cret", []auth.Scope{auth.Decide}, http.StatusUnauthorized, true},
		{"Bearer other", []auth.Scope{auth.Decide}, http.StatusUnauthorized, true},
		{"Bearer s3cret", []auth.Scope{auth.Support}, http.StatusForbidden, false},
	} {
		p, err := Authorize(tokens{}, c.header, c.scopes...)
		var pe *Error
		switch {
		case c.status == 0 && (err != nil || p.Name != "svc"):
			t.Errorf("%q: %v %v", c.header, p, err)
		case c.status != 0 && (!errors.As(err, &pe) || pe.Status != c.status || (pe.Challenge != "") != c.challenge):
			t.Errorf("%q: %#v, want status %d", c.header, err, c.status)
		}
	}
}

// TestFrom shows the status and detail of each kind of error every front
// shares, and that an unknown error is left to the caller.
func TestFrom(t *testing.T) {
	fields := []limiter.FieldError{{Field: "burst", Message: "must be at least 1"}}
	for _, c := range []struct {
		err    error
		status int
		known  bool
	}{
		{Errorf(http.StatusConflict, "taken"), http.StatusConflict, true},
		{fmt.Errorf("wrapped: %w", &input.Error{Detail: "bad", Fields: fields}), http.StatusBadRequest, true},
		{&limiter.ValidationError{Fields: fields}, http.StatusUnprocessableEntity, true},
		{fmt.Errorf("redis: dial tcp: %w", limiter.ErrUnavailable), http.StatusServiceUnavailable, true},
		{context.DeadlineExceeded, http.StatusServiceUnavailable, true},
		{errors.New("pq: something internal"), 0, false},
	} {
		p := &Problem{}
		_, ok := From(c.err, p)
		if ok != c.known || p.Status != c.status {
			t.Errorf("%v: status %d known %v, want %d %v", c.err, p.Status, ok, c.status, c.known)
		}
		if c.status == http.StatusServiceUnavailable && p.Detail == c.err.Error() {
			t.Errorf("%v: the detail passes the chain on", c.err)
		}
	}
}

func TestWrite(t *testing.T) {
	err := &Error{Status: http.StatusUnauthorized, Detail: "no token", Challenge: `Bearer realm="ratelimitd"`}
	p := &Problem{RequestID: "r-1"}
	body, _ := From(err, p)
	rec := httptest.NewRecorder()
	Write(rec, err, p, body)
	if rec.Code != http.StatusUnauthorized || rec.Header().Get("Content-Type") != "application/problem+json" ||
		rec.Header().Get("WWW-Authenticate") != `Bearer realm="ratelimitd"` {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	var got Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Type != "urn:ratelimitd:problem:unauthorized" || got.Title != "Unauthorized" || got.Detail != "no token" || got.RequestID != "r-1" {
		t.Errorf("%+v", got)
	}

	p = &Problem{}
	body, _ = From(limiter.ErrUnavailable, p)
	rec = httptest.NewRecorder()
	Write(rec, limiter.ErrUnavailable, p, body)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("%d %v", rec.Code, rec.Header())
	}
}

func TestCode(t *testing.T) {
	for status, want := range map[int]codes.Code{
		http.StatusUnprocessableEntity: codes.InvalidArgument,
		http.StatusUnauthorized:        codes.Unauthenticated,
		http.StatusForbidden:           codes.PermissionDenied,
		http.StatusServiceUnavailable:  codes.Unavailable,
		http.StatusInternalServerError: codes.Internal,
	} {
		if got := Code(status); got != want {
			t.Errorf("Code(%d) = %v, want %v", status, got, want)
		}
	}
}
