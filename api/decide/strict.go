package decide

import (
	"errors"
	"strconv"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// decodeStrict reads any body, as the admin API reads its bodies, and
// appends its requests to dst; more, when set, reads the members of the
// top level beside buckets (nil: there are none). A body that is not
// JSON, not UTF-8, or of the wrong shape (an unknown or repeated key, a
// value of the wrong type, a fraction) is an *input.Error, a 400 naming
// every bad field. Values that parse but are out of range are returned in
// errs, in body order, for the caller's 422; their requests hold zero
// values in their place.
func decodeStrict(body []byte, dst []limiter.Request, f form, more func(input.Object, *input.Errors)) ([]limiter.Request, *input.Errors, error) {
	b, err := input.Parse(body)
	if err != nil {
		return dst, nil, err
	}
	return readBuckets(b, dst, f, more)
}

// readBuckets reads the buckets of a parsed body, as decodeStrict says.
func readBuckets(b *input.Body, dst []limiter.Request, f form, more func(input.Object, *input.Errors)) ([]limiter.Request, *input.Errors, error) {
	o := b.Root()
	if more != nil {
		more(o, &b.Errs)
	}
	o.Require("buckets")
	n, ok := o.Objects("buckets", limiter.MaxBatch, func(_ int, bucket input.Object) {
		dst = append(dst, readBucket(bucket, f, &b.Errs))
	})
	switch {
	case !ok:
	case n == 0:
		b.Errs.Add("buckets", "must hold at least 1 items")
	case n > limiter.MaxBatch:
		b.Errs.Add("buckets", "must hold at most "+strconv.Itoa(limiter.MaxBatch)+" items")
	}
	if err := b.Shape(); err != nil {
		return dst, nil, err
	}
	return dst, &b.Errs, nil
}

// readBucket reads one bucket of a body of form f.
func readBucket(o input.Object, f form, errs *input.Errors) limiter.Request {
	req := limiter.Request{Cost: 1}
	o.Require("limit", "bucket_id")
	req.Limit, _ = o.String("limit")
	req.BucketID, _ = o.String("bucket_id")
	switch f {
	case costed:
		if o.Has("cost") {
			req.Cost = amount(o, "cost", 1<<63-1, errs)
		}
	case settled:
		o.Require("actual")
		req.Cost = amount(o, "actual", limiter.MaxCost, errs)
		req.Reserved = amount(o, "reserved", limiter.MaxCost, errs)
	}
	return req
}

// amount reads an integer from 0 to most, 0 when it is absent. One outside
// that range, whatever its size, is a value, not a shape: a 422, not a
// 400.
func amount(o input.Object, name string, most int64, errs *input.Errors) int64 {
	digits, ok := o.Integer(name)
	if !ok {
		return 0
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if errors.Is(err, strconv.ErrRange) || v < 0 || v > most {
		errs.Add(input.Join(o.Path(), name), "must be an integer from 0 to "+strconv.FormatInt(most, 10))
		return 0
	}
	return v
}
