// Package ratelimit puts ratelimitd in front of a Go service: decisions
// (Spend, Check, Refund, Settle), leases that renew themselves (Acquire),
// net/http middleware, and, in package ratelimitgrpc, gRPC interceptors.
//
// A Client shares one HTTP exchange among the calls a process makes at
// once: a call that finds no request in flight (fewer than
// Config.MaxInFlight) is sent at once, and the calls that arrive while it
// is out go together in the next request to ratelimitd's POST
// /v1/decisions. No timer holds a call back. Each call keeps its own
// context, and ends by its deadline (Config.Timeout when its context has
// none sooner) with the fail mode's answer if ratelimitd has not answered
// by then.
//
// Three things answer without ratelimitd, each said in the Result:
//
//   - Local denials: a spend that ratelimitd denied with a retry-after is
//     denied by the Client itself, at the same cost or more, until that
//     time (Result.Local). Config.NoLocalDenials turns them off.
//   - The fail mode: when ratelimitd cannot be reached, is slower than the
//     deadline, or answers with a server error or something that is not an
//     answer, Config.FailOpen chooses between allowed (Result.Degraded)
//     and ErrUnavailable.
//   - The breaker: after Config.BreakerFailures requests in a row have
//     failed, calls get the fail mode's answer at once, without a request,
//     for Config.BreakerCooldown; then one request goes as a probe, and
//     its success closes the breaker again.
//
// No call answers allowed together with an error: when err is not nil,
// Result.Allowed is false.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/key"
)

// Defaults of Config.
const (
	DefaultTimeout         = 50 * time.Millisecond
	DefaultMaxInFlight     = 1
	DefaultMaxBatch        = 500
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
	// DefaultLocalDenials is how many buckets the local denials remember
	// at most.
	DefaultLocalDenials = 10000
)

// maxRequests is the most requests POST /v1/decisions takes in one call.
const maxRequests = 1000

// Config configures a Client. URL and Token are required; every other
// field has a default when left zero.
type Config struct {
	// URL is ratelimitd's base URL, such as "http://ratelimitd:8080".
	URL string
	// Token is a bearer token of scope decide.
	Token string
	// Timeout bounds each call that has no earlier deadline of its own:
	// when ratelimitd has not answered by then, the call gets the fail
	// mode's answer. DefaultTimeout when zero. A decision worth waiting
	// longer for than a slow request is worth failing is rare.
	Timeout time.Duration
	// FailOpen answers allowed, with Result.Degraded, when ratelimitd
	// gives no answer in time; otherwise such a call returns
	// ErrUnavailable and is not allowed. Choose open when serving matters
	// more than the limit (most request rate limits), closed when the
	// limit protects something that must not be overrun (a paid quota, a
	// fragile backend).
	FailOpen bool
	// MaxInFlight bounds the requests to ratelimitd in flight at once;
	// calls made meanwhile wait for one of them to end and then go
	// together. DefaultMaxInFlight when zero. Fewer requests in flight
	// means more decisions per request, cheaper for the client, ratelimitd
	// and Redis alike (docs/performance.md measures 1, 2 and 3), while a
	// call may wait for a request ahead of it.
	MaxInFlight int
	// MaxBatch bounds the calls one request carries (at most 1000, what
	// ratelimitd takes). DefaultMaxBatch when zero.
	MaxBatch int
	// NoLocalDenials turns off local denials: every spend then goes to
	// ratelimitd, even for a bucket it has just denied. Local denials save
	// a round trip for every call against an empty bucket, at a price: a
	// refund or reset made through another client, or a raised limit or
	// override, is seen only when the remembered retry-after has passed.
	// Refunds and settles made through this Client forget their buckets
	// at once.
	NoLocalDenials bool
	// BreakerFailures is how many requests in a row must fail for the
	// breaker to open. DefaultBreakerFailures when zero.
	BreakerFailures int
	// BreakerCooldown is how long the breaker stays open before it lets a
	// probe through. DefaultBreakerCooldown when zero.
	BreakerCooldown time.Duration
	// HTTPClient sends the requests. When nil, the Client uses a client
	// of its own whose transport keeps MaxInFlight connections to
	// ratelimitd (and a few more for leases) open between requests. Its
	// own Timeout, if any, is a bound above the calls' deadlines.
	HTTPClient *http.Client
	// Hooks report what the Client does, for a service's own metrics.
	Hooks Hooks
}

// Hooks are called, when not nil, as things happen, so that a service can
// count them in its own metrics registry. They are called synchronously
// and must not block.
type Hooks struct {
	// LocalDenial is called for each call denied locally, with the limit
	// of the first bucket remembered as denied.
	LocalDenial func(limit string)
	// FailMode is called for each call answered by the fail mode, with
	// why: ErrUnavailable wrapping the cause.
	FailMode func(err error)
	// Breaker is called when the breaker opens (true) or closes (false).
	Breaker func(open bool)
	// Request is called after each request to ratelimitd with the calls
	// it carried, how long it took and its error (nil when ratelimitd
	// answered).
	Request func(calls int, took time.Duration, err error)
}

// Bucket names a bucket and the cost a call takes from it (or, for a
// refund, gives back; for an acquire, holds). A zero Cost takes nothing:
// a check or spend of cost 0 inspects the bucket.
type Bucket struct {
	Limit string
	ID    string
	Cost  int64
}

// Settlement charges what a request really cost (Actual) against what its
// spend took up front (Reserved): less gives the difference back, more
// charges the excess, even into debt.
type Settlement struct {
	Limit    string
	ID       string
	Reserved int64
	Actual   int64
}

// Never is the RetryAfter of a request that can never succeed: a blocked
// bucket, or a cost above the burst.
const Never time.Duration = -1

// Result is the answer to a call.
type Result struct {
	// Allowed is whether the call was allowed: for a spend or check, no
	// bucket outside shadow limits was denied; for a refund, every such
	// bucket got something back; for a settle, no bucket was blocked; for
	// an acquire, the lease holds its units. Never true together with an
	// error.
	Allowed bool
	// RetryAfter is 0 when allowed; Never when a denied request can never
	// succeed; else the time until it would be allowed.
	RetryAfter time.Duration
	// ResetAfter is the longest time until a bucket is full again.
	ResetAfter time.Duration
	// Degraded says that the fail mode answered, ratelimitd's (its store
	// was unreachable) or this Client's (ratelimitd was): nothing was
	// decided, and Decisions may be empty.
	Degraded bool
	// Local says that this Client denied the call itself, from an earlier
	// denial of the same bucket, without asking ratelimitd. Decisions
	// then holds the remembered decisions of the denied buckets only.
	Local bool
	// Decisions has one decision per bucket, in the order of the call.
	Decisions []Decision
	// Lease is the lease of an allowed acquire, nil otherwise.
	Lease *Lease
}

// Decision is the answer for one bucket.
type Decision struct {
	Limit string
	// BucketID is the bucket id in its canonical form.
	BucketID string
	Allowed  bool
	// Reason is "" when allowed, else "limited", "blocked" (an override of
	// burst 0) or "cost_exceeds_burst".
	Reason string
	// Remaining is the whole tokens left after the call.
	Remaining int64
	// Concurrent says that the bucket is of a concurrency limit, whose
	// Held units are held by leases.
	Concurrent bool
	Held       int64
	// Debt is the whole tokens owed beyond empty after a settle.
	Debt int64
	// Capped says that a settle charged less than the excess, as the
	// bucket would otherwise be more than one burst in debt.
	Capped     bool
	RetryAfter time.Duration
	ResetAfter time.Duration
	// Burst, Count and Period are the parameters in force.
	Burst  int64
	Count  int64
	Period time.Duration
	// Unit is what a token counts: "requests", "tokens", "bytes", ...
	Unit string
	// Source is "default", "override" or "unlimited".
	Source string
	// Shadow says that the limit only reports: it never denies.
	Shadow bool
}

// ErrUnavailable is the error of a call that ratelimitd gave no answer
// in time, when the fail mode is closed: it could not be reached, was
// slower than the call's deadline, answered with a server error, a
// refusal of the whole request that no call can mend (a revoked token, a
// ratelimitd without the route) or something that is not an answer, or
// the breaker was open. The error wraps the cause.
var ErrUnavailable = errors.New("ratelimitd gave no answer")

// Problem is a request refused by ratelimitd, as its RFC 9457 problem
// details say: an unknown limit, a bucket id its format refuses, a cost
// below 0. It is returned for the call alone, whatever the fail mode:
// retrying it would be refused again. The Client refuses some calls
// itself, in the same words, before sending them: a string not UTF-8 or
// holding NUL, a bucket id or limit name longer than any ratelimitd
// takes (422), a call larger than a body it reads (413). A request that
// ratelimitd refused as a whole for its body (400, 413, 422) is the
// Problem of each call it carried, not the fail mode's: ratelimitd is up.
type Problem struct {
	Type   string
	Title  string
	Status int
	Detail string
	// RequestID is in ratelimitd's log too.
	RequestID string
	// Errors lists every bad field, as "buckets[0].bucket_id".
	Errors []FieldError
}

// BadBucketID reports whether the problem is a 422 of bucket ids alone,
// which their limit's id format refused: a key taken from a request that
// is not an id of the limit (a header holding no valid account number,
// say), the request's fault rather than the service's.
func (p *Problem) BadBucketID() bool {
	for _, f := range p.Errors {
		if !strings.HasSuffix(f.Field, ".bucket_id") {
			return false
		}
	}
	return p.Status == http.StatusUnprocessableEntity && len(p.Errors) > 0
}

// FieldError is one bad field of a Problem.
type FieldError struct {
	Field   string
	Message string
}

func (p *Problem) Error() string {
	var b strings.Builder
	b.WriteString("ratelimitd: ")
	b.WriteString(strconv.Itoa(p.Status))
	b.WriteString(" ")
	b.WriteString(p.Detail)
	for _, f := range p.Errors {
		b.WriteString("; ")
		b.WriteString(f.Field)
		b.WriteString(": ")
		b.WriteString(f.Message)
	}
	return b.String()
}

// Client asks ratelimitd for decisions, sharing requests among concurrent
// calls. It is safe for concurrent use; make one per process and
// ratelimitd.
type Client struct {
	endpoint string
	auth     string
	http     *http.Client
	timeout  time.Duration
	failOpen bool
	hooks    Hooks
	// maxBatch bounds the calls a request carries.
	maxBatch int

	breaker breaker
	denials *denials // nil when local denials are off
	// now reads the clock of the breaker and the local denials, which
	// tests replace; deadlines, timers and leases read time.Now.
	now func() time.Time

	mu sync.Mutex
	// queue holds the calls waiting for a request.
	queue       []*call
	inFlight    int
	maxInFlight int

	calls   sync.Pool // *call
	scratch sync.Pool // *scratch, the senders' memory
}

// New returns a Client of ratelimitd at cfg.URL.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ratelimit: URL %q is not an http or https URL", cfg.URL)
	}
	if cfg.Token == "" {
		return nil, errors.New("ratelimit: a Token of scope decide is required")
	}
	for _, v := range []struct {
		name string
		n    int64
	}{{"Timeout", int64(cfg.Timeout)}, {"MaxInFlight", int64(cfg.MaxInFlight)}, {"MaxBatch", int64(cfg.MaxBatch)},
		{"BreakerFailures", int64(cfg.BreakerFailures)}, {"BreakerCooldown", int64(cfg.BreakerCooldown)}} {
		if v.n < 0 {
			return nil, fmt.Errorf("ratelimit: %s must not be negative", v.name)
		}
	}
	if cfg.MaxBatch > maxRequests {
		return nil, fmt.Errorf("ratelimit: MaxBatch %d is above the %d requests ratelimitd takes at once", cfg.MaxBatch, maxRequests)
	}
	c := &Client{
		endpoint:    strings.TrimRight(cfg.URL, "/") + "/v1/decisions",
		auth:        "Bearer " + cfg.Token,
		http:        cfg.HTTPClient,
		timeout:     or(cfg.Timeout, DefaultTimeout),
		failOpen:    cfg.FailOpen,
		hooks:       cfg.Hooks,
		maxBatch:    or(cfg.MaxBatch, DefaultMaxBatch),
		maxInFlight: or(cfg.MaxInFlight, DefaultMaxInFlight),
		now:         time.Now,
	}
	c.breaker = breaker{failures: or(cfg.BreakerFailures, DefaultBreakerFailures), cooldown: or(cfg.BreakerCooldown, DefaultBreakerCooldown), hook: cfg.Hooks.Breaker}
	if !cfg.NoLocalDenials {
		c.denials = newDenials(DefaultLocalDenials)
	}
	if c.http == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Requests in flight, and the renewals and releases of leases,
		// which go through the same queue: a few spare connections spare
		// a handshake when a lease's request overlaps a full window.
		t.MaxIdleConnsPerHost = c.maxInFlight + 2
		c.http = &http.Client{Transport: t}
	}
	return c, nil
}

// or returns v, or def when v is zero.
func or[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Spend takes each bucket's cost, all or nothing: when any bucket outside
// shadow limits cannot give its cost, none is spent and the call is
// denied.
func (c *Client) Spend(ctx context.Context, buckets ...Bucket) (Result, error) {
	start := c.now()
	if r, ok := c.denials.deny(start, buckets); ok {
		if c.hooks.LocalDenial != nil {
			c.hooks.LocalDenial(r.Decisions[0].Limit)
		}
		return r, nil
	}
	epoch := c.denials.epoch()
	r, err := c.decide(ctx, call{op: opSpend, buckets: buckets})
	if err == nil && !r.Degraded {
		// From the call's start, before ratelimitd decided: the
		// remembered denial ends no later than ratelimitd's.
		c.denials.learn(start, epoch, buckets, r.Decisions)
	}
	return r, err
}

// Check answers as Spend would, without spending. A cost of 0 says
// whether the bucket is within its limit now; for a concurrency limit's
// bucket, Decision.Held says how many units its leases hold.
func (c *Client) Check(ctx context.Context, buckets ...Bucket) (Result, error) {
	return c.decide(ctx, call{op: opCheck, buckets: buckets})
}

// Refund gives each bucket's cost back, never past full; Allowed says
// whether every bucket got something back.
func (c *Client) Refund(ctx context.Context, buckets ...Bucket) (Result, error) {
	for _, b := range buckets {
		c.denials.forget(b.Limit, b.ID)
	}
	return c.decide(ctx, call{op: opRefund, buckets: buckets})
}

// Settle charges what requests really cost once that is known, against
// what their spends reserved.
func (c *Client) Settle(ctx context.Context, settlements ...Settlement) (Result, error) {
	for _, s := range settlements {
		c.denials.forget(s.Limit, s.ID)
	}
	return c.decide(ctx, call{op: opSettle, settlements: settlements})
}

// decide makes a call and waits for its answer, its context's end or its
// deadline, whichever comes first; past the deadline, the fail mode
// answers. The call's memory is pooled unless the call was abandoned
// while a request still holds it.
func (c *Client) decide(ctx context.Context, ask call) (Result, error) {
	cl, err := c.ask(ctx, ask)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return c.failMode(err)
		}
		return Result{}, err
	}
	r := cl.res
	c.putCall(cl)
	return r, nil
}

// ask sends a call and waits for its answer, its context's end or its
// deadline, whichever comes first. It returns the call, to be pooled by
// the caller once read, or an error: ErrUnavailable wrapping why
// ratelimitd gave no answer, the call's Problem, or the context's error
// when it was cancelled.
func (c *Client) ask(ctx context.Context, ask call) (*call, error) {
	if err := ask.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ok, probe := c.breaker.allow(c.now())
	if !ok {
		return nil, fmt.Errorf("%w: the breaker is open after %d failed requests in a row", ErrUnavailable, c.breaker.failures)
	}
	cl := c.getCall()
	done, timer := cl.done, cl.timer
	*cl = ask
	cl.done, cl.timer, cl.ctx, cl.probe = done, timer, ctx, probe
	now := time.Now()
	// The Client's Timeout bounds the call unless its context ends
	// sooner; then the context's end alone does.
	var timeout <-chan time.Time
	if d, ok := ctx.Deadline(); ok && d.Before(now.Add(c.timeout)) {
		cl.deadline = d
	} else {
		cl.deadline = now.Add(c.timeout)
		timer.Reset(c.timeout)
		timeout = timer.C
	}
	c.enqueue(cl)

	select {
	case <-cl.done:
		// Stopped, a timer sends nothing more (Go 1.23): the call's next
		// use cannot read this one's expiry. It is stopped before the
		// call goes back to the pool, whence another may take it.
		timer.Stop()
		if err := cl.err; err != nil {
			c.putCall(cl)
			return nil, err
		}
		return cl, nil
	case <-ctx.Done():
		// The request may still answer: the call stays with it, unpooled.
		timer.Stop()
		if ctx.Err() == context.DeadlineExceeded {
			return nil, fmt.Errorf("%w: no answer within the call's deadline: %w", ErrUnavailable, ctx.Err())
		}
		return nil, ctx.Err()
	case <-timeout:
		return nil, fmt.Errorf("%w: no answer within %v: %w", ErrUnavailable, c.timeout, context.DeadlineExceeded)
	}
}

// failMode answers a call that ratelimitd did not: allowed and degraded
// when failing open, else err (which wraps ErrUnavailable).
func (c *Client) failMode(err error) (Result, error) {
	if c.hooks.FailMode != nil {
		c.hooks.FailMode(err)
	}
	if c.failOpen {
		return Result{Allowed: true, Degraded: true}, nil
	}
	return Result{}, err
}

// op is the kind of a call, as POST /v1/decisions names it.
type op uint8

const (
	opSpend op = iota
	opCheck
	opRefund
	opSettle
	opAcquire
	opRelease
	opRenew
)

var opNames = [...]string{"spend", "check", "refund", "settle", "acquire", "release", "renew"}

// call is one request of a POST /v1/decisions: what was asked, and, once
// done is signalled, the answer.
type call struct {
	op          op
	buckets     []Bucket
	settlements []Settlement
	leaseID     string
	ttl         time.Duration
	ctx         context.Context
	deadline    time.Time
	// probe says that the call was let through an open breaker as its
	// probe.
	probe bool
	// bytes bounds what the call takes in a body (size), counted once by
	// validate.
	bytes int

	res Result
	// lease is the lease of an acquire's or renew's answer, and
	// released a release's.
	lease    wireLease
	released bool
	err      error
	done     chan struct{}
	// timer is the call's deadline, stopped while it is not in use; it
	// is pooled with the call, as done is.
	timer *time.Timer
}

func (c *Client) getCall() *call {
	if cl, ok := c.calls.Get().(*call); ok {
		return cl
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}

// putCall pools a call whose answer was received.
func (c *Client) putCall(cl *call) {
	done, timer := cl.done, cl.timer
	*cl = call{done: done, timer: timer}
	c.calls.Put(cl)
}

// Bounds of what a call may send, which validate holds it to.
const (
	// maxCallBody is the body ratelimitd reads (1 MiB), less the
	// envelope of the requests: a call longer than that alone cannot be
	// sent.
	maxCallBody = 1<<20 - len(`{"requests":[]}`)
	// maxLimitLen is the longest name a limit can have.
	maxLimitLen = 64
)

// validate refuses, before anything is sent, what ratelimitd would refuse
// with the whole request it travels in, so that the other calls of that
// request are not refused with it: strings that are not valid UTF-8 (a
// JSON body cannot carry them), and a call larger than the body
// ratelimitd reads. It refuses too, saving a round trip, what no limit
// could take: NUL, a bucket id longer than any id format takes, a limit
// name longer than any limit's. The strings' rule is package key's, which
// the middleware's and the interceptors' keys follow too. Each is a
// *Problem, as ratelimitd would word it for the call alone: a 422 naming
// the fields, or a 413. Everything else is ratelimitd's to judge, for
// this call alone.
func (cl *call) validate() error {
	var bad []FieldError
	check := func(i int, field, s string, most int) {
		if msg := key.Problem(s, most); msg != "" {
			bad = append(bad, FieldError{Field: "buckets[" + strconv.Itoa(i) + "]." + field, Message: msg})
		}
	}
	for i, b := range cl.buckets {
		check(i, "limit", b.Limit, maxLimitLen)
		check(i, "bucket_id", b.ID, key.MaxLen)
	}
	for i, s := range cl.settlements {
		check(i, "limit", s.Limit, maxLimitLen)
		check(i, "bucket_id", s.ID, key.MaxLen)
	}
	if bad != nil {
		return &Problem{Status: http.StatusUnprocessableEntity, Title: "Unprocessable Entity", Detail: "the request has invalid values", Errors: bad}
	}
	if cl.bytes = cl.size(); cl.bytes > maxCallBody {
		return &Problem{Status: http.StatusRequestEntityTooLarge, Title: "Request Entity Too Large",
			Detail: "the call takes more than the " + strconv.Itoa(maxCallBody) + " bytes of a body ratelimitd reads"}
	}
	return nil
}
