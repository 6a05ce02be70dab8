// Package auth holds API tokens: their scopes, secrets and hashes, and the
// in-memory set that authenticates requests without touching SQL.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"hash/maphash"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// Scope says what a token may do.
type Scope string

// The scopes of tokens.
const (
	// Admin may do everything.
	Admin Scope = "admin"
	// Support manages overrides, resets buckets and reads limits.
	Support Scope = "support"
	// Decide asks for decisions and reads limits.
	Decide Scope = "decide"
)

// Valid reports whether s is one of the scopes.
func (s Scope) Valid() bool { return s == Admin || s == Support || s == Decide }

// Allows reports whether a token of scope s may use a route open to the
// scopes given; admin may use every route.
func (s Scope) Allows(scopes ...Scope) bool {
	if s == Admin {
		return true
	}
	for _, o := range scopes {
		if s == o {
			return true
		}
	}
	return false
}

// Token is an API token as stored: its secret is known only by its hash.
type Token struct {
	ID    string
	Name  string
	Scope Scope
	// Hash is the hex SHA-256 of the secret.
	Hash      string
	CreatedAt time.Time
	// RevokedAt is zero while the token works.
	RevokedAt time.Time
}

// secretPrefix makes leaked tokens easy to recognise in logs and scanners.
const secretPrefix = "rlt_"

// NewSecret returns a fresh random secret and its hash. The secret is shown
// once, at creation; only the hash is stored. A 256-bit secret needs no salt
// or slow hash: it cannot be guessed, only stolen.
func NewSecret() (secret, hash string) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	secret = secretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, Hash(secret)
}

// Hash returns the hex SHA-256 of a secret.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// The actors the service records for changes that no token made. No token
// may take their names, so that an audit entry says truly who made a
// change.
const (
	// BootstrapActor is the RATELIMIT_BOOTSTRAP_TOKEN's name.
	BootstrapActor = "bootstrap"
	// CLIActor makes the changes of the command line.
	CLIActor = "cli"
	// ServiceActor creates the first admin token of an empty database.
	ServiceActor = "ratelimitd"
)

// NameProblem returns why name cannot name a token, or "" when it can.
// Names appear in audit entries as the actor.
func NameProblem(name string) string {
	switch {
	case strings.EqualFold(name, BootstrapActor), strings.EqualFold(name, CLIActor), strings.EqualFold(name, ServiceActor):
		return "is reserved for the service's own changes"
	case name == "":
		return "must not be empty"
	case len(name) > 64:
		return "must be at most 64 bytes"
	case !utf8.ValidString(name):
		return "must be valid UTF-8"
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return "must not contain control characters"
		}
	}
	return ""
}

// Principal is who made a request.
type Principal struct {
	// Name is the token's name, recorded as the actor of changes.
	Name  string
	Scope Scope
}

// Set authenticates secrets against a fixed collection of tokens. Its
// tokens are fixed; the loader replaces it when tokens change.
type Set struct {
	byHash    map[string]Principal
	bootstrap string
	known     knownSecrets
}

// NewSet returns the set of the tokens that are not revoked, plus the
// bootstrap secret as an admin token named "bootstrap" when it is not empty.
func NewSet(tokens []Token, bootstrap string) *Set {
	s := &Set{byHash: make(map[string]Principal, len(tokens)), bootstrap: bootstrap}
	for _, t := range tokens {
		if t.RevokedAt.IsZero() {
			s.byHash[t.Hash] = Principal{Name: t.Name, Scope: t.Scope}
		}
	}
	s.known.seed = maphash.MakeSeed()
	s.known.m.Store(&map[uint64]knownSecret{})
	return s
}

// Authenticate returns the principal of a secret. A secret that this set
// authenticated before is found without hashing it again.
func (s *Set) Authenticate(secret string) (Principal, bool) {
	if s.bootstrap != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(s.bootstrap)) == 1 {
		return Principal{Name: BootstrapActor, Scope: Admin}, true
	}
	key := maphash.String(s.known.seed, secret)
	if p, ok := s.known.get(key, secret); ok {
		return p, true
	}
	p, ok := s.byHash[Hash(secret)]
	if ok {
		s.known.add(key, secret, p)
	}
	return p, ok
}

// knownSecrets remembers the secrets that authenticated against one Set,
// so that a token in use costs a SHA-256 once per Set instead of once per
// request. It keeps what the Set promises:
//
//   - It belongs to one Set, and a change of the tokens, a revocation
//     included, makes a new Set: from then on every secret is checked
//     against the new hashes, as it would be without it.
//   - It holds only secrets that authenticated, at most one per token, so
//     no caller can make it grow; a secret it does not hold is hashed and
//     looked up as before. That a held secret is answered sooner tells its
//     sender nothing the answer does not: it works.
//   - It is keyed by a hash of the secret under a seed made at random for
//     the Set, not by the secret: a map keyed by the secret would compare a
//     presented secret with stored ones byte by byte, in a time that tells
//     how much of them agrees. Without the seed, which never leaves the
//     process, nobody can aim a secret at an entry, and an entry found is
//     only a candidate: the whole secret is then compared in constant
//     time.
//   - The secrets it holds are those that requests carry anyway; they are
//     kept in memory only and go with the Set.
type knownSecrets struct {
	seed maphash.Seed
	// m is read without a lock and copied to add a secret, which happens
	// once per token.
	m  atomic.Pointer[map[uint64]knownSecret]
	mu sync.Mutex
}

// knownSecret is a secret that authenticated, and as whom.
type knownSecret struct {
	secret string
	p      Principal
}

// get returns the principal of secret, whose seeded hash is key, when it
// is held.
func (k *knownSecrets) get(key uint64, secret string) (Principal, bool) {
	e, ok := (*k.m.Load())[key]
	if ok && subtle.ConstantTimeCompare([]byte(e.secret), []byte(secret)) == 1 {
		return e.p, true
	}
	return Principal{}, false
}

// add holds secret, which authenticated as p. Of two secrets whose seeded
// hashes collide, the later is held, and the other is hashed each time.
func (k *knownSecrets) add(key uint64, secret string, p Principal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	old := *k.m.Load()
	m := make(map[uint64]knownSecret, len(old)+1)
	maps.Copy(m, old)
	// A copy, so that the request the secret came in is not kept.
	m[key] = knownSecret{secret: strings.Clone(secret), p: p}
	k.m.Store(&m)
}

// Len is the number of working tokens, the bootstrap token excluded.
func (s *Set) Len() int { return len(s.byHash) }

// Authenticator knows the tokens; *Keeper is one.
type Authenticator interface {
	Authenticate(secret string) (Principal, bool)
}

// Refusal says why a request's credentials are refused, in words for its
// client, so that every front end refuses alike.
type Refusal struct {
	// Forbidden is a known token whose scope may not do this (HTTP 403);
	// otherwise the token is missing or unknown (HTTP 401).
	Forbidden bool
	// Challenge is the WWW-Authenticate value of a 401.
	Challenge string
	Detail    string
}

// Authorize checks the value of an Authorization header, "Bearer <token>",
// and that the token's scope is one of scopes (admin passes everywhere).
func Authorize(a Authenticator, header string, scopes ...Scope) (Principal, *Refusal) {
	scheme, secret, ok := strings.Cut(header, " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return Principal{}, &Refusal{Challenge: `Bearer realm="ratelimitd"`,
			Detail: "an Authorization: Bearer <token> header is required"}
	}
	p, ok := a.Authenticate(secret)
	if !ok {
		return Principal{}, &Refusal{Challenge: `Bearer realm="ratelimitd", error="invalid_token"`,
			Detail: "the token is unknown or revoked"}
	}
	if !p.Scope.Allows(scopes...) {
		names := []string{string(Admin)}
		for _, s := range scopes {
			if s != Admin {
				names = append(names, string(s))
			}
		}
		return Principal{}, &Refusal{Forbidden: true,
			Detail: "a token of scope " + strconv.Quote(string(p.Scope)) + " may not do this; it needs " + strings.Join(names, " or ")}
	}
	return p, nil
}
