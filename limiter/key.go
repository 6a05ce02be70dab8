package limiter

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// keyPrefix is the part of a bucket key that names its limit: "<enum>:"
// for the first limit given the enum, "<enum>.<generation>:" for a later
// one, so that a limit created again never inherits the buckets of the
// deleted one. The first generation keeps the plain form, which keys had
// before generations existed, so that upgrading keeps every bucket.
func keyPrefix(enum, generation int) string {
	if generation <= 1 {
		return strconv.Itoa(enum) + ":"
	}
	return strconv.Itoa(enum) + "." + strconv.Itoa(generation) + ":"
}

// bucketKey joins a limit's key prefix and a canonical bucket id into the
// key that names the bucket in the snapshot and in the stores, for example
// "3:12345678". Formats that can carry personal data or long lists put the
// first 128 bits of the id's SHA-256 there instead (base64url, 22
// characters, after a '#' that tells a reader the key is hashed), so that
// e-mail addresses never sit in Redis keys.
func bucketKey(prefix string, f IDFormat, canonical string) string {
	var buf [64]byte
	return string(appendKey(buf[:0], prefix, f, canonical))
}

// appendKey appends the bucket key to dst, so that decisions can build keys
// in reused memory.
func appendKey(dst []byte, prefix string, f IDFormat, canonical string) []byte {
	dst = append(dst, prefix...)
	if !f.Hashed() {
		return append(dst, canonical...)
	}
	sum := sha256.Sum256([]byte(canonical))
	dst = append(dst, '#')
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16])
}
