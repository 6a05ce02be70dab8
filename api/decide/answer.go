package decide

import (
	"time"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// result is the answer of a decision.
type result struct {
	Allowed bool `json:"allowed"`
	// Lease is nil but in an acquire's answer, which has the member
	// lease: the lease, or null when the acquire was denied.
	Lease        **lease    `json:"lease,omitempty"`
	RetryAfterMS int64      `json:"retry_after_ms"`
	ResetAfterMS int64      `json:"reset_after_ms"`
	Degraded     bool       `json:"degraded"`
	Decisions    []decision `json:"decisions"`
}

// decision is the answer for one bucket.
type decision struct {
	Limit        string          `json:"limit"`
	BucketID     string          `json:"bucket_id"`
	Allowed      bool            `json:"allowed"`
	Reason       *limiter.Reason `json:"reason"`
	Held         *int64          `json:"held,omitempty"` // concurrency limits only
	Remaining    int64           `json:"remaining"`
	Debt         int64           `json:"debt"`
	RetryAfterMS int64           `json:"retry_after_ms"`
	ResetAfterMS int64           `json:"reset_after_ms"`
	Burst        int64           `json:"burst"`
	Count        int64           `json:"count"`
	Period       string          `json:"period"`
	Unit         string          `json:"unit"`
	Capped       *bool           `json:"capped,omitempty"` // settles only
	Source       limiter.Source  `json:"source"`
	Shadow       bool            `json:"shadow"`
	// reason, held and capped are what Reason, Held and Capped point
	// to, so that the pointers cost no allocation.
	reason limiter.Reason
	held   int64
	capped bool
}

// lease is a lease as an answer gives it.
type lease struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// scratch is the working memory of one request, pooled so that the hot
// path allocates little more than the strings of the request.
type scratch struct {
	body      []byte
	reqs      []limiter.Request
	decisions []limiter.Decision
	result    result
	// lease and leased are what result.Lease points to in an acquire's
	// answer.
	lease  lease
	leased *lease
	out    []byte
	// x is the request's passage through the edge, which holds the
	// answer's headers.
	x *edge.Exchange
	// calls are the requests of /v1/decisions that its Limiter decides;
	// ends[i] is where calls[i]'s buckets end in reqs. slots are the
	// requests in body order: k >= 0 for calls[k], -1-k for refused[k],
	// the problem of a request refused before a decision.
	calls   []limiter.Call
	ends    []int
	slots   []int
	refused []error
	// names interns limit names and periods: they repeat across requests,
	// and a pooled scratch needs no lock to look them up.
	names   map[string]string
	periods map[time.Duration]string
}

// Bounds of what a pooled scratch keeps between requests, so that one huge
// or unusual request does not pin its memory.
const (
	maxPooledBody = 64 << 10
	// maxPooledItems bounds the buckets, decisions and requests kept.
	maxPooledItems = 4096
	maxInterned    = 256
	// maxLimitName is the longest limit name (limiter.NameProblem).
	maxLimitName = 64
)

// reset readies a scratch from the pool for the request whose passage is x.
func (sc *scratch) reset(x *edge.Exchange) {
	sc.body, sc.reqs, sc.out, sc.x = sc.body[:0], sc.reqs[:0], sc.out[:0], x
	sc.calls, sc.ends, sc.slots, sc.refused = sc.calls[:0], sc.ends[:0], sc.slots[:0], sc.refused[:0]
}

// release readies a scratch for the pool, whatever way its request ended:
// it drops what a large request grew and what belongs to the request
// alone, which the pool would otherwise keep for as long as no request
// takes the scratch again.
func (sc *scratch) release() {
	if cap(sc.body) > maxPooledBody {
		sc.body = nil
	}
	if cap(sc.out) > maxPooledBody {
		sc.out = nil
	}
	if cap(sc.reqs) > maxPooledItems || cap(sc.decisions) > maxPooledItems || cap(sc.calls) > maxPooledItems {
		sc.reqs, sc.decisions, sc.calls = nil, nil, nil
	}
	// Calls hold leases and errors: dropped, not kept.
	clear(sc.calls)
	clear(sc.refused)
	sc.x = nil
}

// intern returns b as a string, without allocating when it was seen before.
// Only what can be a limit name is kept, so that a pooled scratch never
// holds large strings from a body.
func (sc *scratch) intern(b []byte) string {
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
func (sc *scratch) period(d time.Duration) string {
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

// fill converts a result into the answer's DTO, reusing its memory.
func (sc *scratch) fill(op limiter.Op, res limiter.Result) {
	out := &sc.result
	out.Allowed, out.Degraded, out.Lease = res.Allowed, res.Degraded, nil
	out.RetryAfterMS, out.ResetAfterMS = millis(res.RetryAfter), millis(res.ResetAfter)
	out.Decisions = out.Decisions[:0]
	for i := range res.Decisions {
		d := &res.Decisions[i]
		out.Decisions = append(out.Decisions, decision{
			Limit: d.Limit, BucketID: d.BucketID, Allowed: d.Allowed, Remaining: d.Remaining, Debt: d.Debt,
			RetryAfterMS: millis(d.RetryAfter), ResetAfterMS: millis(d.ResetAfter),
			Burst: d.Params.Burst, Count: d.Params.Count, Period: sc.period(d.Params.Period), Unit: d.Unit,
			Source: d.Source, Shadow: d.Shadow, reason: d.Reason, held: d.Held, capped: d.Capped,
		})
		r := &out.Decisions[len(out.Decisions)-1]
		if r.reason != "" {
			r.Reason = &r.reason
		}
		if d.Kind == limiter.KindConcurrency {
			r.Held = &r.held
		}
		if op == limiter.Settle {
			r.Capped = &r.capped
		}
	}
}

// fillAcquire converts an acquire's result into the answer's DTO: a
// decision's, with the lease.
func (sc *scratch) fillAcquire(res limiter.LeaseResult) {
	sc.fill(limiter.Spend, res.Result)
	sc.leased = nil
	if res.Lease != nil {
		sc.lease = lease{ID: res.Lease.ID, ExpiresAt: res.Lease.Expires.UTC()}
		sc.leased = &sc.lease
	}
	sc.result.Lease = &sc.leased
}

// millis converts a duration into whole milliseconds, rounded up so that a
// client waiting that long is never early; limiter.Never stays -1.
func millis(d time.Duration) int64 {
	if d == limiter.Never {
		return -1
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
