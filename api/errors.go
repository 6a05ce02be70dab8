package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
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

// problemNames name the kinds of problem by status.
var problemNames = map[int]string{
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
	http.StatusServiceUnavailable:          "unavailable",
}

// ProblemType is the stable identifier of the kind of problem a status
// answers, the same on every route, package decide's included.
func ProblemType(status int) string {
	if name, ok := problemNames[status]; ok {
		return "urn:ratelimitd:problem:" + name
	}
	return "urn:ratelimitd:problem:internal"
}

// problemError is an error that words its own answer, so that the mapper
// knows none of the handlers' types.
type problemError interface {
	error
	// problem fills in p's status, detail and field errors, and returns
	// the body to write: p, or a value that extends it.
	problem(p *Problem) any
}

// clientError carries a message meant for the client, and a kind that
// decides the status.
type clientError struct {
	kind error
	msg  string
}

func (e *clientError) Error() string { return e.msg }
func (e *clientError) Unwrap() error { return e.kind }

func (e *clientError) problem(p *Problem) any {
	p.Status, p.Detail = statusOf(e.kind), e.msg
	return p
}

// errorf returns an error of the given kind whose message is shown to the
// client as the problem's detail.
func errorf(kind error, format string, args ...any) error {
	return &clientError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Error kinds of the HTTP layer; the domain's sentinels cover the rest.
var (
	errBadRequest       = errors.New("bad request")
	errUnauthorized     = errors.New("unauthorized")
	errForbidden        = errors.New("forbidden")
	errTooLarge         = errors.New("body too large")
	errUnsupportedMedia = errors.New("unsupported media type")
	errHeadersTooLarge  = errors.New("headers too large")
)

// problemFor maps an error to its problem, and returns the body to write:
// the one place where errors meet HTTP statuses. Errors that word their own
// problem, bodies that do not read and invalid values are written for
// clients, and the database's errors are worded here, naming subject, the
// resource the route names; anything else is internal and masked.
func problemFor(err error, subject string, p *Problem) any {
	var (
		pe   problemError
		ie   *input.Error
		ve   *limiter.ValidationError
		he   *echo.HTTPError
		body any = p
	)
	switch {
	case errors.As(err, &pe):
		body = pe.problem(p)
	case errors.As(err, &ie):
		p.Status, p.Detail, p.Errors = http.StatusBadRequest, ie.Detail, ie.Fields
	case errors.As(err, &ve):
		p.Status, p.Detail, p.Errors = http.StatusUnprocessableEntity, "the request has invalid values", ve.Fields
	case wordStoreError(err, subject, p):
		// The database's particular errors, in the words of storeWords.
	case statusOf(err) < 500:
		// A kind no words above cover: its text may be the database's, for
		// the log only.
		p.Status = statusOf(err)
		p.Detail = strings.ToLower(http.StatusText(p.Status))
	case errors.Is(err, limiter.ErrUnavailable):
		// The chain may hold driver text: say only what is unavailable.
		p.Status, p.Detail = http.StatusServiceUnavailable, "a backend this request needs is unavailable; retry later"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// A backend too slow to answer, or a client that went away: either
		// way the request may be retried, and it is not a bug of ours.
		p.Status, p.Detail = http.StatusServiceUnavailable, "the request was cancelled or timed out; retry later"
	case errors.As(err, &he) && he.Code < 500:
		p.Status, p.Detail = he.Code, fmt.Sprint(he.Message)
	default:
		p.Status, p.Detail = http.StatusInternalServerError, "internal error"
	}
	p.Type, p.Title = ProblemType(p.Status), http.StatusText(p.Status)
	return body
}

// statusOf returns the status of an error kind, the HTTP layer's and the
// domain's alike; 500 for none.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, errForbidden):
		return http.StatusForbidden
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errUnsupportedMedia):
		return http.StatusUnsupportedMediaType
	case errors.Is(err, errHeadersTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, limiter.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, limiter.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, limiter.ErrPrecondition):
		return http.StatusPreconditionFailed
	case errors.Is(err, limiter.ErrInvalid):
		return http.StatusUnprocessableEntity
	case errors.Is(err, limiter.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// storeWords are what clients read of the database's particular errors,
// whose own text is for the log. The words of a resource not found name
// the route's subject.
var storeWords = []struct {
	err error
	// field is the field a 422 names.
	field, words string
}{
	{limiter.ErrLimitNotFound, "", "limit %q not found"},
	{limiter.ErrOverrideNotFound, "", "override %q not found"},
	{limiter.ErrRuleNotFound, "", "rule %q not found"},
	{limiter.ErrTokenNotFound, "", "token %q not found or already revoked"},
	{limiter.ErrLimitExists, "", "the limit was created by another request meanwhile; send the request again"},
	{limiter.ErrOverrideExists, "", "an override of the limit for the bucket already exists"},
	{limiter.ErrRuleExists, "", "the domain already has a rule for the descriptor"},
	{limiter.ErrTokenExists, "", "a live token has the name; revoke it or choose another name"},
	{limiter.ErrEnumTaken, "", "the enum is taken by another limit"},
	{limiter.ErrEnumFixed, "", "the limit has another enum: an enum cannot change"},
	{limiter.ErrIDFormatFixed, "", "the limit has overrides: its id_format cannot change while they exist"},
	{limiter.ErrIDRefused, "", "a limit's id_format changed meanwhile and refuses an override's bucket id; send the request again"},
	{limiter.ErrHasOverrides, "", "the limit still has overrides: delete them first"},
	{limiter.ErrHasRules, "", "rules use the limit: delete them or point them at another limit first"},
	{limiter.ErrUnknownLimit, "limit", "unknown limit"},
	{limiter.ErrEnumRetired, "enum", "was the enum of a deleted limit; an enum is never given twice, so that no limit finds the buckets of another"},
	{limiter.ErrNoEnumLeft, "enum", "no enum is left: every number was given"},
	{limiter.ErrPageToken, "page_token", "is not a token from an earlier page"},
}

// wordStoreError fills in p for one of the database's particular errors,
// and reports whether err is one.
func wordStoreError(err error, subject string, p *Problem) bool {
	for _, w := range storeWords {
		if !errors.Is(err, w.err) {
			continue
		}
		if w.field != "" {
			p.Status, p.Detail = http.StatusUnprocessableEntity, "the request has invalid values"
			p.Errors = []limiter.FieldError{{Field: w.field, Message: w.words}}
			return true
		}
		p.Status, p.Detail = statusOf(err), w.words
		if strings.Contains(w.words, "%q") {
			p.Detail = fmt.Sprintf(w.words, subject)
		}
		return true
	}
	return false
}

// handleError renders every error returned by a handler or middleware.
// Server errors are logged with their whole chain under the request id
// that the client sees.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		// Too late to answer; a panic still goes to the log with its stack.
		var pe *panicError
		if errors.As(err, &pe) {
			s.log.Error("request failed after its answer began", "request_id",
				c.Response().Header().Get(echo.HeaderXRequestID), "path", c.Path(), "err", err)
		}
		return
	}
	p := &Problem{RequestID: c.Response().Header().Get(echo.HeaderXRequestID)}
	var subject string
	if values := c.ParamValues(); len(values) > 0 {
		subject = values[0]
	}
	body := problemFor(err, subject, p)
	if p.Status >= 500 {
		// An unavailable backend fails every request until it returns; the
		// limiter, the loader and the token keeper log the outage once, so
		// each refused request is only worth a debug line.
		level := slog.LevelError
		if p.Status == http.StatusServiceUnavailable {
			level = slog.LevelDebug
		}
		s.log.LogAttrs(c.Request().Context(), level, "request failed",
			slog.String("request_id", p.RequestID), slog.String("method", c.Request().Method),
			slog.String("path", c.Path()), slog.Int("status", p.Status), slog.Any("err", err))
	}
	if p.Status == http.StatusServiceUnavailable {
		c.Response().Header().Set("Retry-After", "1")
	}
	if p.Status == http.StatusMethodNotAllowed {
		// The router lists the methods registered; HEAD goes with GET
		// (see ServeHTTP).
		h := c.Response().Header()
		if allow := h.Get(echo.HeaderAllow); strings.Contains(allow, http.MethodGet) && !strings.Contains(allow, http.MethodHead) {
			h.Set(echo.HeaderAllow, strings.Replace(allow, http.MethodGet, http.MethodGet+", "+http.MethodHead, 1))
		}
	}
	c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
	c.Response().WriteHeader(p.Status)
	if err := jsonEncode(c.Response(), body); err != nil {
		s.log.Warn("writing a problem", "err", err)
	}
}
