// Package rls answers Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, over the same
// Limiter as the REST API, so that Envoy, Istio and Envoy Gateway can use
// ratelimitd in place of envoyproxy/ratelimit. The rules in the snapshot map
// a request's domain and descriptors onto limits and bucket ids.
package rls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/api/descriptor"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Decider answers decisions; *limiter.Limiter is one.
type Decider = descriptor.Decider

// Observer counts what this front end decides into the metrics shared with
// REST; *telemetry.Front is one.
type Observer interface {
	ObserveDecisions(op limiter.Op, res limiter.Result)
	// ObserveUnits counts the units a spend took from calendar quotas.
	ObserveUnits(op limiter.Op, reqs []limiter.Request, res limiter.Result)
	// ObserveUnmatched counts descriptors that matched no rule.
	ObserveUnmatched(n int)
}

// service implements RateLimitServiceServer.
type service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	lim     Decider
	obs     Observer
	log     *slog.Logger
	scratch sync.Pool

	// omitHeaders leaves response_headers_to_add empty.
	omitHeaders bool
}

// newService returns the service of a Server's config.
func newService(cfg Config) *service {
	s := &service{lim: cfg.Limiter, obs: cfg.Observer, omitHeaders: cfg.OmitHeaders, log: cfg.Logger}
	s.scratch.New = func() any { return &batch{} }
	return s
}

// batch is the working memory of one request, pooled.
type batch struct {
	descriptor.Batch
	entries []limiter.DescriptorEntry
}

// ShouldRateLimit decides a request as one all-or-nothing spend of its
// matched descriptors.
func (s *service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	snap := s.lim.Snapshot()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "no snapshot of the limits is loaded yet")
	}
	b := s.scratch.Get().(*batch)
	defer s.scratch.Put(b)
	if err := b.translate(snap, req); err != nil {
		return nil, err
	}
	descriptors := req.GetDescriptors()
	r := newReply(len(descriptors))
	if unmatched := b.Unmatched(); unmatched > 0 {
		s.obs.ObserveUnmatched(unmatched)
	}
	res, err := b.Decide(ctx, s.lim)
	if err != nil {
		return nil, statusOf(ctx, err)
	}
	if len(res.Decisions) == 0 {
		return &r.resp, nil
	}
	s.obs.ObserveDecisions(limiter.Spend, res)
	s.obs.ObserveUnits(limiter.Spend, b.Spent(), res)
	if !res.Allowed {
		r.resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i := range descriptors {
		if j := b.Decision(i); j >= 0 && !res.Degraded {
			r.status(i, &res.Decisions[j])
		}
	}
	if !s.omitHeaders {
		r.headers(res)
	}
	return &r.resp, nil
}

// reply is an answer and every message in it, allocated at once: built
// one by one, they were three allocations a descriptor and five more.
type reply struct {
	resp        rlsv3.RateLimitResponse
	descriptors []descriptorReply
	statuses    []*rlsv3.RateLimitResponse_DescriptorStatus
	header      [3]corev3.HeaderValue
	headerList  [3]*corev3.HeaderValue
}

// descriptorReply is the status of a descriptor and what it points to.
type descriptorReply struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// newReply returns an answer of n descriptors, all OK and without a limit
// until status says otherwise.
func newReply(n int) *reply {
	r := &reply{descriptors: make([]descriptorReply, n), statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	r.resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range r.descriptors {
		r.descriptors[i].status.Code = rlsv3.RateLimitResponse_OK
		r.statuses[i] = &r.descriptors[i].status
	}
	r.resp.Statuses = r.statuses
	return r
}

// status fills the status of descriptor i from the decision of its bucket.
func (r *reply) status(i int, d *limiter.Decision) {
	dr := &r.descriptors[i]
	st := &dr.status
	if !d.Allowed && !d.Shadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if d.Source == limiter.SourceUnlimited {
		// As envoyproxy/ratelimit answers it: all that 32 bits hold.
		st.LimitRemaining = math.MaxUint32
		return
	}
	if d.Params.Burst == 0 {
		// Blocked: 0 requests in the unit of the override's period,
		// as envoyproxy/ratelimit reports requests_per_unit 0.
		setCurrentLimit(&dr.limit, d.Limit, limiter.Params{Count: 1, Period: d.Params.Period})
		dr.limit.RequestsPerUnit = 0
	} else if !setQuotaLimit(&dr.limit, d) {
		setCurrentLimit(&dr.limit, d.Limit, d.Params)
	}
	st.CurrentLimit = &dr.limit
	st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	reset := d.UntilReset(limiter.Spend)
	dr.reset.Seconds, dr.reset.Nanos = int64(reset/time.Second), int32(reset%time.Second)
	st.DurationUntilReset = &dr.reset
}

// translate turns a request into the batch of the limiter (package
// descriptor). Every bad field is an INVALID_ARGUMENT naming the
// descriptor and entry; the first one found is reported, as a gRPC status
// carries one message.
func (b *batch) translate(snap *limiter.Snapshot, req *rlsv3.RateLimitRequest) error {
	if err := b.Reset(req.GetDomain()); err != nil {
		return invalid(err.Error())
	}
	descriptors := req.GetDescriptors()
	if err := descriptor.CheckCount(len(descriptors)); err != nil {
		return invalid(err.Error())
	}
	for i, d := range descriptors {
		b.entries = b.entries[:0]
		for _, e := range d.GetEntries() {
			b.entries = append(b.entries, limiter.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if d.GetIsNegativeHits() {
			return invalid("descriptors[" + strconv.Itoa(i) + "].is_negative_hits: not supported; ratelimitd refunds over REST")
		}
		cost := uint64(1)
		switch {
		case d.GetHitsAddend() != nil:
			cost = d.GetHitsAddend().GetValue()
		case req.GetHitsAddend() > 0:
			cost = uint64(req.GetHitsAddend())
		}
		if err := b.Add(snap, b.entries, cost); err != nil {
			return invalid(err.Error())
		}
	}
	return nil
}

// statusOf maps an error of the batch or the limiter to a status: a
// descriptor that cannot be decided is INVALID_ARGUMENT naming it.
func statusOf(ctx context.Context, err error) error {
	var de *descriptor.Error
	switch {
	case errors.As(err, &de):
		return invalid(de.Error())
	case errors.Is(err, limiter.ErrUnavailable):
		return status.Error(codes.Unavailable, "the bucket store is unavailable; retry later")
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Internal, "internal error")
}

func invalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }

// units are Envoy's units of current_limit, largest first, as
// envoyproxy/ratelimit counts them (a month of 30 days, a year of 365).
var units = []struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
}

// setCurrentLimit sets out to a rate of count per period in Envoy's terms: in the
// largest unit, no longer than the period, in which the number of requests
// is whole (300 per 3h is 100 per HOUR, 10 per second 10 per SECOND); when
// there is none, in the smallest unit in which it is at least 1, rounded
// down (1 per 90s is 40 per HOUR); a rate below 1 a year shows as 1 per
// YEAR. A limit's rate is at most a million a second, which always fits
// Envoy's 32 bits in seconds.
func setCurrentLimit(out *rlsv3.RateLimitResponse_RateLimit, name string, p limiter.Params) {
	out.Name, out.RequestsPerUnit, out.Unit = name, 1, rlsv3.RateLimitResponse_RateLimit_YEAR
	for _, u := range units {
		hi, lo := bits.Mul64(uint64(p.Count), uint64(u.d))
		if hi >= uint64(p.Period) {
			continue // over 2^64 a unit
		}
		q, r := bits.Div64(hi, lo, uint64(p.Period))
		switch {
		case q == 0 || q > math.MaxUint32:
		case r == 0 && u.d <= p.Period:
			out.RequestsPerUnit, out.Unit = uint32(q), u.unit
			return
		default:
			// Units go from the largest down: the last kept is the
			// smallest.
			out.RequestsPerUnit, out.Unit = uint32(q), u.unit
		}
	}
}

// calendarUnits are Envoy's units of the calendar quotas' windows.
var calendarUnits = map[limiter.Calendar]rlsv3.RateLimitResponse_RateLimit_Unit{
	limiter.CalendarHour:  rlsv3.RateLimitResponse_RateLimit_HOUR,
	limiter.CalendarDay:   rlsv3.RateLimitResponse_RateLimit_DAY,
	limiter.CalendarWeek:  rlsv3.RateLimitResponse_RateLimit_WEEK,
	limiter.CalendarMonth: rlsv3.RateLimitResponse_RateLimit_MONTH,
	limiter.CalendarYear:  rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// setQuotaLimit sets out to a calendar quota's count per its window's
// unit, 1000 per DAY, whatever the window's length: as a rate over the
// current window, 1000 in a day of 25 hours would read 960 per DAY. It reports
// false for a decision that is no quota's, or whose count is beyond
// Envoy's 32 bits, which setCurrentLimit then words as a rate.
func setQuotaLimit(out *rlsv3.RateLimitResponse_RateLimit, d *limiter.Decision) bool {
	unit, ok := calendarUnits[d.Calendar]
	if !ok || d.Params.Count > math.MaxUint32 {
		return false
	}
	out.Name, out.RequestsPerUnit, out.Unit = d.Limit, uint32(d.Params.Count), unit
	return true
}

// headers sets the RateLimit-Policy, RateLimit and Retry-After headers of
// the REST answer (problem.AppendRateLimit), for Envoy to add to its
// response. Their values share one string.
func (r *reply) headers(res limiter.Result) {
	var text [256]byte
	buf, ends := problem.AppendRateLimit(text[:0], limiter.Spend, res)
	if len(buf) == 0 {
		return
	}
	values := string(buf)
	n, start := 0, 0
	for _, h := range [...]struct {
		key string
		end int
	}{{"RateLimit-Policy", ends.Policy}, {"RateLimit", ends.RateLimit}, {"Retry-After", ends.RetryAfter}} {
		if h.end == 0 {
			continue
		}
		r.header[n].Key, r.header[n].Value = h.key, values[start:h.end]
		r.headerList[n] = &r.header[n]
		start = h.end
		n++
	}
	r.resp.ResponseHeadersToAdd = r.headerList[:n]
}
