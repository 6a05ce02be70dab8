package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// The media types of request bodies. YAML goes by three names: only
// application/yaml is registered, but the others are what tools send.
const (
	mediaJSON       = "application/json"
	mediaMergePatch = "application/merge-patch+json"
	mediaYAML       = "application/yaml"
	mediaTextYAML   = "text/yaml"
	mediaXYAML      = "application/x-yaml"
)

// requireMedia refuses, with a 415, a body whose Content-Type is missing or
// none of types. A charset other than UTF-8 is refused too: every body is
// read as UTF-8.
func requireMedia(types ...string) echo.MiddlewareFunc {
	want := strings.Join(types, " or ")
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ct := c.Request().Header.Get(echo.HeaderContentType)
			// A bare media type, the common case, needs no parsing.
			if !slices.Contains(types, ct) {
				mt, params, err := mime.ParseMediaType(ct)
				if err != nil || !slices.Contains(types, mt) {
					return errorf(errUnsupportedMedia, "the body must be %s, with a Content-Type header saying so", want)
				}
				if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
					return errorf(errUnsupportedMedia, "the body must be UTF-8, not %s", cs)
				}
			}
			return next(c)
		}
	}
}

// limitBody bounds the request body; reading past n fails with a 413.
func limitBody(n int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if c.Request().ContentLength > n {
				return tooLarge(n)
			}
			c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, n)
			return next(c)
		}
	}
}

func tooLarge(n int64) error {
	return errorf(errTooLarge, "the body is larger than %d bytes", n)
}

// readBody appends the request body to buf. Reading past the limit set by
// limitBody is a 413.
func readBody(r *http.Request, buf []byte) ([]byte, error) {
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
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return buf, tooLarge(mbe.Limit)
			}
			return buf, err
		}
	}
}

// shapeError is a body that is valid JSON of the wrong shape; it lists every
// misplaced field, not only the first that encoding/json would report.
type shapeError struct {
	fields []limiter.FieldError
}

func (e *shapeError) Error() string { return (&limiter.ValidationError{Fields: e.fields}).Error() }

// Nullable is a field that distinguishes absent, null and a value, as a
// PATCH needs: "expires_at": null clears the expiry, no "expires_at" keeps it.
// It is the only way a request field may be null; a pointer field is
// optional, but null for it is the wrong shape.
type Nullable[T any] struct {
	// Set is true when the field was present, even as null.
	Set bool
	// Null is true when the field was null.
	Null bool
	// Value is the field's value when it was present and not null.
	Value T
}

// UnmarshalJSON records that the field was present.
func (n *Nullable[T]) UnmarshalJSON(b []byte) error {
	n.Set = true
	if string(b) == "null" {
		n.Null = true
		return nil
	}
	return json.Unmarshal(b, &n.Value)
}

func (n Nullable[T]) innerType() reflect.Type { return reflect.TypeFor[T]() }

type nullable interface{ innerType() reflect.Type }

// bind reads the JSON body of c into dst, a pointer to a request struct
// with json and validate tags. A body that does not parse or has the wrong
// shape is a 400 naming every bad field. Values that break the validate
// tags are added to fs, so that the handler's converter can add the
// domain's errors and answer one 422 naming every bad field.
func (s *Server) bind(c echo.Context, dst any, fs *fieldSet) error {
	body, err := readBody(c.Request(), nil)
	if err != nil {
		return err
	}
	return s.decode(body, dst, fs)
}

// decode is bind for a body already read.
func (s *Server) decode(body []byte, dst any, fs *fieldSet) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(errBadRequest, "the body is empty; a JSON object is expected")
	}
	if err := strictJSON(body); err != nil {
		return err
	}
	var tree any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&tree); err != nil {
		return errorf(errBadRequest, "the body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(errBadRequest, "the body holds more than one JSON value")
	}
	var fields []limiter.FieldError
	checkShape(tree, reflect.TypeOf(dst).Elem(), "", &fields)
	if len(fields) > 0 {
		return &shapeError{fields: fields}
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return errorf(errBadRequest, "the body does not fit its schema")
	}
	if err := s.validate.Struct(dst); err != nil {
		var ve validator.ValidationErrors
		if !errors.As(err, &ve) {
			return err
		}
		fs.merge(validationFields(ve))
	}
	return nil
}

// strictJSON refuses, with a 400 naming the field, what encoding/json lets
// through: a duplicate key, of which it keeps the last while a gateway in
// front may act on the first, and invalid UTF-8, which it folds into
// U+FFFD so that different inputs become one. Other syntax errors are left
// to encoding/json, whose messages callers already know.
func strictJSON(body []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	_, err := dec.ReadValue()
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		if !utf8.Valid(body) {
			return errorf(errBadRequest, "body is not valid UTF-8")
		}
		return nil
	}
	field := pointerPath(se.JSONPointer)
	switch {
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		return &shapeError{fields: []limiter.FieldError{{Field: field, Message: "duplicate key"}}}
	case utf8.Valid(body):
		return nil
	case field == "":
		return errorf(errBadRequest, "body is not valid UTF-8")
	}
	return &shapeError{fields: []limiter.FieldError{{Field: field, Message: "is not valid UTF-8"}}}
}

// pointerPath writes a JSON Pointer as the field paths of the problems,
// "/buckets/0/cost" as "buckets[0].cost". A token of digits only is taken
// for an array index: no request field is named by digits.
func pointerPath(p jsontext.Pointer) string {
	var path string
	for tok := range p.Tokens() {
		if _, err := strconv.ParseUint(tok, 10, 31); err == nil {
			path += "[" + tok + "]"
			continue
		}
		path = join(path, tok)
	}
	return path
}

// checkShape compares a decoded JSON tree with the Go type it must fill and
// collects every mismatch, with paths like "buckets[1].cost".
func checkShape(v any, t reflect.Type, path string, fields *[]limiter.FieldError) {
	add := func(msg string) {
		name := path
		if name == "" {
			name = "body"
		}
		*fields = append(*fields, limiter.FieldError{Field: name, Message: msg})
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[nullable]()) {
		if v == nil {
			return
		}
		t = reflect.New(t).Interface().(nullable).innerType()
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		add("must not be null")
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			add("must be an object")
			return
		}
		byName := jsonFields(t)
		for _, key := range sortedKeys(obj) {
			f, ok := byName[key]
			if !ok {
				*fields = append(*fields, limiter.FieldError{Field: join(path, key), Message: "unknown field"})
				continue
			}
			checkShape(obj[key], f.Type, join(path, key), fields)
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			add("must be an array")
			return
		}
		for i, e := range arr {
			checkShape(e, t.Elem(), path+"["+strconv.Itoa(i)+"]", fields)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			add("must be a string")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			add("must be a boolean")
		}
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, ok := v.(json.Number)
		if !ok {
			add("must be an integer")
			return
		}
		if _, err := strconv.ParseInt(n.String(), 10, t.Bits()); err != nil {
			add(integerRange(t.Bits()))
		}
	}
}

// integerRange is the message for a number that is not an integer of the
// given size: a fraction, an exponent or too many digits.
func integerRange(bits int) string {
	lo := int64(-1) << (bits - 1)
	return "must be an integer between " + strconv.FormatInt(lo, 10) + " and " + strconv.FormatInt(-(lo+1), 10)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// jsonFields maps the JSON names of a struct's fields to the fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if name := jsonName(f); name != "" {
			out[name] = f
		}
	}
	return out
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return f.Name
	}
	return name
}

// newValidator reports fields by their JSON names.
func newValidator() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(jsonName)
	return v
}

// validationFields turns validator errors into field errors with JSON
// paths and sentences a person can act on.
func validationFields(errs validator.ValidationErrors) []limiter.FieldError {
	out := make([]limiter.FieldError, 0, len(errs))
	for _, e := range errs {
		// The namespace starts with the struct's name: drop it.
		_, field, _ := strings.Cut(e.Namespace(), ".")
		out = append(out, limiter.FieldError{Field: field, Message: validationMessage(e)})
	}
	return out
}

func validationMessage(e validator.FieldError) string {
	switch e.Tag() {
	case "required":
		return "is required"
	case "min", "gte":
		switch e.Kind() {
		case reflect.String:
			return "must be at least " + e.Param() + " characters long"
		case reflect.Slice:
			return "must hold at least " + e.Param() + " items"
		}
		return "must be at least " + e.Param()
	case "max", "lte":
		switch e.Kind() {
		case reflect.String:
			return "must be at most " + e.Param() + " characters long"
		case reflect.Slice:
			return "must hold at most " + e.Param() + " items"
		}
		return "must be at most " + e.Param()
	case "oneof":
		return "must be one of " + strings.ReplaceAll(e.Param(), " ", ", ")
	}
	return "is invalid (" + e.Tag() + ")"
}

// query reads the parameters of a query string into a fieldSet's errors:
// an unknown or repeated parameter is an error, and so is a value that
// does not parse. A parameter given empty counts as not given, as HTML
// forms send every field.
type query struct {
	values map[string][]string
	fs     *fieldSet
}

// readQuery checks that the query string of c holds only the parameters
// known.
func readQuery(c echo.Context, fs *fieldSet, known ...string) query {
	q := query{values: c.QueryParams(), fs: fs}
	for _, name := range sortedKeys(q.values) {
		switch {
		case !slices.Contains(known, name):
			fs.add(name, "unknown parameter; known are "+strings.Join(known, ", "))
		case len(q.values[name]) > 1:
			fs.add(name, "must be given at most once")
		default:
			if msg := limiter.CharProblem(q.values[name][0]); msg != "" {
				fs.add(name, msg)
			}
		}
	}
	return q
}

// pathParams decodes the route's path parameters exactly once and refuses,
// with a 422 naming the parameter, what no database could look up. The
// router matches on the request's escaped path whenever it differs from
// the default encoding ("/v1/limits/%41bc"), and then hands the
// parameters over still escaped; otherwise they arrive decoded.
func pathParams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		escaped := c.Request().URL.RawPath != ""
		var fs fieldSet
		values := c.ParamValues()
		for i, name := range c.ParamNames() {
			v := values[i]
			if escaped {
				var err error
				if v, err = url.PathUnescape(v); err != nil {
					fs.add(name, "is not percent-encoded correctly")
					continue
				}
			}
			if msg := limiter.CharProblem(v); msg != "" {
				fs.add(name, msg)
			}
			values[i] = v
		}
		if err := fs.err(); err != nil {
			return err
		}
		c.SetParamValues(values...)
		return next(c)
	}
}

// str returns the parameter called name, "" when absent.
func (q query) str(name string) string {
	if v := q.values[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// boolean returns the parameter called name, nil when absent.
func (q query) boolean(name string) *bool {
	var b bool
	switch q.str(name) {
	case "":
		return nil
	case "true":
		b = true
	case "false":
	default:
		q.fs.add(name, "must be true or false")
		return nil
	}
	return &b
}

// integer returns the parameter called name, def when absent.
func (q query) integer(name string, lo, hi, def int) int {
	v := q.str(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		q.fs.add(name, "must be an integer from "+strconv.Itoa(lo)+" to "+strconv.Itoa(hi))
		return def
	}
	return n
}

// required returns the parameter called name, and records that it is
// missing when it is.
func (q query) required(name string) string {
	v := q.str(name)
	if v == "" {
		q.fs.add(name, "is required")
	}
	return v
}
