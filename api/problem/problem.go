// Package problem is the one edge of every front end: it authorises
// bearer tokens, words errors as RFC 9457 problem details and writes them,
// for the admin API and the decision routes alike, and maps the same
// statuses to gRPC codes for Envoy's front. A client so meets one set of
// words and statuses on every route, whichever stack serves it.
package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Problem is an RFC 9457 problem detail, the body of every error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// RequestID is also in the X-Request-Id header and in the log.
	RequestID string `json:"request_id"`
	// Errors lists every bad field of a 400 or 422.
	Errors []limiter.FieldError `json:"errors,omitempty"`
}

// names name the kinds of problem by status.
var names = map[int]string{
	http.StatusBadRequest:                  "bad-request",
	http.StatusUnauthorized:                "unauthorized",
	http.StatusForbidden:                   "forbidden",
	http.StatusNotFound:                    "not-found",
	http.StatusMethodNotAllowed:            "method-not-allowed",
	http.StatusConflict:                    "conflict",
	http.StatusPreconditionFailed:          "precondition-failed",
	http.StatusRequestEntityTooLarge:       "payload-too-large",
	http.StatusUnsupportedMediaType:        "unsupported-media-type",
	http.StatusUnprocessableEntity:         "validation",
	http.StatusRequestHeaderFieldsTooLarge: "headers-too-large",
	http.StatusTooManyRequests:             "too-many-requests",
	http.StatusServiceUnavailable:          "unavailable",
}

// Type is the stable identifier of the kind of problem a status answers,
// the same on every route.
func Type(status int) string {
	if name, ok := names[status]; ok {
		return "urn:ratelimitd:problem:" + name
	}
	return "urn:ratelimitd:problem:internal"
}

// Error is an error whose status and detail are meant for the client.
type Error struct {
	Status int
	Detail string
	Fields []limiter.FieldError
	// Challenge is the WWW-Authenticate value of a 401.
	Challenge string
}

func (e *Error) Error() string { return e.Detail }

// Errorf returns an Error of status whose detail is the formatted text.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Detail: fmt.Sprintf(format, args...)}
}

// TooLarge is the 413 of a body over n bytes, worded alike on every front.
func TooLarge(n int64) *Error {
	return Errorf(http.StatusRequestEntityTooLarge, "the body is larger than %d bytes", n)
}

// Worder is an error that words its own problem, and may answer a body
// that extends it (a refused import lists its entries), so that the edge
// knows none of the handlers' types.
type Worder interface {
	error
	// Word fills in p's status, detail and field errors, and returns the
	// body to write: p, or a value that embeds it.
	Word(p *Problem) any
}

// Unavailable is the detail of every 503 for a backend that failed: the
// error's chain may hold driver text, which is for the log only.
const Unavailable = "a backend this request needs is unavailable; retry later"

// From fills in p for the errors every front end shares, returns the body
// to write, and reports whether it knew err. An error it does not know is
// the caller's to word (the admin API words the database's sentinels), or
// else internal.
func From(err error, p *Problem) (body any, ok bool) {
	var (
		pe  *Error
		w   Worder
		ie  *input.Error
		ve  *limiter.ValidationError
		mbe *http.MaxBytesError
	)
	body = p
	switch {
	case errors.As(err, &pe):
		p.Status, p.Detail, p.Errors = pe.Status, pe.Detail, pe.Fields
	case errors.As(err, &w):
		body = w.Word(p)
	case errors.As(err, &ie):
		p.Status, p.Detail, p.Errors = http.StatusBadRequest, ie.Detail, ie.Fields
	case errors.As(err, &ve):
		p.Status, p.Detail, p.Errors = http.StatusUnprocessableEntity, "the request has invalid values", ve.Fields
	case errors.As(err, &mbe):
		// A body read past its route's bound (package edge bounds it).
		p.Status, p.Detail = http.StatusRequestEntityTooLarge, TooLarge(mbe.Limit).Detail
	case errors.Is(err, limiter.ErrUnavailable):
		p.Status, p.Detail = http.StatusServiceUnavailable, Unavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// A backend too slow to answer, or a client that went away: either
		// way the request may be retried, and it is not a bug of ours.
		p.Status, p.Detail = http.StatusServiceUnavailable, "the request was cancelled or timed out; retry later"
	default:
		return body, false
	}
	return body, true
}

// Internal fills in p for an error nobody words: masked, since its text is
// for the log.
func Internal(p *Problem) {
	p.Status, p.Detail = http.StatusInternalServerError, "internal error"
}

// Complete fills in p's type and title from its status, for a problem
// written inside another answer; Write does it itself.
func Complete(p *Problem) {
	p.Type, p.Title = Type(p.Status), http.StatusText(p.Status)
}

// Write answers p's status with body, which is p or embeds it, as
// application/problem+json; the challenge of a 401 and the Retry-After of
// a 503 go with it. It fills in p's type and title from its status.
func Write(w http.ResponseWriter, err error, p *Problem, body any) {
	Complete(p)
	h := w.Header()
	var pe *Error
	if p.Status == http.StatusUnauthorized && errors.As(err, &pe) && pe.Challenge != "" {
		h.Set("WWW-Authenticate", pe.Challenge)
	}
	if p.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	// A client gone before it reads the answer has nothing to learn.
	_ = enc.Encode(body)
}

// Authorize checks the value of an Authorization header, "Bearer <token>",
// and that the token's scope is one of scopes (admin passes everywhere).
// A refusal is an *Error: 401 with its challenge, or 403.
func Authorize(a auth.Authenticator, header string, scopes ...auth.Scope) (auth.Principal, error) {
	p, refused := auth.Authorize(a, header, scopes...)
	switch {
	case refused == nil:
		return p, nil
	case refused.Forbidden:
		return p, &Error{Status: http.StatusForbidden, Detail: refused.Detail}
	}
	return p, &Error{Status: http.StatusUnauthorized, Detail: refused.Detail, Challenge: refused.Challenge}
}

// Code is the gRPC code of a status, for Envoy's front, which refuses and
// fails as the HTTP fronts do.
func Code(status int) codes.Code {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge,
		http.StatusRequestHeaderFieldsTooLarge, http.StatusUnsupportedMediaType:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict:
		return codes.AlreadyExists
	case http.StatusPreconditionFailed:
		return codes.FailedPrecondition
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	}
	return codes.Internal
}
