// Package key holds the one rule of the Go client's packages on the
// strings that name a bucket: the bucket ids that ratelimit.Client sends,
// and the keys that its middleware reads from a header and ratelimitgrpc's
// interceptors from metadata. One rule, so that a key the one front takes
// the other takes too, and so that neither passes on a key the Client
// would refuse.
package key

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxLen is longer than any bucket id a format of ratelimitd's takes: the
// longest, a set of 100 names of up to 1,024 bytes each, is about 100 KiB.
// It bounds what one call may send, so that no key can make a body longer
// than ratelimitd reads.
const MaxLen = 128 << 10

// Problem says why no limit of ratelimitd's could take s as a bucket id,
// "" when one might: not UTF-8 (a JSON body cannot carry it), holding NUL
// (no id format takes it) or longer than most bytes. The rest is each
// limit's id format's to judge.
func Problem(s string, most int) string {
	switch {
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL"
	case len(s) > most:
		return "longer than " + strconv.Itoa(most) + " bytes"
	}
	return ""
}

// One returns the key that the values of a header or metadata entry
// called name give: its one value. It refuses, naming the entry, one
// missing or empty, sent more than once, or that Problem refuses.
func One(name string, values []string) (string, error) {
	switch {
	case len(values) == 0 || values[0] == "":
		return "", errors.New(name + " is missing")
	case len(values) > 1:
		return "", errors.New(name + " is sent more than once")
	}
	if msg := Problem(values[0], MaxLen); msg != "" {
		return "", errors.New(name + " " + msg)
	}
	return values[0], nil
}
