package db

import (
	"strings"
	"testing"
	"time"
)

func TestEncodeID(t *testing.T) {
	var zero, ones, ms [16]byte
	for i := range ones {
		ones[i] = 0xff
	}
	ms[5] = 1 // 1 ms, no random bits: 1 << 80
	for _, tc := range []struct {
		in   [16]byte
		want string
	}{
		{zero, strings.Repeat("0", 26)},
		{ones, "7" + strings.Repeat("Z", 25)},
		// 2^80 = 32^16: a 1 followed by 16 zeros in base 32.
		{ms, strings.Repeat("0", 9) + "1" + strings.Repeat("0", 16)},
	} {
		if got := encodeID(tc.in); got != tc.want || !validID(got) {
			t.Errorf("encodeID(%x) = %s (valid %v), want %s", tc.in, got, validID(got), tc.want)
		}
	}
	for _, bad := range []string{"", "8" + strings.Repeat("0", 25), strings.Repeat("0", 25) + "U", strings.Repeat("0", 27)} {
		if validID(bad) {
			t.Errorf("validID(%q) = true", bad)
		}
	}
}

// TestIDsIncrease checks that ids from one source increase strictly, also
// when the clock stands still or steps back, and sort in time order.
func TestIDsIncrease(t *testing.T) {
	var s idSource
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := ""
	for i := range 1000 {
		at := now
		switch {
		case i%3 == 1:
			at = now.Add(-time.Second)
		case i%100 == 0:
			now = now.Add(time.Millisecond)
			at = now
		}
		id := s.next(at)
		if !validID(id) || id <= prev {
			t.Fatalf("id %d = %s after %s", i, id, prev)
		}
		prev = id
	}
	later := s.next(now.Add(time.Hour))
	if later <= prev || later[:10] == prev[:10] {
		t.Errorf("an id an hour later %s does not sort after %s by its time", later, prev)
	}
}

func TestIncrementOverflow(t *testing.T) {
	var s idSource
	now := time.UnixMilli(1000)
	first := s.next(now)
	for i := range s.last {
		s.last[i] = 0xff
	}
	id := s.next(now)
	if id <= first || s.lastMS != 1001 {
		t.Errorf("after overflow: id %s, ms %d; want a later id at ms 1001", id, s.lastMS)
	}
}
