package decide

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// decodeStrict reads any body, appending its requests to dst. A body that
// is not JSON, not UTF-8, or of the wrong shape (an unknown or repeated
// key, a value of the wrong type, a fraction) is a 400 naming every bad
// field. Values that parse but are out of range are returned as fields,
// for the caller's 422; their requests hold zero values in their place.
//
// A repeated key is refused rather than read as encoding/json reads it
// (the last one wins): a proxy that reads the first one would act on a
// different request from the one decided here.
func decodeStrict(body []byte, dst []limiter.Request, f form) ([]limiter.Request, []limiter.FieldError, error) {
	switch {
	case len(bytes.TrimSpace(body)) == 0:
		return dst, nil, badRequest("the body is empty; a JSON object is expected", nil)
	case !utf8.Valid(body):
		return dst, nil, badRequest("the body is not valid UTF-8", []limiter.FieldError{{Field: notUTF8(body, f), Message: "is not valid UTF-8"}})
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return dst, nil, badRequest("the body is not valid JSON: "+err.Error(), nil)
	}
	if _, err := dec.Token(); err != io.EOF {
		return dst, nil, badRequest("the body holds more than one JSON value", nil)
	}
	if loneSurrogate(raw) {
		// encoding/json would read it as U+FFFD, so that two different
		// ids would name one bucket.
		return dst, nil, badRequest("the body is not valid UTF-8", []limiter.FieldError{{Field: "body", Message: "holds an unpaired surrogate escape"}})
	}
	w := walker{dec: json.NewDecoder(bytes.NewReader(raw)), form: f, reqs: dst}
	w.dec.UseNumber()
	w.body()
	if len(w.shape) > 0 {
		return dst, nil, badRequest("the body has the wrong shape", w.shape)
	}
	return w.reqs, w.invalid, nil
}

// notUTF8 names the field whose key or string value holds the first byte
// of body that is not UTF-8; "body" when that byte is elsewhere, or the
// body is not JSON. encoding/json reads such bytes as U+FFFD, so the body
// can be walked to find where the byte is.
func notUTF8(body []byte, f form) string {
	if !json.Valid(body) {
		return "body"
	}
	bad := 0
	for bad < len(body) {
		r, size := utf8.DecodeRune(body[bad:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		bad += size
	}
	w := walker{dec: json.NewDecoder(bytes.NewReader(body)), form: f, bad: int64(bad)}
	w.dec.UseNumber()
	w.body()
	if w.badField == "" {
		return "body"
	}
	return w.badField
}

// loneSurrogate reports whether a valid JSON text escapes half of a UTF-16
// surrogate pair without the other half. Outside strings, valid JSON has
// no backslash, so the escapes can be read without tracking strings.
func loneSurrogate(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := escapedRune(b[i:])
		switch {
		case !ok:
			i++ // an escape other than \u: skip the escaped byte
		case utf16.IsSurrogate(r) && r < 0xdc00:
			low, ok := escapedRune(b[i+6:])
			if !ok || low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 11
		case utf16.IsSurrogate(r):
			return true
		default:
			i += 5
		}
	}
	return false
}

// escapedRune reads a \uXXXX escape at the start of b.
func escapedRune(b []byte) (rune, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	return rune(n), err == nil
}

func badRequest(detail string, fields []limiter.FieldError) error {
	return &problem{status: http.StatusBadRequest, detail: detail, fields: fields}
}

// walker reads a body known to be one valid JSON value, token by token.
type walker struct {
	dec  *json.Decoder
	form form
	reqs []limiter.Request
	// shape collects the 400's fields, invalid the 422's.
	shape, invalid []limiter.FieldError
	// bad is the offset of a byte that is not UTF-8, and badField the
	// field whose string holds it, once read.
	bad      int64
	badField string
}

// sawString notes that the string just read belongs to path.
func (w *walker) sawString(path string) {
	if w.badField == "" && w.bad > 0 && w.dec.InputOffset() > w.bad {
		w.badField = path
	}
}

// token returns the next token; the body is valid, so there is one.
func (w *walker) token() json.Token {
	t, _ := w.dec.Token()
	return t
}

// skip consumes the rest of a value whose first token was t.
func (w *walker) skip(t json.Token) {
	if d, ok := t.(json.Delim); !ok || (d != '{' && d != '[') {
		return
	}
	for depth := 1; depth > 0; {
		if d, ok := w.token().(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
}

// wrong records that the value t at path has the wrong type, and skips it.
func (w *walker) wrong(path string, t json.Token, want string) {
	msg := "must be " + want
	if t == nil {
		msg = "must not be null"
	}
	w.shape = append(w.shape, limiter.FieldError{Field: path, Message: msg})
	w.skip(t)
}

// object reads the members of an object whose '{' was read, calling
// member for each key that is new, and refusing repeated keys.
func (w *walker) object(path string, member func(key, path string)) {
	seen := map[string]bool{}
	for w.dec.More() {
		key, _ := w.token().(string)
		kp := key
		if path != "" {
			kp = path + "." + key
		}
		w.sawString(kp)
		if seen[key] {
			w.shape = append(w.shape, limiter.FieldError{Field: kp, Message: "duplicate key"})
			w.skip(w.token())
			continue
		}
		seen[key] = true
		member(key, kp)
	}
	w.token() // '}'
}

func (w *walker) unknown(path string) {
	w.shape = append(w.shape, limiter.FieldError{Field: path, Message: "unknown field"})
	w.skip(w.token())
}

func (w *walker) body() {
	t := w.token()
	if t != json.Delim('{') {
		w.wrong("body", t, "an object")
		return
	}
	found := false
	w.object("", func(key, path string) {
		if key != "buckets" {
			w.unknown(path)
			return
		}
		found = true
		w.buckets()
	})
	if !found {
		w.invalid = append(w.invalid, limiter.FieldError{Field: "buckets", Message: "is required"})
	}
}

func (w *walker) buckets() {
	t := w.token()
	if t != json.Delim('[') {
		w.wrong("buckets", t, "an array")
		return
	}
	n := 0
	for ; w.dec.More(); n++ {
		w.bucket("buckets[" + strconv.Itoa(n) + "]")
	}
	w.token() // ']'
	switch {
	case n == 0:
		w.invalid = append(w.invalid, limiter.FieldError{Field: "buckets", Message: "must hold at least 1 items"})
	case n > limiter.MaxBatch:
		w.invalid = append(w.invalid, limiter.FieldError{Field: "buckets", Message: "must hold at most " + strconv.Itoa(limiter.MaxBatch) + " items"})
	}
}

func (w *walker) bucket(path string) {
	t := w.token()
	if t != json.Delim('{') {
		w.wrong(path, t, "an object")
		return
	}
	req := limiter.Request{Cost: 1}
	var haveLimit, haveID, haveActual bool
	w.object(path, func(key, kp string) {
		switch {
		case key == "limit":
			req.Limit, haveLimit = w.str(kp)
		case key == "bucket_id":
			req.BucketID, haveID = w.str(kp)
		case key == "cost" && w.form == costed:
			req.Cost = w.cost(kp, 1<<63-1)
		case key == "actual" && w.form == settled:
			req.Cost, haveActual = w.cost(kp, limiter.MaxCost), true
		case key == "reserved" && w.form == settled:
			req.Reserved = w.cost(kp, limiter.MaxCost)
		default:
			w.unknown(kp)
		}
	})
	if w.form == settled && !haveActual {
		w.missing(path + ".actual")
	}
	if !haveLimit {
		w.missing(path + ".limit")
	}
	if !haveID {
		w.missing(path + ".bucket_id")
	}
	w.reqs = append(w.reqs, req)
}

// missing records that a required field is absent, unless its key was
// there with a value of the wrong type.
func (w *walker) missing(path string) {
	for _, f := range w.shape {
		if f.Field == path {
			return
		}
	}
	w.invalid = append(w.invalid, limiter.FieldError{Field: path, Message: "is required"})
}

// str reads a string.
func (w *walker) str(path string) (string, bool) {
	t := w.token()
	s, ok := t.(string)
	if !ok {
		w.wrong(path, t, "a string")
	}
	w.sawString(path)
	return s, ok
}

// cost reads an integer from 0 to most. One outside that range, whatever
// its size, is a value, not a shape: a 422, not a 400.
func (w *walker) cost(path string, most int64) int64 {
	t := w.token()
	n, ok := t.(json.Number)
	if !ok || strings.ContainsAny(string(n), ".eE") {
		w.wrong(path, t, "an integer")
		return 0
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	if errors.Is(err, strconv.ErrRange) || v < 0 || v > most {
		w.invalid = append(w.invalid, limiter.FieldError{Field: path, Message: "must be an integer from 0 to " + strconv.FormatInt(most, 10)})
		return 0
	}
	return v
}
