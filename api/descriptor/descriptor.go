// Package descriptor decides a request given as a domain and descriptors,
// as Envoy's ShouldRateLimit states it, by the rules of the snapshot: each
// descriptor that matches a rule becomes a bucket of one all-or-nothing
// spend. It is the one matcher of the fronts that speak in descriptors,
// Envoy's gRPC (api/rls) and the gateways' forward auth
// (api/forwardauth): precedence, canonical bucket ids, the same bucket
// named twice, replaces and quota_mode live here only, so that the two
// fronts answer alike and each renders the same result in its own
// protocol.
package descriptor

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Decider answers decisions; *limiter.Limiter is one.
type Decider interface {
	Decide(ctx context.Context, op limiter.Op, reqs []limiter.Request, dst []limiter.Decision) (limiter.Result, error)
	Snapshot() *limiter.Snapshot
}

// MaxHits bounds the cost of a descriptor, and of the descriptors of one
// bucket added up: a cost must fit the limiter's int64.
const MaxHits = math.MaxInt64

// Error is a descriptor of the request that cannot be decided, named by
// its place so that each front can name it in its own terms (a gRPC
// field path, a query parameter or header).
type Error struct {
	// Descriptor is the index of the descriptor, -1 for the domain.
	Descriptor int
	// Entry is the index of the entry, -1 when the error is the
	// descriptor's as a whole or of several of its entries.
	Entry int
	// Part is what is wrong: "domain", "entries" (their number), "key",
	// "value", "hits_addend", or "bucket_id" (the values that formed the
	// bucket id are no bucket id of the rule's limit).
	Part string
	// Message says what is wrong with it.
	Message string
}

func (e *Error) Error() string { return e.Field() + ": " + e.Message }

// Field names the place as a gRPC field path of ShouldRateLimit's request:
// "descriptors[1].entries[0].value".
func (e *Error) Field() string {
	if e.Descriptor < 0 {
		return e.Part
	}
	f := "descriptors[" + strconv.Itoa(e.Descriptor) + "]"
	switch {
	case e.Part == "bucket_id" && e.Entry >= 0:
		return f + ".entries[" + strconv.Itoa(e.Entry) + "].value"
	case e.Part == "bucket_id":
		return f + ".entries"
	case e.Entry >= 0:
		return f + ".entries[" + strconv.Itoa(e.Entry) + "]." + e.Part
	case e.Part != "":
		return f + "." + e.Part
	}
	return f
}

// Batch is the working memory of one request: its descriptors, the
// buckets they map to, and their decisions. A front pools it.
type Batch struct {
	domain string
	reqs   []limiter.Request
	// slot[i] is the index in reqs of descriptor i, -1 when it matched no
	// rule or was dropped because another matched rule replaces its limit.
	slot []int
	// rules[j] is the rule of reqs[j]; free[j] the index of its one entry
	// that forms the bucket id, -1 when none or several do.
	rules     []limiter.Rule
	free      []int
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
	// spent is what the decision spent: reqs, or retry after a
	// quota-mode retry.
	spent []limiter.Request
	// unmatched counts the descriptors that matched no rule.
	unmatched int
}

// Reset starts a request of domain, whose text is checked as a rule's.
func (b *Batch) Reset(domain string) error {
	b.domain = domain
	b.reqs, b.slot, b.rules, b.free, b.replaced, b.spent = b.reqs[:0], b.slot[:0], b.rules[:0], b.free[:0], b.replaced[:0], nil
	b.unmatched = 0
	if msg := rules.DescriptorTextProblem(domain); msg != "" {
		return &Error{Descriptor: -1, Entry: -1, Part: "domain", Message: msg}
	}
	return nil
}

// CheckCount says whether n descriptors may be decided at once.
func CheckCount(n int) error {
	if n == 0 || n > limiter.MaxBatch {
		return &Error{Descriptor: -1, Entry: -1, Part: "descriptors", Message: "must hold 1 to " + strconv.Itoa(limiter.MaxBatch) + " descriptors"}
	}
	return nil
}

// Add adds the next descriptor, of cost hits, matched against the rules
// of snap. Descriptors that map to the same bucket, after
// canonicalisation, share it, their hits added. entries is read during the
// call only.
func (b *Batch) Add(snap *limiter.Snapshot, entries []limiter.DescriptorEntry, hits uint64) error {
	i := len(b.slot)
	if msg := rules.DescriptorSizeProblem(len(entries)); msg != "" {
		return &Error{Descriptor: i, Entry: -1, Part: "entries", Message: msg}
	}
	for k, e := range entries {
		if msg := rules.DescriptorTextProblem(e.Key); msg != "" {
			return &Error{Descriptor: i, Entry: k, Part: "key", Message: msg}
		}
		// A value may be empty, as a header can be; only a rule
		// without a value for the entry can match it.
		if e.Value != "" {
			if msg := rules.DescriptorTextProblem(e.Value); msg != "" {
				return &Error{Descriptor: i, Entry: k, Part: "value", Message: msg}
			}
		}
	}
	if hits > MaxHits {
		return &Error{Descriptor: i, Entry: -1, Part: "hits_addend", Message: "must be at most " + strconv.FormatUint(MaxHits, 10)}
	}
	r, ok := snap.Match(b.domain, entries)
	if !ok {
		b.slot = append(b.slot, -1)
		b.unmatched++
		return nil
	}
	b.replaced = append(b.replaced, r.Replaces...)
	bucket := canonical(snap, r, rules.BucketID(r, entries))
	j := b.find(r.Limit, bucket)
	if j < 0 {
		b.slot = append(b.slot, len(b.reqs))
		b.reqs = append(b.reqs, limiter.Request{Limit: r.Limit, BucketID: bucket, Cost: int64(hits)})
		b.rules = append(b.rules, r)
		b.free = append(b.free, freeEntry(r))
		return nil
	}
	// The same bucket twice: one spend of both costs.
	if int64(hits) > MaxHits-b.reqs[j].Cost {
		return &Error{Descriptor: i, Entry: -1, Part: "hits_addend", Message: "the hits of one bucket add up to more than " + strconv.FormatUint(MaxHits, 10)}
	}
	b.reqs[j].Cost += int64(hits)
	b.slot = append(b.slot, j)
	return nil
}

// freeEntry is the index of the one entry of r whose value is the bucket
// id, -1 when none or several are.
func freeEntry(r limiter.Rule) int {
	free := -1
	for k, e := range r.Descriptor {
		if !rules.Fixed(e) {
			if free >= 0 {
				return -1
			}
			free = k
		}
	}
	return free
}

// canonical returns the canonical form of a bucket id under its rule's
// limit, so that two notations of one bucket (10.0.0.1 and
// ::ffff:10.0.0.1) are found to be one and spent once. An id the format
// refuses, or a limit the snapshot lacks, is returned as it is: the
// limiter reports it, and the error names the descriptor.
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
func (b *Batch) find(limit, bucket string) int {
	for j := range b.reqs {
		if b.reqs[j].Limit == limit && b.reqs[j].BucketID == bucket {
			return j
		}
	}
	return -1
}

// Len is the number of descriptors added.
func (b *Batch) Len() int { return len(b.slot) }

// Unmatched counts the descriptors that matched no rule.
func (b *Batch) Unmatched() int { return b.unmatched }

// Match is what the rules make of one descriptor, nothing spent.
type Match struct {
	Rule limiter.Rule
	// BucketID is canonical when the limit's format accepts it.
	BucketID string
	// Replaced is true when another matched rule of the request replaces
	// the limit: the descriptor is answered without a limit and spends
	// nothing.
	Replaced bool
}

// Matched returns what descriptor i matched, false when it matched no
// rule. It may be called before Decide, as a dry run.
func (b *Batch) Matched(i int) (Match, bool) {
	j := b.slot[i]
	if j < 0 {
		return Match{}, false
	}
	r := b.rules[j]
	return Match{Rule: r, BucketID: b.reqs[j].BucketID, Replaced: slices.Contains(b.replaced, r.Limit)}, true
}

// Decide spends the batch, all or nothing, as envoyproxy/ratelimit
// decides a request: the buckets of replaced limits dropped, and under
// quota_mode a request that only quota-mode rules deny let through. A
// limiter's field error is returned as an *Error naming the descriptor;
// others (limiter.ErrUnavailable, a context's) as they are. With nothing
// to spend, it returns an allowed result without a decision.
func (b *Batch) Decide(ctx context.Context, lim Decider) (limiter.Result, error) {
	b.dropReplaced()
	if len(b.reqs) == 0 {
		return limiter.Result{Allowed: true}, nil
	}
	res, err := lim.Decide(ctx, limiter.Spend, b.reqs, b.decisions)
	if err != nil {
		return res, b.decideError(err)
	}
	b.decisions = res.Decisions
	b.spent = b.reqs
	if !res.Allowed && !res.Degraded && b.overQuotaOnly(res.Decisions) {
		if res, err = b.spendWithinQuota(ctx, lim); err != nil {
			return res, b.decideError(err)
		}
		b.spent = b.retry
	}
	return res, nil
}

// Decision returns the index in res.Decisions of descriptor i's bucket,
// -1 when it has none (it matched no rule, or its limit was replaced).
func (b *Batch) Decision(i int) int { return b.slot[i] }

// Spent is the batch the last Decide spent, for the metrics of quota
// units.
func (b *Batch) Spent() []limiter.Request { return b.spent }

// dropReplaced takes out of the batch the buckets of the limits that a
// matched rule replaces, as envoyproxy/ratelimit's replaces does: their
// descriptors are answered OK without a limit, and spend nothing.
func (b *Batch) dropReplaced() {
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
		b.reqs[kept], b.rules[kept], b.free[kept] = b.reqs[j], b.rules[j], b.free[j]
		kept++
	}
	b.reqs, b.rules, b.free = b.reqs[:kept], b.rules[:kept], b.free[:kept]
	for i, j := range b.slot {
		if j >= 0 {
			b.slot[i] = b.moved[j]
		}
	}
	b.replaced = b.replaced[:0]
}

// overQuotaOnly reports whether a denied batch would pass under
// envoyproxy/ratelimit's quota_mode: every bucket over its limit (and not
// a shadow) is of a quota-mode rule, and some descriptor of a quota-mode
// rule is within its limit. It marks those buckets in quotaOver.
func (b *Batch) overQuotaOnly(ds []limiter.Decision) bool {
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
func (b *Batch) spendWithinQuota(ctx context.Context, lim Decider) (limiter.Result, error) {
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

// decideError names the descriptor of a limiter's field error, which
// names a bucket of the batch: the first descriptor of the bucket and, for
// a bad bucket id, the entry whose value formed it.
func (b *Batch) decideError(err error) error {
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) == 0 {
		return err
	}
	fe := ve.Fields[0]
	j, rest, ok := bucketField(fe.Field)
	if !ok || j >= len(b.reqs) {
		return &Error{Descriptor: -1, Entry: -1, Part: fe.Field, Message: fe.Message}
	}
	i := slices.Index(b.slot, j)
	r := b.rules[j]
	switch rest {
	case ".bucket_id":
		return &Error{Descriptor: i, Entry: b.free[j], Part: "bucket_id",
			Message: "not a bucket id of limit " + strconv.Quote(r.Limit) + " (rule " + r.ID + "): " + fe.Message}
	case "":
		return &Error{Descriptor: i, Entry: -1, Message: fe.Message}
	}
	return &Error{Descriptor: i, Entry: -1, Message: "limit " + strconv.Quote(r.Limit) + " (rule " + r.ID + "): " + fe.Message}
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
