package input_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// fields lists "field: message" of an *input.Error or a
// *limiter.ValidationError, and says which it was.
func fields(t *testing.T, err error) (kind string, out []string) {
	t.Helper()
	var ie *input.Error
	var ve *limiter.ValidationError
	var list []limiter.FieldError
	switch {
	case errors.As(err, &ie):
		kind, list = "shape", ie.Fields
	case errors.As(err, &ve):
		kind, list = "invalid", ve.Fields
	case err == nil:
		return "", nil
	default:
		t.Fatalf("unexpected error %T: %v", err, err)
	}
	for _, f := range list {
		out = append(out, f.Field+": "+f.Message)
	}
	return kind, out
}

// read is a converter of the kind the api writes: a few fields, a nested
// array, and the domain's checks after the body's.
func read(b *input.Body) {
	o := b.Root()
	o.Require("name", "burst", "items")
	if v, ok := o.String("name"); ok && v == "" {
		b.Errs.Add("name", "must not be empty")
	}
	burst, _ := o.Int("burst")
	o.Bool("shadow")
	if !o.Null("expires") {
		o.String("expires")
	}
	o.Objects("items", 2, func(_ int, item input.Object) {
		item.Require("key")
		item.String("key")
	})
	// The domain speaks last, of fields anywhere in the body.
	if burst < 1 {
		b.Errs.Merge([]limiter.FieldError{{Field: "burst", Message: "must be at least 1"}})
	}
}

func TestBodies(t *testing.T) {
	cases := []struct {
		name, body string
		kind       string
		want       []string
	}{
		{"valid", `{"name":"a","burst":1,"items":[{"key":"k"}],"expires":null}`, "", nil},
		{"body order, not check order", `{"items":[{}],"burst":0,"name":""}`, "invalid",
			[]string{"items[0].key: is required", "burst: must be at least 1", "name: must not be empty"}},
		{"absent fields last", `{"burst":0}`, "invalid",
			[]string{"burst: must be at least 1", "name: is required", "items: is required"}},
		{"shapes in body order", `{"shadow":1,"name":5,"zzz":true,"items":[{"key":"k","x":1},3],"burst":1.5}`, "shape",
			[]string{"shadow: must be a boolean", "name: must be a string", "zzz: unknown field",
				"items[0].x: unknown field", "items[1]: must be an object", "burst: must be an integer"}},
		{"shape wins over values", `{"name":"","burst":"x","items":[]}`, "shape", []string{"burst: must be an integer"}},
		{"the contents of a wrong value are not unknown", `{"name":{"x":1},"burst":1,"items":{"key":"k"}}`, "shape",
			[]string{"name: must be a string", "items: must be an array"}},
		{"items beyond the reader's are not read", `{"name":"a","burst":1,"items":[{"key":"k"},{"key":"k"},{"x":1},{}]}`, "", nil},
		{"null is not a value", `{"name":null,"burst":1,"items":null}`, "shape",
			[]string{"name: must not be null", "items: must not be null"}},
		{"null where it means none", `{"name":"a","burst":1,"items":[],"expires":null}`, "", nil},
		{"beyond 64 bits", `{"name":"a","burst":9223372036854775808,"items":[]}`, "shape",
			[]string{"burst: must be an integer between -9223372036854775808 and 9223372036854775807"}},
		{"NUL", `{"name":"a\u0000","burst":1,"items":[{"key":"\u0000"}]}`, "invalid",
			[]string{"name: must not contain NUL", "items[0].key: must not contain NUL"}},
		{"not an object", `[1]`, "shape", []string{"body: must be an object"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := input.Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			read(b)
			kind, got := fields(t, b.Err())
			if kind != tc.kind || !slices.Equal(got, tc.want) {
				t.Errorf("got %s %q, want %s %q", kind, got, tc.kind, tc.want)
			}
		})
	}
}

func TestUnreadable(t *testing.T) {
	cases := []struct {
		name, body string
		detail     string
		want       []string
	}{
		{"empty", " \n", "the body is empty; a JSON object is expected", nil},
		{"not JSON", `{"a":`, "the body is not valid JSON", nil},
		{"two values", `{} {}`, "the body holds more than one JSON value", nil},
		{"duplicate key", `{"a":1,"a":2}`, "the body has the wrong shape", []string{"a: duplicate key"}},
		{"nested duplicate", `{"items":[{"key":"x"},{"key":"y","key":"z"}]}`, "the body has the wrong shape", []string{"items[1].key: duplicate key"}},
		{"invalid UTF-8 in a value", "{\"name\":\"a\xff\"}", "the body is not valid UTF-8", []string{"name: is not valid UTF-8"}},
		{"unpaired surrogate", `{"items":[{"key":"\ud800"}]}`, "the body is not valid UTF-8", []string{"items[0].key: is not valid UTF-8"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := input.Parse([]byte(tc.body))
			var ie *input.Error
			if !errors.As(err, &ie) {
				t.Fatalf("got %v, want an *input.Error", err)
			}
			if !strings.HasPrefix(ie.Detail, tc.detail) {
				t.Errorf("detail %q, want %q", ie.Detail, tc.detail)
			}
			if _, got := fields(t, err); !slices.Equal(got, tc.want) {
				t.Errorf("fields %q, want %q", got, tc.want)
			}
		})
	}
}

// TestErrorsCopy: a clone of Errors is added to without changing the
// original, so that a PATCH can add the errors of each attempt to the
// body's.
func TestErrorsCopy(t *testing.T) {
	b, err := input.Parse([]byte(`{"a":"x","b":"y"}`))
	if err != nil {
		t.Fatal(err)
	}
	b.Root().String("a")
	b.Root().String("b")
	b.Errs.Add("b", "is bad")
	for range 2 {
		c := b.Errs.Clone()
		c.Add("a", "is worse")
		if _, got := fields(t, c.Err()); !slices.Equal(got, []string{"a: is worse", "b: is bad"}) {
			t.Errorf("copy: %q", got)
		}
	}
	if _, got := fields(t, b.Errs.Err()); !slices.Equal(got, []string{"b: is bad"}) {
		t.Errorf("original: %q", got)
	}
}

func TestMediaProblem(t *testing.T) {
	for ct, want := range map[string]string{
		"application/json":                 "",
		"application/json; charset=UTF-8":  "",
		"application/yaml":                 "",
		"application/json; charset=latin1": "the body must be UTF-8, not latin1",
		"":                                 "the body must be application/json or application/yaml, with a Content-Type header saying so",
		"text/plain":                       "the body must be application/json or application/yaml, with a Content-Type header saying so",
		"application/json/x":               "the body must be application/json or application/yaml, with a Content-Type header saying so",
	} {
		if got := input.MediaProblem(ct, "application/json", "application/yaml"); got != want {
			t.Errorf("%q: %q, want %q", ct, got, want)
		}
	}
}
