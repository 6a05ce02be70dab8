package ratelimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// The body of POST /v1/decisions, written and read by hand: this is the
// hot path of every call, and encoding/json would cost it several times
// what the rest of the client does (BenchmarkDecode says how much). The
// shapes are openapi.yaml's DecisionsRequest and DecisionsResult; e2e's
// TestClientPackage checks both against it on a real service.

// appendCall appends cl as one request of the body:
//
//	{"op":"spend","buckets":[{"limit":"L","bucket_id":"B","cost":2}]}
//
// A cost of 1, ratelimitd's default, is left out.
func appendCall(b []byte, cl *call) []byte {
	b = append(b, `{"op":"`...)
	b = append(b, opNames[cl.op]...)
	b = append(b, '"')
	switch cl.op {
	case opSettle:
		b = append(b, `,"buckets":[`...)
		for i, s := range cl.settlements {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendBucketName(b, s.Limit, s.ID)
			b = append(b, `,"reserved":`...)
			b = strconv.AppendInt(b, s.Reserved, 10)
			b = append(b, `,"actual":`...)
			b = strconv.AppendInt(b, s.Actual, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	case opRelease, opRenew:
		b = append(b, `,"lease_id":`...)
		b = appendString(b, cl.leaseID)
	default:
		b = append(b, `,"buckets":[`...)
		for i, bk := range cl.buckets {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendBucketName(b, bk.Limit, bk.ID)
			if bk.Cost != 1 {
				b = append(b, `,"cost":`...)
				b = strconv.AppendInt(b, bk.Cost, 10)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if (cl.op == opAcquire || cl.op == opRenew) && cl.ttl > 0 {
		b = append(b, `,"ttl_ms":`...)
		b = strconv.AppendInt(b, int64((cl.ttl+time.Millisecond-1)/time.Millisecond), 10)
	}
	return append(b, '}')
}

// appendBucketName appends `{"limit":L,"bucket_id":B`, the object left
// open.
func appendBucketName(b []byte, limit, id string) []byte {
	b = append(b, `{"limit":`...)
	b = appendString(b, limit)
	b = append(b, `,"bucket_id":`...)
	return appendString(b, id)
}

// appendString appends s, valid UTF-8, as a JSON string: quotes,
// backslashes and control characters escaped, nothing else, so that
// ratelimitd reads most strings without unescaping them.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// wireLease is a lease as an answer gives it.
type wireLease struct {
	ID        string
	ExpiresAt time.Time
}

// errGarbage is an answer that is not the one POST /v1/decisions gives.
var errGarbage = errors.New("the answer is not a valid answer of POST /v1/decisions")

// decodeAnswer reads the answer to a request that carried batch, in order,
// into each call's res (and lease, released or err, the call's own
// problem). An error means the answer as a whole is not one: each call
// then gets the fail mode.
func decodeAnswer(body []byte, batch []*call, sc *scratch) error {
	r := reader{b: body, sc: sc}
	if !r.open('{') {
		return errGarbage
	}
	n := 0
	for first := true; r.more('}', &first); {
		if string(r.key()) != "results" {
			r.skip()
			continue
		}
		if !r.open('[') {
			return errGarbage
		}
		for first := true; r.more(']', &first); n++ {
			if n >= len(batch) {
				return errGarbage
			}
			r.result(batch[n])
		}
	}
	r.space()
	if r.err != nil || r.i != len(r.b) || n != len(batch) {
		return errGarbage
	}
	return nil
}

// reader reads JSON of the shapes decodeAnswer expects. It records the
// first error in err and from then on reads nothing.
type reader struct {
	b   []byte
	i   int
	err error
	sc  *scratch
}

func (r *reader) fail() { r.err, r.i = errGarbage, len(r.b) }

func (r *reader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// open consumes c, '{' or '[', and reports whether it was there.
func (r *reader) open(c byte) bool {
	r.space()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	r.fail()
	return false
}

// more reports whether another member or element follows, consuming the
// comma before it, or else the closing end.
func (r *reader) more(end byte, first *bool) bool {
	r.space()
	if r.i >= len(r.b) {
		r.fail()
		return false
	}
	if r.b[r.i] == end {
		r.i++
		return false
	}
	if !*first {
		if r.b[r.i] != ',' {
			r.fail()
			return false
		}
		r.i++
	}
	*first = false
	return true
}

// key reads a member's name and the colon after it.
func (r *reader) key() []byte {
	k := r.raw()
	r.space()
	if r.i >= len(r.b) || r.b[r.i] != ':' {
		r.fail()
		return nil
	}
	r.i++
	return k
}

// raw reads a string and returns its bytes, unescaped; they are the
// body's own when there was nothing to unescape.
func (r *reader) raw() []byte {
	r.space()
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		r.fail()
		return nil
	}
	start := r.i + 1
	escaped, ascii := false, true
	for i := start; i < len(r.b); i++ {
		c := r.b[i]
		if c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' {
			continue
		}
		switch {
		case c >= utf8.RuneSelf:
			ascii = false
		case c == '"':
			r.i = i + 1
			if !escaped {
				if !ascii && !utf8.Valid(r.b[start:i]) {
					r.fail()
					return nil
				}
				return r.b[start:i]
			}
			var s string
			if json.Unmarshal(r.b[start-1:i+1], &s) != nil {
				r.fail()
				return nil
			}
			return []byte(s)
		case c == '\\':
			escaped = true
			i++
		case c < 0x20:
			r.fail()
			return nil
		}
	}
	r.fail()
	return nil
}

// str reads a string.
func (r *reader) str() string { return string(r.raw()) }

// null consumes null if it comes next.
func (r *reader) null() bool {
	r.space()
	if len(r.b)-r.i >= 4 && string(r.b[r.i:r.i+4]) == "null" {
		r.i += 4
		return true
	}
	return false
}

func (r *reader) bool() bool {
	r.space()
	switch {
	case len(r.b)-r.i >= 4 && string(r.b[r.i:r.i+4]) == "true":
		r.i += 4
		return true
	case len(r.b)-r.i >= 5 && string(r.b[r.i:r.i+5]) == "false":
		r.i += 5
		return false
	}
	r.fail()
	return false
}

// int reads an integer that fits in an int64; a fraction or an exponent
// is an error.
func (r *reader) int() int64 {
	r.space()
	neg := r.i < len(r.b) && r.b[r.i] == '-'
	if neg {
		r.i++
	}
	start := r.i
	var n uint64
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		if n > (1<<63)/10 {
			r.fail()
			return 0
		}
		n = n*10 + uint64(r.b[r.i]-'0')
		r.i++
	}
	switch {
	case r.i == start, r.i-start > 1 && r.b[start] == '0', n > 1<<63, n == 1<<63 && !neg,
		r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E'):
		r.fail()
		return 0
	}
	if neg {
		return -int64(n)
	}
	return int64(n)
}

// millis reads a duration in milliseconds; -1 is Never.
func (r *reader) millis() time.Duration {
	ms := r.int()
	if ms == -1 {
		return Never
	}
	if ms < 0 || ms > int64(1<<63-1)/int64(time.Millisecond) {
		r.fail()
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// skip reads any value.
func (r *reader) skip() {
	r.space()
	if r.i >= len(r.b) {
		r.fail()
		return
	}
	switch c := r.b[r.i]; {
	case c == '{':
		r.i++
		for first := true; r.more('}', &first); {
			r.key()
			r.skip()
		}
	case c == '[':
		r.i++
		for first := true; r.more(']', &first); {
			r.skip()
		}
	case c == '"':
		r.raw()
	case c == 't' || c == 'f':
		r.bool()
	case c == 'n':
		if !r.null() {
			r.fail()
		}
	default:
		r.number()
	}
}

// number reads any JSON number, which skip ignores.
func (r *reader) number() {
	start := r.i
	for r.i < len(r.b) && (r.b[r.i] >= '0' && r.b[r.i] <= '9' || r.b[r.i] == '-' || r.b[r.i] == '+' ||
		r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E') {
		r.i++
	}
	if r.i == start || !json.Valid(r.b[start:r.i]) {
		r.fail()
	}
}

// result reads one result into cl: a decision, an acquire's (a decision
// with its lease), a release's, a renew's, or a problem.
func (r *reader) result(cl *call) {
	if !r.open('{') {
		return
	}
	res := &cl.res
	for first := true; r.more('}', &first); {
		switch string(r.key()) {
		case "allowed":
			res.Allowed = r.bool()
		case "retry_after_ms":
			res.RetryAfter = r.millis()
		case "reset_after_ms":
			res.ResetAfter = r.millis()
		case "degraded":
			res.Degraded = r.bool()
		case "decisions":
			r.decisions(cl)
		case "lease":
			if !r.null() {
				r.lease(&cl.lease)
			}
		case "released":
			cl.released = r.bool()
		case "problem":
			p := r.problem()
			if p.Status >= http.StatusInternalServerError {
				// ratelimitd's own fail mode, closed, or a fault of its:
				// the call gets this client's fail mode.
				cl.err = unavailable(p)
			} else {
				cl.err = p
			}
		default:
			r.skip()
		}
	}
	if cl.err != nil || r.err != nil {
		cl.res = Result{}
	}
}

func (r *reader) decisions(cl *call) {
	if !r.open('[') {
		return
	}
	n := len(cl.buckets) + len(cl.settlements)
	ds := make([]Decision, 0, n)
	for first := true; r.more(']', &first); {
		if len(ds) == n {
			r.fail()
			return
		}
		ds = append(ds, Decision{})
		r.decision(&ds[len(ds)-1], cl.requested(len(ds)-1))
	}
	cl.res.Decisions = ds
}

// requested returns the bucket id the call gave its i-th bucket: a
// decision's canonical id is most often that string, which then need not
// be allocated again.
func (cl *call) requested(i int) string {
	switch {
	case i < len(cl.buckets):
		return cl.buckets[i].ID
	case i < len(cl.settlements):
		return cl.settlements[i].ID
	}
	return ""
}

func (r *reader) decision(d *Decision, id string) {
	if !r.open('{') {
		return
	}
	for first := true; r.more('}', &first); {
		switch string(r.key()) {
		case "limit":
			d.Limit = r.sc.intern(r.raw())
		case "bucket_id":
			if b := r.raw(); string(b) == id {
				d.BucketID = id
			} else {
				d.BucketID = string(b)
			}
		case "allowed":
			d.Allowed = r.bool()
		case "reason":
			if !r.null() {
				d.Reason = r.sc.intern(r.raw())
			}
		case "held":
			d.Concurrent, d.Held = true, r.int()
		case "remaining":
			d.Remaining = r.int()
		case "debt":
			d.Debt = r.int()
		case "capped":
			d.Capped = r.bool()
		case "retry_after_ms":
			d.RetryAfter = r.millis()
		case "reset_after_ms":
			d.ResetAfter = r.millis()
		case "burst":
			d.Burst = r.int()
		case "count":
			d.Count = r.int()
		case "period":
			var ok bool
			if d.Period, ok = r.sc.period(r.raw()); !ok {
				r.fail()
			}
		case "unit":
			d.Unit = r.sc.intern(r.raw())
		case "source":
			d.Source = r.sc.intern(r.raw())
		case "shadow":
			d.Shadow = r.bool()
		default:
			r.skip()
		}
	}
}

func (r *reader) lease(l *wireLease) {
	if !r.open('{') {
		return
	}
	for first := true; r.more('}', &first); {
		switch string(r.key()) {
		case "id":
			l.ID = r.str()
		case "expires_at":
			t, err := time.Parse(time.RFC3339Nano, string(r.raw()))
			if err != nil {
				r.fail()
			}
			l.ExpiresAt = t
		default:
			r.skip()
		}
	}
	if l.ID == "" {
		r.fail()
	}
}

func (r *reader) problem() *Problem {
	p := &Problem{}
	if !r.open('{') {
		return p
	}
	for first := true; r.more('}', &first); {
		switch string(r.key()) {
		case "type":
			p.Type = r.str()
		case "title":
			p.Title = r.str()
		case "status":
			p.Status = int(r.int())
		case "detail":
			p.Detail = r.str()
		case "request_id":
			p.RequestID = r.str()
		case "errors":
			if !r.open('[') {
				return p
			}
			for first := true; r.more(']', &first); {
				var f FieldError
				if !r.open('{') {
					return p
				}
				for first := true; r.more('}', &first); {
					switch string(r.key()) {
					case "field":
						f.Field = r.str()
					case "message":
						f.Message = r.str()
					default:
						r.skip()
					}
				}
				p.Errors = append(p.Errors, f)
			}
		default:
			r.skip()
		}
	}
	if p.Status < 400 || p.Status > 599 {
		r.fail()
	}
	return p
}
