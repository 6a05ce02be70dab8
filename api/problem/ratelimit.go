package problem

import (
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// The headers AppendRateLimit words, in the order it writes their values,
// by their canonical names.
const (
	HeaderPolicy     = "Ratelimit-Policy"
	HeaderRateLimit  = "Ratelimit"
	HeaderRetryAfter = "Retry-After"
)

// RateLimitEnds marks where each header's value ends in what
// AppendRateLimit wrote: Policy, RateLimit and RetryAfter in that order,
// each starting where the one before it ended (the first where the text
// began); 0 for a header left out.
type RateLimitEnds struct {
	Policy, RateLimit, RetryAfter int
}

// AppendRateLimit appends the values of the RateLimit-Policy and RateLimit
// headers (draft-ietf-httpapi-ratelimit-headers-11) of the most restrictive
// bucket of res, and Retry-After when res is a denial that a retry can
// overcome, so that every front (the REST answer, Envoy's
// response_headers_to_add, forward auth's answer) words them alike; an
// acquire's are a spend's. The values share b, so that a front sets them
// with one allocation.
func AppendRateLimit(b []byte, op limiter.Op, res limiter.Result) ([]byte, RateLimitEnds) {
	var ends RateLimitEnds
	if i := res.MostRestrictive(op); i >= 0 {
		d := &res.Decisions[i]
		// In whole seconds, rounded up; the draft wants a positive window.
		window := max(1, seconds(d.PolicyWindow()))
		b = append(b, '"')
		b = append(b, d.Limit...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, d.Params.Burst, 10)
		if qu := quotaUnit(d); qu != "" {
			b = append(b, `;qu="`...)
			b = append(b, qu...)
			b = append(b, '"')
		}
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, window, 10)
		ends.Policy = len(b)
		b = append(b, '"')
		b = append(b, d.Limit...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, d.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, seconds(d.UntilReset(op)), 10)
		ends.RateLimit = len(b)
	}
	if op != limiter.Refund && !res.Allowed && res.RetryAfter > 0 {
		b = strconv.AppendInt(b, seconds(res.RetryAfter), 10)
		ends.RetryAfter = len(b)
	}
	return b, ends
}

// seconds converts a duration into whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// quotaUnit maps a decision's unit to the RateLimit-Policy header's qu,
// "" when the header is to have none. The draft defines requests (its
// default, so never sent), content-bytes and concurrent-requests: a
// limit in bytes counts content bytes, and a concurrency limit that counts
// requests counts concurrent ones. Any other unit, tokens for one, has
// no name there: the header then leaves it out rather than send a value
// clients cannot know, and the answer's unit says what the quota counts.
func quotaUnit(d *limiter.Decision) string {
	switch {
	case d.Kind == limiter.KindConcurrency && d.Unit == limiter.DefaultUnit:
		return "concurrent-requests"
	case d.Kind != limiter.KindConcurrency && (d.Unit == "bytes" || d.Unit == "content-bytes"):
		return "content-bytes"
	}
	return ""
}
