// Package input reads JSON request bodies strictly and in one pass, for
// the admin routes and the decision routes alike. A body is parsed once
// into a small tree that remembers where each value stood; converters then
// read the fields they know, and every error, of shape or of value, goes
// to one list that is answered in the order the fields appear in the body.
//
// It is strict where encoding/json is lenient, because a gateway in front
// may read a body differently: a duplicate key (encoding/json keeps the
// last, others the first), invalid UTF-8 and unpaired surrogate escapes
// (folded into U+FFFD, so that different ids name one bucket) are errors
// naming their field.
package input

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Error is a body that cannot be read as its request: 400, with the bad
// fields when the body is JSON of the wrong shape. Values of the right
// shape that are out of range are a *limiter.ValidationError instead.
type Error struct {
	Detail string
	Fields []limiter.FieldError
}

func (e *Error) Error() string {
	if len(e.Fields) == 0 {
		return e.Detail
	}
	return e.Detail + ": " + (&limiter.ValidationError{Fields: e.Fields}).Error()
}

// Read appends the request body to buf. Reading past the limit of an
// http.MaxBytesReader returns its *http.MaxBytesError, for a 413.
func Read(r *http.Request, buf []byte) ([]byte, error) {
	if n := r.ContentLength; n > 0 && int64(cap(buf)-len(buf)) < n {
		buf = slices.Grow(buf, int(n))
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 512)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// node is one parsed value: its kind ('{', '[', '"', '0', 't', 'f' or
// 'n'), where it began, and its contents.
type node struct {
	kind jsontext.Kind
	// off is where the value before it ended (the value begins after the
	// white space and separator between), end where it ends.
	off, end int64
	text     string // a string's value, a number's literal
	members  []member
	items    []*node
	// ignored is set when the value's contents are not the request's: it
	// is of the wrong type, or an item beyond what its reader takes. None
	// of them is an unknown field.
	ignored bool
}

type member struct {
	name  string
	value *node
	read  bool
}

// Body is a parsed body and the errors found in it so far.
type Body struct {
	data []byte
	root *node
	// at maps the path of every value read to where it stood, so that
	// errors found later, by the domain, sort into body order.
	at    map[string]int64
	shape []fieldAt
	// checked is whether unread members have been added to shape.
	checked bool
	// Errs are the body's invalid values, for the converters, the
	// domain's checks and the database's to add to.
	Errs Errors
}

// fieldAt is a field error and where its field stood in the body.
type fieldAt struct {
	limiter.FieldError
	off int64
}

// absent sorts the errors of fields the body lacks after the others.
const absent = 1 << 62

// Parse reads data, which must be one JSON object. It returns an *Error
// for a body that is empty, not JSON, or holds a duplicate key or invalid
// UTF-8; a body of another JSON type is read, and is the wrong shape.
func Parse(data []byte) (*Body, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &Error{Detail: "the body is empty; a JSON object is expected"}
	}
	p := parser{dec: jsontext.NewDecoder(bytes.NewReader(data))}
	root, err := p.value()
	if err == nil {
		if _, err = p.dec.ReadToken(); err == io.EOF {
			at := map[string]int64{}
			return &Body{data: data, root: root, at: at, Errs: Errors{at: at}}, nil
		} else if err == nil {
			return nil, &Error{Detail: "the body holds more than one JSON value"}
		}
	}
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		return nil, &Error{Detail: "the body is not valid JSON: " + err.Error()}
	}
	field := path(se.JSONPointer)
	switch {
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		return nil, &Error{Detail: "the body has the wrong shape", Fields: []limiter.FieldError{{Field: field, Message: "duplicate key"}}}
	case strings.Contains(se.Err.Error(), "UTF-8") || strings.Contains(se.Err.Error(), "surrogate"):
		// jsontext keeps its error for these unexported, so its words are
		// matched; TestUnreadable fails should they change. Where no field
		// can be named, the body is.
		return nil, &Error{Detail: "the body is not valid UTF-8", Fields: []limiter.FieldError{{Field: cmp.Or(field, "body"), Message: "is not valid UTF-8"}}}
	case !utf8.Valid(data):
		// A bad byte that the syntax error came before, or after the value.
		return nil, &Error{Detail: "the body is not valid UTF-8", Fields: []limiter.FieldError{{Field: "body", Message: "is not valid UTF-8"}}}
	}
	return nil, &Error{Detail: "the body is not valid JSON: " + se.Error()}
}

// parser builds the tree of a body. Its depth is bounded by the decoder,
// and its size by the body's limit.
type parser struct {
	dec *jsontext.Decoder
}

func (p *parser) value() (*node, error) {
	off := p.dec.InputOffset()
	tok, err := p.dec.ReadToken()
	if err != nil {
		return nil, err
	}
	n := &node{kind: tok.Kind(), off: off}
	switch n.kind {
	case '{':
		for p.dec.PeekKind() != '}' {
			tok, err := p.dec.ReadToken()
			if err != nil {
				return nil, err
			}
			// Before the next read, which reuses the token's buffer.
			name := tok.String()
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			n.members = append(n.members, member{name: name, value: v})
		}
	case '[':
		for p.dec.PeekKind() != ']' {
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, v)
		}
	case '"', '0':
		n.text = tok.String()
		n.end = p.dec.InputOffset()
		return n, nil
	default:
		n.end = p.dec.InputOffset()
		return n, nil
	}
	// The closing delimiter, or the error PeekKind saw.
	_, err = p.dec.ReadToken()
	n.end = p.dec.InputOffset()
	return n, err
}

// path writes a JSON Pointer as the field paths of the problems,
// "/buckets/0/cost" as "buckets[0].cost". A token of digits only is taken
// for an array index: no request field is named by digits.
func path(p jsontext.Pointer) string {
	var out string
	for tok := range p.Tokens() {
		if _, err := strconv.ParseUint(tok, 10, 31); err == nil {
			out += "[" + tok + "]"
			continue
		}
		out = Join(out, tok)
	}
	return out
}

// Join appends a member's name to a path.
func Join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// Index appends an array index to a path.
func Index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// Root returns the body as an object; a body of another JSON type is the
// wrong shape, and its Object has no members.
func (b *Body) Root() Object {
	o := Object{b: b}
	if b.root.kind != '{' {
		b.wrong("", b.root, "an object")
		return o
	}
	o.n = b.root
	return o
}

// wrong records a value of the wrong type at path.
func (b *Body) wrong(path string, n *node, want string) {
	msg := "must be " + want
	if n.kind == 'n' {
		msg = "must not be null"
	}
	if path == "" {
		path = "body"
	}
	n.ignored = true
	b.shape = append(b.shape, fieldAt{limiter.FieldError{Field: path, Message: msg}, n.off})
}

// Shape returns an *Error (400) listing, in body order, every value of
// the wrong type and every member no converter read, which is an unknown
// field; nil when the body has the right shape.
func (b *Body) Shape() error {
	if !b.checked {
		b.checked = true
		b.unknown(b.root, "")
		slices.SortStableFunc(b.shape, func(x, y fieldAt) int { return cmpOff(x.off, y.off) })
	}
	if len(b.shape) > 0 {
		return &Error{Detail: "the body has the wrong shape", Fields: plain(b.shape)}
	}
	return nil
}

// Err returns the body's errors: Shape's when it has the wrong shape, else
// a *limiter.ValidationError (422) listing the invalid values in body
// order; nil when there are none.
func (b *Body) Err() error {
	if err := b.Shape(); err != nil {
		return err
	}
	return b.Errs.Err()
}

// unknown records the members of n and its children that were not read.
func (b *Body) unknown(n *node, at string) {
	if n == nil || n.ignored {
		return
	}
	for _, m := range n.members {
		p := Join(at, m.name)
		if !m.read {
			b.shape = append(b.shape, fieldAt{limiter.FieldError{Field: p, Message: "unknown field"}, m.value.off})
			continue
		}
		b.unknown(m.value, p)
	}
	for i, item := range n.items {
		b.unknown(item, Index(at, i))
	}
}

func cmpOff(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func plain(fields []fieldAt) []limiter.FieldError {
	out := make([]limiter.FieldError, len(fields))
	for i, f := range fields {
		out[i] = f.FieldError
	}
	return out
}

// Errors collects the invalid values of one request, from every check that
// looks at it: the converters', the domain's, the database's. A field keeps
// its first error only, so that "is required" is not followed by the
// domain's complaint about the zero value that stood in for the field.
type Errors struct {
	fields []fieldAt
	// seen indexes fields by name: a body of many bad buckets can hold
	// tens of thousands of errors.
	seen map[string]struct{}
	// at is shared with the Body, and only read here.
	at map[string]int64
}

// Add records that field is invalid, unless it already is.
func (e *Errors) Add(field, message string) {
	if e.Has(field) {
		return
	}
	// A field the body lacks stands where the object that lacks it does.
	off := int64(absent)
	for p := field; p != ""; p = p[:max(strings.LastIndexByte(p, '.'), strings.LastIndexByte(p, '['), 0)] {
		if at, ok := e.at[p]; ok {
			off = at
			break
		}
	}
	if e.seen == nil {
		e.seen = map[string]struct{}{}
	}
	e.seen[field] = struct{}{}
	e.fields = append(e.fields, fieldAt{limiter.FieldError{Field: field, Message: message}, off})
}

// Clone returns a copy of e that can be added to without changing e.
func (e *Errors) Clone() Errors {
	c := Errors{fields: slices.Clone(e.fields), at: e.at}
	if e.seen != nil {
		c.seen = maps.Clone(e.seen)
	}
	return c
}

// Merge adds every error of fields whose field is not invalid yet.
func (e *Errors) Merge(fields []limiter.FieldError) {
	for _, f := range fields {
		e.Add(f.Field, f.Message)
	}
}

// Has reports whether field is invalid already.
func (e *Errors) Has(field string) bool {
	_, ok := e.seen[field]
	return ok
}

// Empty reports whether no value is invalid.
func (e *Errors) Empty() bool { return len(e.fields) == 0 }

// Err returns the errors in body order as one *limiter.ValidationError,
// nil when there are none.
func (e *Errors) Err() error {
	if len(e.fields) == 0 {
		return nil
	}
	sorted := slices.Clone(e.fields)
	slices.SortStableFunc(sorted, func(x, y fieldAt) int { return cmpOff(x.off, y.off) })
	return &limiter.ValidationError{Fields: plain(sorted)}
}

// Object is an object of a body, read member by member.
type Object struct {
	b    *Body
	n    *node
	path string
}

// Path is where the object stands in the body, "" for the body itself.
func (o Object) Path() string { return o.path }

// get returns the member called name, marking it read; nil when absent.
func (o Object) get(name string) *node {
	if o.n == nil {
		return nil
	}
	for i := range o.n.members {
		if m := &o.n.members[i]; m.name == name {
			m.read = true
			o.b.at[Join(o.path, name)] = m.value.off
			return m.value
		}
	}
	return nil
}

// Has reports whether the object has a member called name, without
// reading it.
func (o Object) Has(name string) bool {
	return o.n != nil && slices.ContainsFunc(o.n.members, func(m member) bool { return m.name == name })
}

// Require records "is required" for each name the object lacks. A body of
// the wrong type lacks nothing: its shape is the error.
func (o Object) Require(names ...string) {
	if o.n == nil {
		return
	}
	for _, name := range names {
		if !o.Has(name) {
			o.b.Errs.Add(Join(o.path, name), "is required")
		}
	}
}

// String reads a string member; ok is false when it is absent or not a
// string, which is recorded. A string no database can store (see
// limiter.CharProblem) is an invalid value whatever the field, so that no
// engine is asked to store it.
func (o Object) String(name string) (s string, ok bool) {
	n := o.get(name)
	switch {
	case n == nil:
		return "", false
	case n.kind != '"':
		o.b.wrong(Join(o.path, name), n, "a string")
		return "", false
	}
	if msg := limiter.CharProblem(n.text); msg != "" {
		o.b.Errs.Add(Join(o.path, name), msg)
	}
	return n.text, true
}

// Bool reads a boolean member.
func (o Object) Bool(name string) (v, ok bool) {
	n := o.get(name)
	switch {
	case n == nil:
		return false, false
	case n.kind != 't' && n.kind != 'f':
		o.b.wrong(Join(o.path, name), n, "a boolean")
		return false, false
	}
	return n.kind == 't', true
}

// Int reads an integer member. A fraction, an exponent or an integer
// beyond 64 bits is the wrong shape: the schema's integers are 64 bits.
func (o Object) Int(name string) (v int64, ok bool) {
	n := o.integer(name)
	if n == nil {
		return 0, false
	}
	v, err := strconv.ParseInt(n.text, 10, 64)
	if err != nil {
		o.b.wrong(Join(o.path, name), n, "an integer between -9223372036854775808 and 9223372036854775807")
		return 0, false
	}
	return v, true
}

// Integer reads an integer member's digits, for a caller that words its
// own range, whatever the size; a fraction or an exponent is the wrong
// shape.
func (o Object) Integer(name string) (digits string, ok bool) {
	if n := o.integer(name); n != nil {
		return n.text, true
	}
	return "", false
}

// integer returns an integer member, nil when it is absent or of the wrong
// shape, which is recorded.
func (o Object) integer(name string) *node {
	n := o.get(name)
	if n != nil && (n.kind != '0' || strings.ContainsAny(n.text, ".eE")) {
		o.b.wrong(Join(o.path, name), n, "an integer")
		return nil
	}
	return n
}

// Null reads whether a member is null, for fields where null means "none"
// (an expiry, say). A null member is read; another value is left for the
// member's reader.
func (o Object) Null(name string) bool {
	if o.n == nil {
		return false
	}
	for _, m := range o.n.members {
		if m.name == name && m.value.kind == 'n' {
			o.get(name)
			return true
		}
	}
	return false
}

// Objects reads an array of objects, calling each for its first most
// items; the others are left unread, so that a huge array costs no more
// than most items, and the caller words the error of a count above most.
// It returns the count of items; ok is false when the member is absent or
// not an array.
func (o Object) Objects(name string, most int, each func(int, Object)) (n int, ok bool) {
	v := o.get(name)
	p := Join(o.path, name)
	switch {
	case v == nil:
		return 0, false
	case v.kind != '[':
		o.b.wrong(p, v, "an array")
		return 0, false
	}
	for i, item := range v.items {
		if i >= most {
			item.ignored = true
			continue
		}
		ip := Index(p, i)
		if item.kind != '{' {
			o.b.wrong(ip, item, "an object")
			continue
		}
		o.b.at[ip] = item.off
		each(i, Object{b: o.b, n: item, path: ip})
	}
	return len(v.items), true
}

// Values reads an array member and returns the text of each of its first
// most items, for a caller that reads each as a body of its own (Parse);
// the others are left unread, and the caller words the error of a count
// above most. It returns the count of items; ok is false when the member
// is absent or not an array.
func (o Object) Values(name string, most int) (items [][]byte, n int, ok bool) {
	v := o.get(name)
	switch {
	case v == nil:
		return nil, 0, false
	case v.kind != '[':
		o.b.wrong(Join(o.path, name), v, "an array")
		return nil, 0, false
	}
	// Read as bodies of their own, the items are not this body's to check.
	v.ignored = true
	for _, item := range v.items[:min(len(v.items), most)] {
		// An item's offset is where the value before it ended.
		items = append(items, bytes.TrimLeft(o.b.data[item.off:item.end], " \t\r\n,"))
	}
	return items, len(v.items), true
}

// MediaProblem says why a body declared by the Content-Type value ct
// cannot be read as one of types, "" when it can: the type is missing or
// another, or the charset is not UTF-8, as every body is read as UTF-8.
func MediaProblem(ct string, types ...string) string {
	// A bare media type, the common case, needs no parsing.
	if slices.Contains(types, ct) {
		return ""
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || !slices.Contains(types, mt) {
		return "the body must be " + strings.Join(types, " or ") + ", with a Content-Type header saying so"
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return "the body must be UTF-8, not " + cs
	}
	return ""
}
