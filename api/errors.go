package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// problemFor maps an error to its problem, and returns the body to write:
// the one place where the admin API's errors meet HTTP statuses. What
// every front end shares is package problem's; the database's errors are
// worded here, naming subject, the resource the route names; anything
// else is internal and masked.
func problemFor(err error, subject string, p *problem.Problem) any {
	if body, ok := problem.From(err, p); ok {
		return body
	}
	var he *echo.HTTPError
	switch {
	case wordStoreError(err, subject, p):
		// The database's particular errors, in the words of storeWords.
	case statusOf(err) < 500:
		// A kind no words above cover: its text may be the database's, for
		// the log only.
		p.Status = statusOf(err)
		p.Detail = strings.ToLower(http.StatusText(p.Status))
	case errors.As(err, &he) && he.Code < 500:
		p.Status, p.Detail = he.Code, fmt.Sprint(he.Message)
	default:
		problem.Internal(p)
	}
	return p
}

// statusOf returns the status of one of the domain's error kinds; 500 for
// none.
func statusOf(err error) int {
	switch {
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
	{limiter.ErrKindFixed, "", "a limit's kind cannot change, nor a rate limit become a calendar quota or a quota a rate limit: create another limit"},
	{limiter.ErrIDRefused, "", "a limit's id_format changed meanwhile and refuses an override's bucket id; send the request again"},
	{limiter.ErrParamsRefused, "", "a limit changed meanwhile and refuses an override's parameters; send the request again"},
	{limiter.ErrHasOverrides, "", "the limit still has overrides: delete them first"},
	{limiter.ErrHasRules, "", "rules use the limit: delete them or point them at another limit first"},
	{limiter.ErrUnknownLimit, "limit", "unknown limit"},
	{limiter.ErrEnumRetired, "enum", "was the enum of a deleted limit; an enum is never given twice, so that no limit finds the buckets of another"},
	{limiter.ErrNoEnumLeft, "enum", "no enum is left: every number was given"},
	{limiter.ErrPageToken, "page_token", "is not a token from an earlier page"},
}

// wordStoreError fills in p for one of the database's particular errors,
// and reports whether err is one.
func wordStoreError(err error, subject string, p *problem.Problem) bool {
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

// handleError gives the edge every error returned by a handler or
// middleware, in the words of problemFor, naming the resource the route
// names; the edge answers it and logs a server error with its whole chain
// under the request id that the client sees.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		// Too late to answer: the client went away while the answer was
		// written.
		return
	}
	var subject string
	if values := c.ParamValues(); len(values) > 0 {
		subject = values[0]
	}
	if he := (*echo.HTTPError)(nil); errors.As(err, &he) && he.Code == http.StatusMethodNotAllowed {
		// The router lists the methods registered; HEAD goes with GET
		// (see serve).
		h := c.Response().Header()
		if allow := h.Get(echo.HeaderAllow); strings.Contains(allow, http.MethodGet) && !strings.Contains(allow, http.MethodHead) {
			h.Set(echo.HeaderAllow, strings.Replace(allow, http.MethodGet, http.MethodGet+", "+http.MethodHead, 1))
		}
	}
	exchange(c).Fail(&worded{err: err, subject: subject})
}

// worded is an error of the admin API, which problemFor words.
type worded struct {
	err     error
	subject string
}

func (w *worded) Error() string                      { return w.err.Error() }
func (w *worded) Unwrap() error                      { return w.err }
func (w *worded) Word(p *problem.Problem) (body any) { return problemFor(w.err, w.subject, p) }
