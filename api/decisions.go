package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// decisionRequest is the body of /v1/check, /v1/spend and /v1/refund. The
// common form of it is read by decodeDecisions; this type, through bind,
// reads everything else and words every error.
type decisionRequest struct {
	Buckets []bucketRequest `json:"buckets" validate:"required,min=1,max=100,dive"`
}

type bucketRequest struct {
	Limit    *string `json:"limit" validate:"required"`
	BucketID *string `json:"bucket_id" validate:"required"`
	// Cost is 1 when left out.
	Cost *int64 `json:"cost" validate:"omitempty,min=0"`
}

// requests converts the buckets into the Limiter's requests, appended to
// dst. Missing fields are zero: the caller has their errors already.
func (r *decisionRequest) requests(dst []limiter.Request) []limiter.Request {
	for _, b := range r.Buckets {
		req := limiter.Request{Cost: 1}
		if b.Limit != nil {
			req.Limit = *b.Limit
		}
		if b.BucketID != nil {
			req.BucketID = *b.BucketID
		}
		if b.Cost != nil {
			req.Cost = *b.Cost
		}
		dst = append(dst, req)
	}
	return dst
}

// resetRequest is the body of /v1/buckets/reset.
type resetRequest struct {
	Buckets []resetBucket `json:"buckets" validate:"required,min=1,max=100,dive"`
}

type resetBucket struct {
	Limit    *string `json:"limit" validate:"required"`
	BucketID *string `json:"bucket_id" validate:"required"`
}

// requests converts the buckets into the Limiter's requests.
func (r *resetRequest) requests() []limiter.Request {
	out := make([]limiter.Request, len(r.Buckets))
	for i, b := range r.Buckets {
		if b.Limit != nil {
			out[i].Limit = *b.Limit
		}
		if b.BucketID != nil {
			out[i].BucketID = *b.BucketID
		}
	}
	return out
}

type resetResponse struct {
	Reset int `json:"reset"`
}

// decisionResult is the answer of a decision.
type decisionResult struct {
	Allowed      bool               `json:"allowed"`
	RetryAfterMS int64              `json:"retry_after_ms"`
	ResetAfterMS int64              `json:"reset_after_ms"`
	Degraded     bool               `json:"degraded"`
	Decisions    []decisionResponse `json:"decisions"`
}

// decisionResponse is the answer for one bucket.
type decisionResponse struct {
	Limit        string          `json:"limit"`
	BucketID     string          `json:"bucket_id"`
	Allowed      bool            `json:"allowed"`
	Reason       *limiter.Reason `json:"reason"`
	Remaining    int64           `json:"remaining"`
	RetryAfterMS int64           `json:"retry_after_ms"`
	ResetAfterMS int64           `json:"reset_after_ms"`
	Burst        int64           `json:"burst"`
	Count        int64           `json:"count"`
	Period       string          `json:"period"`
	Source       limiter.Source  `json:"source"`
	Shadow       bool            `json:"shadow"`
	// reason is what Reason points to when there is one, so that the
	// pointer costs no allocation.
	reason limiter.Reason
}

// decisionScratch is the working memory of one decision, pooled so that
// the hot path allocates little more than the strings of the request.
type decisionScratch struct {
	body      []byte
	reqs      []limiter.Request
	decisions []limiter.Decision
	result    decisionResult
	out       []byte
	// header holds the RateLimit headers' text while it is built.
	header []byte
	// names interns limit names and periods: they repeat across requests,
	// and a pooled scratch needs no lock to look them up.
	names   map[string]string
	periods map[time.Duration]string
}

// Bounds of what a pooled scratch keeps between requests, so that one huge
// or unusual request does not pin its memory.
const (
	maxPooledBody = 64 << 10
	maxInterned   = 256
	// maxLimitName is the longest limit name (limiter.NameProblem).
	maxLimitName = 64
)

func (sc *decisionScratch) reset() {
	if cap(sc.body) > maxPooledBody {
		sc.body = nil
	}
	if cap(sc.out) > maxPooledBody {
		sc.out = nil
	}
	sc.body, sc.reqs, sc.out, sc.header = sc.body[:0], sc.reqs[:0], sc.out[:0], sc.header[:0]
}

// intern returns b as a string, without allocating when it was seen before.
// Only what can be a limit name is kept, so that a pooled scratch never
// holds large strings from a body.
func (sc *decisionScratch) intern(b []byte) string {
	if len(b) > maxLimitName {
		return string(b)
	}
	if s, ok := sc.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(sc.names) >= maxInterned || sc.names == nil {
		sc.names = make(map[string]string, 16)
	}
	sc.names[s] = s
	return s
}

// period returns d.String(), without allocating when it was seen before.
func (sc *decisionScratch) period(d time.Duration) string {
	if s, ok := sc.periods[d]; ok {
		return s
	}
	s := d.String()
	if len(sc.periods) >= maxInterned || sc.periods == nil {
		sc.periods = make(map[time.Duration]string, 16)
	}
	sc.periods[d] = s
	return s
}

func (s *Server) check(c echo.Context) error  { return s.decide(c, limiter.Check) }
func (s *Server) spend(c echo.Context) error  { return s.decide(c, limiter.Spend) }
func (s *Server) refund(c echo.Context) error { return s.decide(c, limiter.Refund) }

// decide answers a check, spend or refund. A decision is always a 200,
// whatever it says; an error (422, 503) never carries one.
func (s *Server) decide(c echo.Context, op limiter.Op) error {
	sc := s.scratch.Get().(*decisionScratch)
	defer s.scratch.Put(sc)
	sc.reset()

	var err error
	if sc.body, err = readBody(c.Request(), sc.body); err != nil {
		return err
	}
	reqs, ok := decodeDecisions(sc.body, sc.reqs, sc)
	if !ok {
		if reqs, err = s.bindDecisions(sc.body, sc.reqs); err != nil {
			return err
		}
	}
	sc.reqs = reqs
	res, err := s.cfg.Limiter.Decide(c.Request().Context(), op, reqs, sc.decisions)
	if cap(res.Decisions) > cap(sc.decisions) {
		sc.decisions = res.Decisions[:0]
	}
	if err != nil {
		return err
	}
	s.metrics.decisions(op, res)
	h := c.Response().Header()
	sc.setHeaders(h, op, res)
	sc.fill(res)
	sc.out = sc.result.appendJSON(sc.out)
	h.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(http.StatusOK)
	_, err = c.Response().Write(sc.out)
	return err
}

// bindDecisions reads a decision body that decodeDecisions did not take,
// with every error worded. When the validate tags find errors, the
// buckets they accept are checked against the snapshot too, so that one
// 422 lists every bad field and nothing is spent.
func (s *Server) bindDecisions(body []byte, dst []limiter.Request) ([]limiter.Request, error) {
	var req decisionRequest
	var fs fieldSet
	if err := s.decode(body, &req, &fs); err != nil {
		return nil, err
	}
	reqs := req.requests(dst)
	if !fs.empty() {
		s.bucketErrors(reqs, &fs)
		return nil, fs.err()
	}
	return reqs, nil
}

// bucketErrors adds what the Limiter would say of the requests whose limit
// and bucket id the tags accepted: unknown limits, bad bucket ids and
// repeated buckets.
func (s *Server) bucketErrors(reqs []limiter.Request, fs *fieldSet) {
	snap := s.cfg.Limiter.Snapshot()
	if snap == nil {
		return
	}
	now := s.now()
	first := map[string]int{}
	for i, r := range reqs {
		prefix := "buckets[" + strconv.Itoa(i) + "]"
		if fs.has(prefix+".limit") || fs.has(prefix+".bucket_id") {
			continue
		}
		res, err := snap.Resolve(r.Limit, r.BucketID, now)
		var fe limiter.FieldError
		if errors.As(err, &fe) {
			fs.add(prefix+"."+fe.Field, fe.Message)
			continue
		}
		if j, ok := first[res.Key]; ok {
			fs.add(prefix, "same bucket as buckets["+strconv.Itoa(j)+"]")
			continue
		}
		first[res.Key] = i
	}
}

// fill converts a result into the answer's DTO, reusing its memory.
func (sc *decisionScratch) fill(res limiter.Result) {
	out := &sc.result
	out.Allowed, out.Degraded = res.Allowed, res.Degraded
	out.RetryAfterMS, out.ResetAfterMS = millis(res.RetryAfter), millis(res.ResetAfter)
	out.Decisions = out.Decisions[:0]
	for i := range res.Decisions {
		d := &res.Decisions[i]
		out.Decisions = append(out.Decisions, decisionResponse{
			Limit: d.Limit, BucketID: d.BucketID, Allowed: d.Allowed, Remaining: d.Remaining,
			RetryAfterMS: millis(d.RetryAfter), ResetAfterMS: millis(d.ResetAfter),
			Burst: d.Params.Burst, Count: d.Params.Count, Period: sc.period(d.Params.Period),
			Source: d.Source, Shadow: d.Shadow, reason: d.Reason,
		})
		if r := &out.Decisions[len(out.Decisions)-1]; r.reason != "" {
			r.Reason = &r.reason
		}
	}
}

// millis converts a duration into whole milliseconds, rounded up so that a
// client waiting that long is never early; limiter.Never stays -1.
func millis(d time.Duration) int64 {
	if d == limiter.Never {
		return -1
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// seconds converts a duration into whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// setHeaders sets RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers) for the most restrictive bucket,
// and Retry-After when the answer is a denial that a retry can overcome.
// The two RateLimit values share one string and one slice allocation.
func (sc *decisionScratch) setHeaders(h http.Header, op limiter.Op, res limiter.Result) {
	if i := mostRestrictive(op, res); i >= 0 {
		d := &res.Decisions[i]
		// The window holds the burst: burst·T, rounded up. A blocked
		// bucket (burst 0) has none, and the draft wants a positive
		// window: its quota of 0 is given over the period.
		window := seconds(time.Duration(d.Params.Rate().Offset()) * time.Microsecond)
		if window == 0 {
			window = max(1, seconds(d.Params.Period))
		}
		b := append(sc.header[:0], '"')
		b = append(b, d.Limit...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, d.Params.Burst, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, window, 10)
		policyEnd := len(b)
		b = append(b, '"')
		b = append(b, d.Limit...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, d.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, seconds(d.ResetAfter), 10)
		sc.header = b
		both := string(b)
		values := []string{both[:policyEnd], both[policyEnd:]}
		// The canonical keys, set directly to skip canonicalising them.
		h["Ratelimit-Policy"], h["Ratelimit"] = values[0:1:1], values[1:2:2]
	}
	if op != limiter.Refund && !res.Allowed && res.RetryAfter > 0 {
		h["Retry-After"] = []string{strconv.FormatInt(seconds(res.RetryAfter), 10)}
	}
}

// mostRestrictive picks the bucket the RateLimit headers describe, -1 for
// none. Shadow buckets never restrict and unlimited ones have no limit.
// Of the denied buckets it is the one with the longest retry-after (one
// that can never succeed first); when none is denied, the one with the
// fewest tokens left. A degraded answer knows nothing of the buckets it
// allowed, so only a denied bucket can be described. A refund denies
// nothing: its buckets compete on tokens left.
func mostRestrictive(op limiter.Op, res limiter.Result) int {
	best, bestDenied := -1, false
	for i := range res.Decisions {
		d := &res.Decisions[i]
		if d.Shadow || d.Source == limiter.SourceUnlimited {
			continue
		}
		denied := !d.Allowed && op != limiter.Refund
		if res.Degraded && !denied {
			continue
		}
		if best < 0 {
			best, bestDenied = i, denied
			continue
		}
		b := &res.Decisions[best]
		switch {
		case denied && !bestDenied,
			denied && longerRetry(d.RetryAfter, b.RetryAfter),
			!denied && !bestDenied && d.Remaining < b.Remaining:
			best, bestDenied = i, denied
		}
	}
	return best
}

// longerRetry reports whether retry-after a is longer than b; Never is the
// longest.
func longerRetry(a, b time.Duration) bool {
	switch {
	case b == limiter.Never:
		return false
	case a == limiter.Never:
		return true
	}
	return a > b
}

// resetBuckets makes buckets full again.
func (s *Server) resetBuckets(c echo.Context) error {
	var req resetRequest
	var fs fieldSet
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	reqs := req.requests()
	if !fs.empty() {
		s.bucketErrors(reqs, &fs)
		return fs.err()
	}
	n, err := s.cfg.Limiter.Reset(c.Request().Context(), reqs)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, resetResponse{Reset: n})
}
