package decide

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// decodeFast reads the common form of a body, appending its requests to
// dst:
//
//	{"buckets": [{"limit": "L", "bucket_id": "B", "cost": 1}, ...]}
//	{"buckets": [{"limit": "L", "bucket_id": "B", "reserved": 1, "actual": 2}, ...]}
//
// with 1 to limiter.MaxBatch buckets, each holding limit and bucket_id at
// most once, the amounts its form allows, each at most once and a
// non-negative integer (a settle's at most limiter.MaxCost), and strings of valid UTF-8 without escapes. It reports false
// for anything else, valid or not; decodeStrict then reads the body, which
// accepts the rest of JSON and words every error. So the two agree by
// construction on every body this one refuses, and the fuzz test checks
// that they agree on every body it takes.
//
// It exists because decodeStrict costs a token, and an allocation or more,
// per JSON value; this one costs a pass over the bytes and the strings.
func decodeFast(body []byte, dst []limiter.Request, f form, sc *scratch) ([]limiter.Request, bool) {
	p := jsonScanner{b: body}
	if !p.next('{') || !p.key("buckets") {
		return dst, false
	}
	dst, any, all, ok := p.buckets(dst, sc)
	return dst, ok && f.fits(any, all) && p.end()
}

// end consumes the body's closing brace, which nothing but white space
// may follow.
func (p *jsonScanner) end() bool {
	if !p.next('}') {
		return false
	}
	p.space()
	return p.i == len(p.b)
}

// jsonScanner reads the few JSON forms decodeFast takes.
type jsonScanner struct {
	b []byte
	i int
}

func (p *jsonScanner) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// next consumes c, after white space, if it comes next.
func (p *jsonScanner) next(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key consumes `"name":`.
func (p *jsonScanner) key(name string) bool {
	s, ok := p.str()
	return ok && string(s) == name && p.next(':')
}

// str consumes a string without escapes and returns its bytes, which are
// valid UTF-8.
func (p *jsonScanner) str() ([]byte, bool) {
	if !p.next('"') {
		return nil, false
	}
	start, ascii := p.i, true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			// Invalid UTF-8 is a 400, which decodeStrict words.
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		p.i++
	}
	return nil, false
}

// cost consumes a non-negative JSON integer that fits in an int64.
func (p *jsonScanner) cost() (int64, bool) {
	p.space()
	start := p.i
	var n int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := int64(p.b[p.i] - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
		p.i++
	}
	digits := p.i - start
	switch {
	case digits == 0, digits > 1 && p.b[start] == '0':
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

// The members of a bucket beside limit and bucket_id, as bits.
const (
	keyCost uint8 = 1 << iota
	keyActual
	keyReserved
)

// fits reports whether buckets that hold the members any, together, and
// all, each, are of form f: a settle's each hold actual and none a cost.
func (f form) fits(any, all uint8) bool {
	switch f {
	case bare:
		return any == 0
	case costed:
		return any&^keyCost == 0
	}
	return all&keyActual != 0 && any&keyCost == 0
}

// buckets consumes a list of 1 to limiter.MaxBatch buckets, appending
// them to dst, and returns the members they hold beside limit and
// bucket_id, together and each (fits).
func (p *jsonScanner) buckets(dst []limiter.Request, sc *scratch) (out []limiter.Request, any, all uint8, ok bool) {
	if !p.next('[') {
		return dst, 0, 0, false
	}
	all = keyCost | keyActual | keyReserved
	for n := 0; ; n++ {
		if n == limiter.MaxBatch {
			return dst, 0, 0, false
		}
		req, keys, ok := p.bucket(sc)
		if !ok {
			return dst, 0, 0, false
		}
		dst, any, all = append(dst, req), any|keys, all&keys
		if p.next(',') {
			continue
		}
		return dst, any, all, p.next(']')
	}
}

// bucket consumes one bucket object and returns the members it holds
// beside limit and bucket_id: a cost, or a settle's actual, which takes
// its place, and reserved, each a non-negative integer (a settle's at
// most limiter.MaxCost). A cost left out is 1.
func (p *jsonScanner) bucket(sc *scratch) (limiter.Request, uint8, bool) {
	req := limiter.Request{Cost: 1}
	if !p.next('{') {
		return req, 0, false
	}
	var haveLimit, haveID bool
	var keys uint8
	for {
		k, ok := p.str()
		if !ok || !p.next(':') {
			return req, 0, false
		}
		switch key := string(k); key {
		case "limit":
			v, ok := p.str()
			if !ok || haveLimit {
				return req, 0, false
			}
			req.Limit, haveLimit = sc.intern(v), true
		case "bucket_id":
			v, ok := p.str()
			if !ok || haveID {
				return req, 0, false
			}
			req.BucketID, haveID = string(v), true
		case "cost", "actual", "reserved":
			bit := keyCost
			switch key {
			case "actual":
				bit = keyActual
			case "reserved":
				bit = keyReserved
			}
			v, ok := p.cost()
			// Each at most once, a cost or an actual, not both, and a
			// settle's amounts at most limiter.MaxCost.
			if !ok || keys&bit != 0 || bit != keyReserved && keys&(keyCost|keyActual) != 0 || bit != keyCost && v > limiter.MaxCost {
				return req, 0, false
			}
			keys |= bit
			if bit == keyReserved {
				req.Reserved = v
			} else {
				req.Cost = v
			}
		default:
			return req, 0, false
		}
		if p.next(',') {
			continue
		}
		return req, keys, p.next('}') && haveLimit && haveID
	}
}

// appendJSON appends r as encoding/json's Encoder would write it, without
// HTML escaping and the newline; a test holds the two equal. It exists
// because the answer is written on every decision, and reflection was a
// large part of that.
func (r *result) appendJSON(b []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	if r.Lease != nil {
		b = append(b, `,"lease":`...)
		if *r.Lease == nil {
			b = append(b, "null"...)
		} else {
			b = (*r.Lease).appendJSON(b)
		}
	}
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, r.RetryAfterMS, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, r.ResetAfterMS, 10)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, r.Degraded)
	b = append(b, `,"decisions":`...)
	if r.Decisions == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range r.Decisions {
			if i > 0 {
				b = append(b, ',')
			}
			b = r.Decisions[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func (d *decision) appendJSON(b []byte) []byte {
	b = append(b, `{"limit":`...)
	b = appendJSONString(b, d.Limit)
	b = append(b, `,"bucket_id":`...)
	b = appendJSONString(b, d.BucketID)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"reason":`...)
	if d.Reason == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, string(*d.Reason))
	}
	if d.Held != nil {
		b = append(b, `,"held":`...)
		b = strconv.AppendInt(b, *d.Held, 10)
	}
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"debt":`...)
	b = strconv.AppendInt(b, d.Debt, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, d.RetryAfterMS, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, d.ResetAfterMS, 10)
	b = append(b, `,"burst":`...)
	b = strconv.AppendInt(b, d.Burst, 10)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, d.Count, 10)
	b = append(b, `,"period":`...)
	b = appendJSONString(b, d.Period)
	b = append(b, `,"unit":`...)
	b = appendJSONString(b, d.Unit)
	if d.Capped != nil {
		b = append(b, `,"capped":`...)
		b = strconv.AppendBool(b, *d.Capped)
	}
	b = append(b, `,"source":`...)
	b = appendJSONString(b, string(d.Source))
	b = append(b, `,"shadow":`...)
	b = strconv.AppendBool(b, d.Shadow)
	return append(b, '}')
}

func (l *lease) appendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, l.ID)
	b = append(b, `,"expires_at":"`...)
	b = l.ExpiresAt.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// appendJSONString appends s as a JSON string the way encoding/json does
// without HTML escaping: control characters escaped, invalid UTF-8 as
// U+FFFD, and U+2028 and U+2029 escaped for JavaScript's sake.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
