package db

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"sync"
	"time"
)

// crockford is Crockford's base32 alphabet: no I, L, O or U, so that an id
// read aloud or copied by hand is not misread.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idLen is the length of an id: 128 bits in 5-bit characters.
const idLen = 26

// idSource makes the ids of overrides and tokens: 48 bits of Unix
// milliseconds followed by 80 random bits, in 26 characters of Crockford
// base32, so that byte order is creation order. Within one millisecond, or
// when the clock stands still or steps back, the random part of the
// previous id is incremented instead, so that the ids of one process stay
// strictly increasing; across processes they are ordered to the
// millisecond.
type idSource struct {
	mu     sync.Mutex
	lastMS int64
	last   [10]byte
}

func (s *idSource) next(now time.Time) string {
	ms := now.UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case ms > s.lastMS:
		_, _ = rand.Read(s.last[:]) // crypto/rand.Read never fails
	case increment(&s.last):
		ms = s.lastMS
	default:
		// The random part overflowed: take the next millisecond.
		ms = s.lastMS + 1
		_, _ = rand.Read(s.last[:])
	}
	s.lastMS = ms
	var b [16]byte
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	copy(b[6:], s.last[:])
	return encodeID(b)
}

// increment adds 1 to the big-endian number b and reports whether it did
// so without overflowing.
func increment(b *[10]byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		b[i]++
		if b[i] != 0 {
			return true
		}
	}
	return false
}

// encodeID writes 128 bits as 26 base32 characters, most significant first;
// the first character carries the 2 leading zero bits that pad 128 to 130.
func encodeID(b [16]byte) string {
	var out [idLen]byte
	for i := range out {
		v := 0
		for j := range 5 {
			bit := 5*i + j - 2
			v <<= 1
			if bit >= 0 && b[bit/8]>>(7-bit%8)&1 == 1 {
				v |= 1
			}
		}
		out[i] = crockford[v]
	}
	return string(out[:])
}

// validID reports whether s has the form of an id.
func validID(s string) bool {
	if len(s) != idLen || s[0] > '7' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(crockford, s[i]) < 0 {
			return false
		}
	}
	return true
}

// pageToken makes the token of the page after the override id; it is
// opaque so that clients do not build their own.
func pageToken(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// pageAfter returns the id a page token continues after.
func pageAfter(token string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || !validID(string(b)) {
		return "", false
	}
	return string(b), true
}
