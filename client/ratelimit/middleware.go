package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/client/internal/key"
)

// Key names the bucket of an incoming request. An error refuses the
// request with a 400 that says it.
type Key func(r *http.Request) (string, error)

// Rule says what the middleware spends for each request.
type Rule struct {
	// Limit is the name of the limit spent on.
	Limit string
	// Key names each request's bucket of Limit: ClientIP, Header,
	// RoutePattern, or a function of your own.
	Key Key
	// Cost is each request's cost; nil costs 1. A negative cost is
	// refused as a wrong configuration is, with a 500: mind that
	// r.ContentLength is -1 when the length is unknown.
	Cost func(r *http.Request) int64
}

// Middleware spends rule's cost for each request before it reaches the
// handler. Allowed, the request goes on with the RateLimit-Policy and
// RateLimit headers (draft-ietf-httpapi-ratelimit-headers) of its most
// restrictive bucket; denied, it is answered 429 with those headers,
// Retry-After and a problem+json body. When ratelimitd gives no answer,
// the Client's fail mode decides: open lets the request through, closed
// answers 503 with Retry-After. A bucket id that the limit's id format
// refuses (a header holding no valid id) is a 400; any other refusal of
// ratelimitd's, such as an unknown limit, a 500, since it is the
// service's own configuration that is wrong.
func Middleware(c *Client, rule Rule) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := rule.Key(r)
			if err != nil {
				writeProblem(w, http.StatusBadRequest, "the request's rate-limit key: "+err.Error())
				return
			}
			cost := int64(1)
			if rule.Cost != nil {
				cost = rule.Cost(r)
			}
			res, err := c.Spend(r.Context(), Bucket{Limit: rule.Limit, ID: key, Cost: cost})
			var p *Problem
			switch {
			case err == nil:
			case errors.Is(err, ErrUnavailable):
				w.Header().Set("Retry-After", strconv.FormatInt(seconds(c.breaker.cooldown), 10))
				writeProblem(w, http.StatusServiceUnavailable, "the rate limiter is unavailable; retry later")
				return
			case errors.As(err, &p) && p.BadBucketID():
				writeProblem(w, http.StatusBadRequest, "the request's rate-limit key is not a valid bucket id of "+rule.Limit)
				return
			case errors.Is(err, context.Canceled):
				// The client went away; nobody reads an answer.
				return
			default:
				writeProblem(w, http.StatusInternalServerError, "internal error")
				return
			}
			setHeaders(w.Header(), res)
			if !res.Allowed {
				writeProblem(w, http.StatusTooManyRequests, "the rate limit "+strconv.Quote(rule.Limit)+" is exhausted; retry after the time Retry-After says")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// ClientIP keys requests by the client's address, read through the
// trusted proxies (X-Forwarded-For and X-Real-IP are believed only from
// them; with none, the connecting peer is the client), by the same rule
// as ratelimitd's forward-auth front (package clientip).
func ClientIP(trusted ...netip.Prefix) Key {
	res := clientip.New(trusted)
	return func(r *http.Request) (string, error) {
		a, err := res.Request(r)
		if err != nil {
			return "", err
		}
		return a.String(), nil
	}
}

// Header keys requests by the value of a header, such as an API key's; a
// request without it, with it more than once, or with a value that no
// limit could take as a bucket id (not UTF-8, holding NUL, longer than
// 128 KiB) is refused, by the same rule as ratelimitgrpc.Metadata.
func Header(name string) Key {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) { return key.One(name, r.Header[name]) }
}

// RoutePattern keys requests by the pattern of http.ServeMux that matched
// them ("GET /items/{id}"), so that each route has a bucket of its own.
// The middleware must then wrap the handler registered on the mux, not
// the mux, which sets the pattern.
func RoutePattern(r *http.Request) (string, error) {
	if r.Pattern == "" {
		return "", errors.New("no route pattern: the middleware must wrap a handler registered on an http.ServeMux")
	}
	return r.Pattern, nil
}

// setHeaders sets RateLimit-Policy and RateLimit for the most restrictive
// bucket of a spend, and Retry-After when it was denied, as ratelimitd's
// own decision routes do.
func setHeaders(h http.Header, r Result) {
	if i := r.mostRestrictive(); i >= 0 {
		d := &r.Decisions[i]
		policy := make([]byte, 0, 64)
		policy = append(policy, '"')
		policy = append(policy, d.Limit...)
		policy = append(policy, `";q=`...)
		policy = strconv.AppendInt(policy, d.Burst, 10)
		if qu := d.quotaUnit(); qu != "" {
			policy = append(policy, `;qu="`...)
			policy = append(policy, qu...)
			policy = append(policy, '"')
		}
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, max(1, seconds(d.window())), 10)
		h["Ratelimit-Policy"] = []string{string(policy)}
		until := d.ResetAfter
		if !d.Allowed && d.RetryAfter > 0 {
			until = d.RetryAfter
		}
		limit := make([]byte, 0, 48)
		limit = append(limit, '"')
		limit = append(limit, d.Limit...)
		limit = append(limit, `";r=`...)
		limit = strconv.AppendInt(limit, d.Remaining, 10)
		limit = append(limit, ";t="...)
		limit = strconv.AppendInt(limit, seconds(until), 10)
		h["Ratelimit"] = []string{string(limit)}
	}
	if !r.Allowed && r.RetryAfter > 0 {
		h["Retry-After"] = []string{strconv.FormatInt(seconds(r.RetryAfter), 10)}
	}
}

// mostRestrictive is the index of the decision whose headers a spend's
// answer carries, as ratelimitd chooses it: the denied bucket with the
// longest retry-after, else the allowed one with the fewest tokens left;
// shadow and unlimited buckets never; -1 when there is none.
func (r Result) mostRestrictive() int {
	best, bestDenied := -1, false
	for i := range r.Decisions {
		d := &r.Decisions[i]
		if d.Shadow || d.Source == "unlimited" {
			continue
		}
		denied := !d.Allowed
		if r.Degraded && !denied {
			continue
		}
		if best < 0 {
			best, bestDenied = i, denied
			continue
		}
		b := &r.Decisions[best]
		switch {
		case denied && !bestDenied,
			denied && longer(d.RetryAfter, b.RetryAfter),
			!denied && !bestDenied && d.Remaining < b.Remaining:
			best, bestDenied = i, denied
		}
	}
	return best
}

// longer reports whether retry-after a is longer than b; Never is the
// longest.
func longer(a, b time.Duration) bool {
	switch {
	case b == Never:
		return false
	case a == Never:
		return true
	}
	return a > b
}

// window is the RateLimit-Policy header's w: the time over which the
// burst is the quota, burst·period/count. For a calendar quota and a
// concurrency limit, whose burst equals their count, that is the period.
func (d *Decision) window() time.Duration {
	if d.Count <= 0 || d.Burst <= 0 {
		return d.Period
	}
	return time.Duration(float64(d.Period) * float64(d.Burst) / float64(d.Count))
}

// quotaUnit is the RateLimit-Policy header's qu, "" when it has none, as
// ratelimitd words it: concurrent-requests for a concurrency limit of
// requests, content-bytes for a limit of bytes.
func (d *Decision) quotaUnit() string {
	switch {
	case d.Concurrent && d.Unit == "requests":
		return "concurrent-requests"
	case !d.Concurrent && (d.Unit == "bytes" || d.Unit == "content-bytes"):
		return "content-bytes"
	}
	return ""
}

// seconds converts a duration into whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// writeProblem answers with an RFC 9457 problem of status.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	w.Write(body)
}
