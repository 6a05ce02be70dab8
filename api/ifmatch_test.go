package api

import "testing"

func TestParseIfMatch(t *testing.T) {
	for _, c := range []struct {
		values []string
		bad    bool
		match  []int64
		miss   []int64
	}{
		{values: []string{`"3"`}, match: []int64{3}, miss: []int64{2, 33}},
		{values: []string{`"1", "2"`, `W/"4", "x,y"`}, match: []int64{1, 2}, miss: []int64{4}},
		{values: []string{" * "}, match: []int64{1, 99}},
		// No If-Match is no precondition.
		{values: nil, match: []int64{1, 99}},
		{values: []string{`"1",, "2"`}, bad: true},
		{values: []string{`3`}, bad: true},
		{values: []string{`"3`}, bad: true},
		{values: []string{`"3",`}, bad: true},
		{values: []string{`"3" "4"`}, bad: true},
		{values: []string{`*, "3"`}, bad: true},
		{values: []string{""}, bad: true},
	} {
		match, err := parseIfMatch(c.values)
		if (err != nil) != c.bad {
			t.Errorf("%q: error %v", c.values, err)
			continue
		}
		if err != nil {
			continue
		}
		for _, v := range c.match {
			if !match(v) {
				t.Errorf("%q does not match %d", c.values, v)
			}
		}
		for _, v := range c.miss {
			if match(v) {
				t.Errorf("%q matches %d", c.values, v)
			}
		}
	}
}
