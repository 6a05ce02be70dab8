package key

import (
	"strings"
	"testing"
)

// TestOne: one value is the key; none, an empty one, two, and one that
// no limit could take are refused, naming the entry.
func TestOne(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   string // the key, or the error's text
	}{
		{[]string{"k1"}, "k1"},
		{[]string{"ünï code"}, "ünï code"},
		{[]string{strings.Repeat("k", MaxLen)}, strings.Repeat("k", MaxLen)},
		{nil, "x-key is missing"},
		{[]string{""}, "x-key is missing"},
		{[]string{"a", "b"}, "x-key is sent more than once"},
		{[]string{"a\x00b"}, "x-key must not contain NUL"},
		{[]string{"a\xffb"}, "x-key must be valid UTF-8"},
		{[]string{strings.Repeat("k", MaxLen+1)}, "x-key longer than 131072 bytes"},
	} {
		got, err := One("x-key", tc.values)
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%.20q: %.40q, want %.40q", tc.values, got, tc.want)
		}
	}
}
