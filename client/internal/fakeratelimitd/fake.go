// Package fakeratelimitd is a stand-in for ratelimitd's POST /v1/decisions
// in the tests of the Go client's packages, where the real service (a
// module they must not import) cannot run: it answers from a small model
// written from the contract, and tests hold its requests at a gate, count
// them and break it. e2e tests the client against the real service.
package fakeratelimitd

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Token is the bearer token the fake accepts.
const Token = "secret"

// Retry is the retry-after of every denial.
const Retry = time.Minute

// Server models buckets of a burst that never refill, and leases that
// never expire but on request. It refuses what ratelimitd refuses of a
// bucket's id (empty, NUL, longer than the format string takes), a
// negative cost, reserved or actual, and a lease id not of its form, each
// for its request, and a body over MaxBody or not UTF-8 as a whole. It
// reads each request with encoding/json, refusing unknown fields, so that
// what a client writes is checked by a reader other than its own.
type Server struct {
	// URL is the fake's base URL.
	URL string
	// Gate, when not nil, holds every request until it is closed or a
	// value is sent on it.
	Gate chan struct{}
	// Arrived receives a value for each request, before the gate, while
	// it has room (100,000).
	Arrived chan struct{}
	// Fault, when not nil, may answer a request instead of the model,
	// and reports whether it did.
	Fault func(w http.ResponseWriter, r *http.Request) bool

	t      testing.TB
	srv    *httptest.Server
	bursts map[string]int64 // limit -> burst; other limits are a 422

	mu       sync.Mutex
	taken    map[string]int64            // limit "\x00" id -> tokens taken
	leases   map[string]map[string]int64 // lease id -> units held, by bucket
	requests int                         // HTTP requests answered
	sizes    []int                       // calls of each request, in order
	inFlight int
	maxIn    int
	ops      map[string]int // calls answered, by op
}

// New starts a fake of the limits given (name -> burst), closed when the
// test ends. Set Gate and Fault before the first request.
func New(t testing.TB, bursts map[string]int64) *Server {
	s := Start(bursts)
	s.t = t
	t.Cleanup(s.srv.Close)
	return s
}

// Start starts a fake of the limits given for an example, which has no
// test to fail: a request the fake cannot read panics. Close it after.
func Start(bursts map[string]int64) *Server {
	s := &Server{bursts: bursts, taken: map[string]int64{}, leases: map[string]map[string]int64{},
		ops: map[string]int{}, Arrived: make(chan struct{}, 100000)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// errorf fails the test, or panics in an example.
func (s *Server) errorf(format string, args ...any) {
	if s.t == nil {
		panic(fmt.Sprintf(format, args...))
	}
	s.t.Errorf(format, args...)
}

// Close stops the fake: its address then refuses connections.
func (s *Server) Close() { s.srv.Close() }

// Request is one request of a POST /v1/decisions body.
type Request struct {
	Op      string   `json:"op"`
	Buckets []Bucket `json:"buckets"`
	LeaseID string   `json:"lease_id"`
	TTLMs   *int64   `json:"ttl_ms"`
}

// Bucket is a bucket of a Request, any op's.
type Bucket struct {
	Limit    string `json:"limit"`
	BucketID string `json:"bucket_id"`
	Cost     *int64 `json:"cost"`
	Reserved *int64 `json:"reserved"`
	Actual   *int64 `json:"actual"`
}

func (b Bucket) cost() int64 {
	if b.Cost == nil {
		return 1
	}
	return *b.Cost
}

// Decision is a decision of an answer, as openapi.yaml's Decision.
type Decision struct {
	Limit        string  `json:"limit"`
	BucketID     string  `json:"bucket_id"`
	Allowed      bool    `json:"allowed"`
	Reason       *string `json:"reason"`
	Held         *int64  `json:"held,omitempty"`
	Remaining    int64   `json:"remaining"`
	Debt         int64   `json:"debt"`
	RetryAfterMs int64   `json:"retry_after_ms"`
	ResetAfterMs int64   `json:"reset_after_ms"`
	Burst        int64   `json:"burst"`
	Count        int64   `json:"count"`
	Period       string  `json:"period"`
	Unit         string  `json:"unit"`
	Capped       *bool   `json:"capped,omitempty"`
	Source       string  `json:"source"`
	Shadow       bool    `json:"shadow"`
}

// Lease is the lease of an acquire's or renew's answer.
type Lease struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Result is a decision's answer, or an acquire's with Lease.
type Result struct {
	Allowed bool `json:"allowed"`
	// Lease is set in an acquire's answer only: a lease, or null.
	Lease        **Lease    `json:"lease,omitempty"`
	RetryAfterMs int64      `json:"retry_after_ms"`
	ResetAfterMs int64      `json:"reset_after_ms"`
	Degraded     bool       `json:"degraded"`
	Decisions    []Decision `json:"decisions"`
}

// Problem is the result of a request refused on its own.
type Problem struct {
	Problem ProblemBody `json:"problem"`
}

// ProblemBody is an RFC 9457 problem as ratelimitd words it.
type ProblemBody struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail"`
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError is a bad field of a problem.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/decisions" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+Token || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	s.inFlight++
	s.maxIn = max(s.maxIn, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	select {
	case s.Arrived <- struct{}{}:
	default:
	}
	if s.Gate != nil {
		select {
		case <-s.Gate:
		case <-r.Context().Done():
			return
		}
	}
	if s.Fault != nil && s.Fault(w, r) {
		return
	}
	// ratelimitd's bound of the body, and its refusal of one that is not
	// UTF-8, are the whole request's, as there.
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		writeProblem(w, ProblemBody{Status: http.StatusRequestEntityTooLarge, Detail: "the body is larger than " + strconv.Itoa(MaxBody) + " bytes"})
		return
	}
	if !utf8.Valid(raw) {
		writeProblem(w, ProblemBody{Status: http.StatusBadRequest, Detail: "the body is not valid UTF-8"})
		return
	}
	var body struct {
		Requests []Request `json:"requests"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		s.errorf("the fake cannot read the request: %v", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(body.Requests) == 0 || len(body.Requests) > 1000 {
		s.errorf("a request of %d calls", len(body.Requests))
	}
	s.mu.Lock()
	s.requests++
	s.sizes = append(s.sizes, len(body.Requests))
	results := make([]any, len(body.Requests))
	for i, req := range body.Requests {
		s.ops[req.Op]++
		results[i] = s.answer(req)
	}
	s.mu.Unlock()
	out, err := json.Marshal(map[string]any{"results": results})
	if err != nil {
		s.errorf("%v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// answer decides one request; the caller holds mu.
func (s *Server) answer(req Request) any {
	switch req.Op {
	case "release", "renew":
		if !leaseID(req.LeaseID) {
			return Problem{ProblemBody{Type: "urn:ratelimitd:problem:validation", Title: "Unprocessable Entity", Status: 422,
				Detail: "the request has invalid values", Errors: []FieldError{{Field: "lease_id", Message: "must be a lease id as acquire returns it (lse_ and 26 characters)"}}}}
		}
	}
	switch req.Op {
	case "release":
		held, ok := s.leases[req.LeaseID]
		for k, n := range held {
			s.taken[k] -= n
		}
		delete(s.leases, req.LeaseID)
		return map[string]bool{"released": ok, "degraded": false}
	case "renew":
		if _, ok := s.leases[req.LeaseID]; !ok {
			return Problem{ProblemBody{Type: "urn:ratelimitd:problem:not-found", Title: "Not Found", Status: 404, Detail: "no such lease"}}
		}
		return map[string]any{"lease": Lease{ID: req.LeaseID, ExpiresAt: time.Now().Add(time.Minute).UTC()}, "degraded": false}
	}
	var bad []FieldError
	for i, b := range req.Buckets {
		if _, ok := s.bursts[b.Limit]; !ok {
			bad = append(bad, FieldError{Field: "buckets[" + strconv.Itoa(i) + "].limit", Message: "no such limit"})
		}
		if msg := idProblem(b.BucketID); msg != "" {
			bad = append(bad, FieldError{Field: "buckets[" + strconv.Itoa(i) + "].bucket_id", Message: msg})
		}
		for _, f := range []struct {
			name string
			v    *int64
		}{{"cost", b.Cost}, {"reserved", b.Reserved}, {"actual", b.Actual}} {
			if f.v != nil && *f.v < 0 {
				bad = append(bad, FieldError{Field: "buckets[" + strconv.Itoa(i) + "]." + f.name, Message: "must be an integer from 0 to 9223372036854775807"})
			}
		}
	}
	if bad != nil {
		return Problem{ProblemBody{Type: "urn:ratelimitd:problem:validation", Title: "Unprocessable Entity", Status: 422,
			Detail: "the request has invalid values", Errors: bad}}
	}
	res := Result{Allowed: true}
	for _, b := range req.Buckets {
		cost := b.cost()
		if req.Op == "settle" {
			cost = *b.Actual - *b.Reserved
		}
		burst, taken := s.bursts[b.Limit], s.taken[b.Limit+"\x00"+b.BucketID]
		d := Decision{Limit: b.Limit, BucketID: b.BucketID, Allowed: true, Burst: burst, Count: burst, Period: "1h0m0s",
			Unit: "requests", Source: "default", Remaining: burst - taken}
		if (req.Op == "spend" || req.Op == "check" || req.Op == "acquire") && taken+cost > burst {
			reason := "limited"
			d.Allowed, d.Reason, d.RetryAfterMs = false, &reason, Retry.Milliseconds()
			res.Allowed = false
			res.RetryAfterMs = max(res.RetryAfterMs, d.RetryAfterMs)
		}
		if req.Op == "acquire" {
			d.Held = &taken
		}
		res.Decisions = append(res.Decisions, d)
	}
	if res.Allowed {
		for i, b := range req.Buckets {
			k, cost := b.Limit+"\x00"+b.BucketID, b.cost()
			switch req.Op {
			case "spend", "acquire":
				s.taken[k] += cost
			case "refund":
				s.taken[k] = max(0, s.taken[k]-cost)
			case "settle":
				s.taken[k] += *b.Actual - *b.Reserved
			}
			res.Decisions[i].Remaining = s.bursts[b.Limit] - s.taken[k]
		}
	}
	if req.Op == "acquire" {
		var l *Lease
		if res.Allowed {
			id := make([]byte, 13)
			rand.Read(id)
			l = &Lease{ID: "lse_" + hex.EncodeToString(id), ExpiresAt: time.Now().Add(time.Minute).UTC()}
			held := map[string]int64{}
			for _, b := range req.Buckets {
				held[b.Limit+"\x00"+b.BucketID] += b.cost()
			}
			s.leases[l.ID] = held
		}
		res.Lease = &l
	}
	return res
}

// MaxBody is the most bytes of a body ratelimitd reads; a longer one is
// refused as a whole, 413.
const MaxBody = 1 << 20

// idProblem says why ratelimitd's id format "string", every limit's here,
// refuses id, "" when it does not. Other control characters than NUL,
// which the format refuses too, are let through, for the tests of the
// client's escaping.
func idProblem(id string) string {
	switch {
	case id == "":
		return "must not be empty"
	case strings.IndexByte(id, 0) >= 0:
		return "must not contain NUL"
	case len(id) > 256:
		return "longer than 256 bytes"
	}
	return ""
}

// leaseID reports whether id has the form of the lease ids ratelimitd
// gives.
func leaseID(id string) bool {
	return len(id) == len("lse_")+26 && strings.HasPrefix(id, "lse_")
}

// writeProblem answers the whole request with p, as ratelimitd does.
func writeProblem(w http.ResponseWriter, p ProblemBody) {
	p.Type, p.Title = "about:blank", http.StatusText(p.Status)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// Counts returns the requests answered and how many calls each carried.
func (s *Server) Counts() (int, []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, append([]int(nil), s.sizes...)
}

// Op returns how many calls of op the fake answered.
func (s *Server) Op(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

// Taken returns the tokens taken from a bucket.
func (s *Server) Taken(limit, id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken[limit+"\x00"+id]
}

// MaxInFlight returns the most requests the fake held at once.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxIn
}

// DropLeases forgets every lease, as if each had expired.
func (s *Server) DropLeases() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.leases)
}
