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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Decider answers decisions; *limiter.Limiter is one.
type Decider interface {
	Decide(ctx context.Context, op limiter.Op, reqs []limiter.Request, dst []limiter.Decision) (limiter.Result, error)
	Snapshot() *limiter.Snapshot
}

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
	entries []limiter.DescriptorEntry
	reqs    []limiter.Request
	// slot[i] is the index in reqs of descriptor i, -1 when it matched no
	// rule.
	slot []int
	// rules[j] is the rule of reqs[j], for naming the entries of a bad
	// bucket id.
	rules     []limiter.Rule
	decisions []limiter.Decision
	// replaced names the limits that the matched rules replace.
	replaced []string
	// moved maps the index of a request before dropReplaced to the one
	// after, -1 for a request dropped.
	moved []int
	// quotaOver[j] is true when reqs[j] is of a quota-mode rule and over
	// its limit in a request that the other quotas let through; first
	// holds the decisions that found it, and retry the batch spent
	// instead.
	quotaOver []bool
	first     []limiter.Decision
	retry     []limiter.Request
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
	if unmatched := len(descriptors) - countMatched(b.slot); unmatched > 0 {
		s.obs.ObserveUnmatched(unmatched)
	}
	b.dropReplaced()
	if len(b.reqs) == 0 {
		return &r.resp, nil
	}
	res, err := s.lim.Decide(ctx, limiter.Spend, b.reqs, b.decisions)
	if err != nil {
		return nil, b.decideError(ctx, err)
	}
	b.decisions = res.Decisions
	spent := b.reqs
	if !res.Allowed && !res.Degraded && b.overQuotaOnly(res.Decisions) {
		if res, err = b.spendWithinQuota(ctx, s.lim); err != nil {
			return nil, b.decideError(ctx, err)
		}
		spent = b.retry
	}
	s.obs.ObserveDecisions(limiter.Spend, res)
	s.obs.ObserveUnits(limiter.Spend, spent, res)
	if !res.Allowed {
		r.resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i, j := range b.slot {
		if j < 0 || res.Degraded {
			continue
		}
		r.status(i, &res.Decisions[j])
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

// dropReplaced takes out of the batch the buckets of the limits that a
// matched rule replaces, as envoyproxy/ratelimit's replaces does: their
// descriptors are answered OK without a limit, and spend nothing.
func (b *batch) dropReplaced() {
	if len(b.replaced) == 0 {
		return
	}
	b.moved = b.moved[:0]
	kept := 0
	for j := range b.reqs {
		if slices.Contains(b.replaced, b.reqs[j].Limit) {
			b.moved = append(b.moved, -1)
			continue
		}
		b.moved = append(b.moved, kept)
		b.reqs[kept], b.rules[kept] = b.reqs[j], b.rules[j]
		kept++
	}
	b.reqs, b.rules = b.reqs[:kept], b.rules[:kept]
	for i, j := range b.slot {
		if j >= 0 {
			b.slot[i] = b.moved[j]
		}
	}
}

// overQuotaOnly reports whether a denied batch would pass under
// envoyproxy/ratelimit's quota_mode: every bucket over its limit (and not
// a shadow) is of a quota-mode rule, and some descriptor of a quota-mode
// rule is within its limit. It marks those buckets in quotaOver.
func (b *batch) overQuotaOnly(ds []limiter.Decision) bool {
	b.quotaOver = slices.Grow(b.quotaOver[:0], len(ds))[:len(ds)]
	for j := range ds {
		over := !ds[j].Allowed && !ds[j].Shadow
		if over && !b.rules[j].QuotaMode {
			return false
		}
		b.quotaOver[j] = over
	}
	for _, j := range b.slot {
		if j >= 0 && b.rules[j].QuotaMode && !b.quotaOver[j] {
			return true
		}
	}
	return false
}

// spendWithinQuota spends the batch again with nothing taken from the
// buckets in quotaOver, whose decisions stay those of the first spend, so
// that their statuses say OVER_LIMIT while the request passes. If the
// second spend is denied (another request emptied a bucket in between),
// so is the request, and nothing is spent: never OK without a spend.
func (b *batch) spendWithinQuota(ctx context.Context, lim Decider) (limiter.Result, error) {
	b.first = append(b.first[:0], b.decisions...)
	b.retry = append(b.retry[:0], b.reqs...)
	for j, over := range b.quotaOver {
		if over {
			b.retry[j].Cost = 0
		}
	}
	res, err := lim.Decide(ctx, limiter.Spend, b.retry, b.decisions)
	if err != nil {
		return res, err
	}
	b.decisions = res.Decisions
	for j, over := range b.quotaOver {
		if over {
			res.Decisions[j] = b.first[j]
		}
	}
	return res, nil
}

func countMatched(slot []int) int {
	n := 0
	for _, j := range slot {
		if j >= 0 {
			n++
		}
	}
	return n
}

// Bounds of a request's hits: a cost must fit the limiter's int64.
const maxHits = math.MaxInt64

// translate turns a request into the batch of the limiter: each descriptor
// that matches a rule becomes a bucket, and descriptors that map to the
// same bucket, after canonicalisation, share it, their hits added. Every
// bad field is an INVALID_ARGUMENT naming the descriptor and entry; the
// first one found is reported, as a gRPC status carries one message.
func (b *batch) translate(snap *limiter.Snapshot, req *rlsv3.RateLimitRequest) error {
	b.reqs, b.slot, b.rules, b.replaced = b.reqs[:0], b.slot[:0], b.rules[:0], b.replaced[:0]
	domain := req.GetDomain()
	if msg := rules.DescriptorTextProblem(domain); msg != "" {
		return invalid("domain: " + msg)
	}
	descriptors := req.GetDescriptors()
	if len(descriptors) == 0 || len(descriptors) > limiter.MaxBatch {
		return invalid("descriptors: must hold 1 to " + strconv.Itoa(limiter.MaxBatch) + " descriptors")
	}
	for i, d := range descriptors {
		field := "descriptors[" + strconv.Itoa(i) + "]"
		entries := d.GetEntries()
		if msg := rules.DescriptorSizeProblem(len(entries)); msg != "" {
			return invalid(field + ".entries: " + msg)
		}
		b.entries = b.entries[:0]
		for k, e := range entries {
			if msg := rules.DescriptorTextProblem(e.GetKey()); msg != "" {
				return invalid(field + ".entries[" + strconv.Itoa(k) + "].key: " + msg)
			}
			// A value may be empty, as a header can be; only a rule
			// without a value for the entry can match it.
			if v := e.GetValue(); v != "" {
				if msg := rules.DescriptorTextProblem(v); msg != "" {
					return invalid(field + ".entries[" + strconv.Itoa(k) + "].value: " + msg)
				}
			}
			b.entries = append(b.entries, limiter.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if d.GetIsNegativeHits() {
			return invalid(field + ".is_negative_hits: not supported; ratelimitd refunds over REST")
		}
		cost := uint64(1)
		switch {
		case d.GetHitsAddend() != nil:
			cost = d.GetHitsAddend().GetValue()
		case req.GetHitsAddend() > 0:
			cost = uint64(req.GetHitsAddend())
		}
		if cost > maxHits {
			return invalid(field + ".hits_addend: must be at most " + strconv.FormatUint(maxHits, 10))
		}
		r, ok := snap.Match(domain, b.entries)
		if !ok {
			b.slot = append(b.slot, -1)
			continue
		}
		b.replaced = append(b.replaced, r.Replaces...)
		bucket := canonical(snap, r, rules.BucketID(r, b.entries))
		j := b.find(r.Limit, bucket)
		if j < 0 {
			b.slot = append(b.slot, len(b.reqs))
			b.reqs = append(b.reqs, limiter.Request{Limit: r.Limit, BucketID: bucket, Cost: int64(cost)})
			b.rules = append(b.rules, r)
			continue
		}
		// The same bucket twice: one spend of both costs.
		if int64(cost) > maxHits-b.reqs[j].Cost {
			return invalid(field + ".hits_addend: the hits of one bucket add up to more than " + strconv.FormatUint(maxHits, 10))
		}
		b.reqs[j].Cost += int64(cost)
		b.slot = append(b.slot, j)
	}
	return nil
}

// canonical returns the canonical form of a bucket id under its rule's
// limit, so that two notations of one bucket (10.0.0.1 and
// ::ffff:10.0.0.1) are found to be one and spent once. An id the format
// refuses, or a limit the snapshot lacks, is returned as it is: the
// limiter reports it, and describe names the descriptor.
func canonical(snap *limiter.Snapshot, r limiter.Rule, id string) string {
	l, ok := snap.Limit(r.Limit)
	if !ok {
		return id
	}
	if c, err := bucketid.Canonical(l.IDFormat, id); err == nil {
		return c
	}
	return id
}

// find returns the index of the request of a bucket, -1 when there is
// none. Batches are small (MaxBatch), so a scan beats a map.
func (b *batch) find(limit, bucket string) int {
	for j := range b.reqs {
		if b.reqs[j].Limit == limit && b.reqs[j].BucketID == bucket {
			return j
		}
	}
	return -1
}

// decideError maps an error of the limiter to a status. Field errors name
// the buckets of the batch; they are renamed after the first descriptor of
// each and the entries whose values formed its bucket id.
func (b *batch) decideError(ctx context.Context, err error) error {
	var ve *limiter.ValidationError
	switch {
	case errors.As(err, &ve) && len(ve.Fields) > 0:
		return invalid(b.describe(ve.Fields[0]))
	case errors.Is(err, limiter.ErrUnavailable):
		return status.Error(codes.Unavailable, "the bucket store is unavailable; retry later")
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Internal, "internal error")
}

// describe names a field error of bucket j ("buckets[j].bucket_id") by the
// descriptor and entries it came from.
func (b *batch) describe(fe limiter.FieldError) string {
	j, rest, ok := bucketField(fe.Field)
	if !ok || j >= len(b.reqs) {
		return fe.Field + ": " + fe.Message
	}
	i := 0
	for i < len(b.slot) && b.slot[i] != j {
		i++
	}
	field := "descriptors[" + strconv.Itoa(i) + "]"
	r := b.rules[j]
	switch rest {
	case ".bucket_id":
		free := []string{}
		for k, e := range r.Descriptor {
			if !rules.Fixed(e) {
				free = append(free, "entries["+strconv.Itoa(k)+"].value")
			}
		}
		what := field + ".entries"
		if len(free) == 1 {
			what = field + "." + free[0]
		}
		return what + ": not a bucket id of limit " + strconv.Quote(r.Limit) + " (rule " + r.ID + "): " + fe.Message
	case "":
		return field + ": " + fe.Message
	}
	return field + ": limit " + strconv.Quote(r.Limit) + " (rule " + r.ID + "): " + fe.Message
}

// bucketField splits "buckets[3].bucket_id" into 3 and ".bucket_id".
func bucketField(field string) (int, string, bool) {
	rest, ok := strings.CutPrefix(field, "buckets[")
	if !ok {
		return 0, "", false
	}
	num, rest, ok := strings.Cut(rest, "]")
	j, err := strconv.Atoi(num)
	return j, rest, ok && err == nil && j >= 0
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
// the REST answer (draft-ietf-httpapi-ratelimit-headers), for Envoy to add
// to its response. Their values are written into one string, which they
// share.
func (r *reply) headers(res limiter.Result) {
	var text [256]byte
	buf := text[:0]
	var ends [3]int
	n := 0
	if i := res.MostRestrictive(limiter.Spend); i >= 0 {
		d := &res.Decisions[i]
		// In whole seconds, rounded up; the draft wants a positive window.
		window := max(1, seconds(d.PolicyWindow()))
		buf = strconv.AppendQuote(buf, d.Limit)
		buf = append(buf, ";q="...)
		buf = strconv.AppendInt(buf, d.Params.Burst, 10)
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, window, 10)
		ends[0] = len(buf)
		buf = strconv.AppendQuote(buf, d.Limit)
		buf = append(buf, ";r="...)
		buf = strconv.AppendInt(buf, d.Remaining, 10)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, seconds(d.UntilReset(limiter.Spend)), 10)
		ends[1] = len(buf)
		r.header[0].Key, r.header[1].Key = "RateLimit-Policy", "RateLimit"
		n = 2
	}
	if !res.Allowed && res.RetryAfter > 0 {
		buf = strconv.AppendInt(buf, seconds(res.RetryAfter), 10)
		ends[n] = len(buf)
		r.header[n].Key = "Retry-After"
		n++
	}
	if n == 0 {
		return
	}
	values := string(buf)
	start := 0
	for k := range n {
		r.header[k].Value = values[start:ends[k]]
		start = ends[k]
		r.headerList[k] = &r.header[k]
	}
	r.resp.ResponseHeadersToAdd = r.headerList[:n]
}

// seconds converts a duration into whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
