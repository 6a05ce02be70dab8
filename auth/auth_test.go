package auth_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
)

func TestScopes(t *testing.T) {
	for _, tc := range []struct {
		scope auth.Scope
		route []auth.Scope
		want  bool
	}{
		{auth.Admin, []auth.Scope{auth.Decide}, true},
		{auth.Support, []auth.Scope{auth.Support}, true},
		{auth.Support, []auth.Scope{auth.Decide}, false},
		{auth.Decide, []auth.Scope{auth.Admin}, false},
		{auth.Decide, []auth.Scope{auth.Support, auth.Decide}, true},
	} {
		if got := tc.scope.Allows(tc.route...); got != tc.want {
			t.Errorf("%s allows %v: %v, want %v", tc.scope, tc.route, got, tc.want)
		}
	}
	if auth.Scope("root").Valid() || !auth.Decide.Valid() {
		t.Error("Valid is wrong")
	}
}

func TestSecretsAreRandomAndOnlyTheirHashIsKept(t *testing.T) {
	s1, h1 := auth.NewSecret()
	s2, _ := auth.NewSecret()
	if s1 == s2 || !strings.HasPrefix(s1, "rlt_") || len(s1) < 40 {
		t.Fatalf("secrets %q %q", s1, s2)
	}
	// The stored form is the hex SHA-256 of the whole secret, which the
	// database's tokens keep: computed here apart from the package.
	sum := sha256.Sum256([]byte(s1))
	if want := hex.EncodeToString(sum[:]); h1 != want || auth.Hash(s1) != want {
		t.Fatalf("hash %q (Hash gives %q), want the hex SHA-256 %q", h1, auth.Hash(s1), want)
	}
}

func TestKeeper(t *testing.T) {
	secret, hash := auth.NewSecret()
	tokens := []auth.Token{{ID: "1", Name: "svc", Scope: auth.Decide, Hash: hash}}
	var fail error
	list := func(context.Context) ([]auth.Token, error) { return tokens, fail }
	k := auth.NewKeeper(list, "boot", slog.New(slog.NewTextHandler(io.Discard, nil)))

	if _, ok := k.Authenticate(secret); ok || k.Loaded() {
		t.Fatal("a token works before the first read")
	}
	if p, ok := k.Authenticate("boot"); !ok || p.Scope != auth.Admin || p.Name != "bootstrap" {
		t.Fatalf("bootstrap: %+v %v", p, ok)
	}
	if err := k.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p, ok := k.Authenticate(secret); !ok || p.Name != "svc" || p.Scope != auth.Decide {
		t.Fatalf("after a read: %+v %v", p, ok)
	}
	// The database fails: the last set stays in force.
	fail = errors.New("down")
	if err := k.Refresh(context.Background()); err == nil {
		t.Fatal("a failed read reported no error")
	}
	if _, ok := k.Authenticate(secret); !ok {
		t.Fatal("a failed read dropped the tokens")
	}
	// A revocation is seen at the next read.
	fail = nil
	tokens[0].RevokedAt = time.Now()
	if err := k.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Authenticate(secret); ok {
		t.Fatal("a revoked token still works")
	}
}

// TestSetRemembersOnlyWhatAuthenticated: a secret that authenticated is
// found again as the same principal, and none that differs from it, by its
// last byte or its length, is taken for it. TestKeeper shows that one
// remembered by a set is refused once a new set revokes it.
func TestSetRemembersOnlyWhatAuthenticated(t *testing.T) {
	secret, hash := auth.NewSecret()
	other, otherHash := auth.NewSecret()
	s := auth.NewSet([]auth.Token{{Name: "svc", Scope: auth.Decide, Hash: hash}, {Name: "ops", Scope: auth.Support, Hash: otherHash}}, "boot")
	for range 3 {
		if p, ok := s.Authenticate(secret); !ok || p.Name != "svc" || p.Scope != auth.Decide {
			t.Fatalf("svc: %+v %v", p, ok)
		}
		if p, ok := s.Authenticate(other); !ok || p.Name != "ops" || p.Scope != auth.Support {
			t.Fatalf("ops: %+v %v", p, ok)
		}
		if p, ok := s.Authenticate("boot"); !ok || p.Name != auth.BootstrapActor {
			t.Fatalf("bootstrap: %+v %v", p, ok)
		}
		last := secret[len(secret)-1] ^ 1
		for _, wrong := range []string{secret[:len(secret)-1] + string(last), secret[:len(secret)-1], secret + "x", ""} {
			if p, ok := s.Authenticate(wrong); ok {
				t.Fatalf("%q authenticated as %+v", wrong, p)
			}
		}
	}
}

// BenchmarkAuthenticate measures a token in use: every request after the
// first carries the same secret.
func BenchmarkAuthenticate(b *testing.B) {
	secret, hash := auth.NewSecret()
	s := auth.NewSet([]auth.Token{{Name: "svc", Scope: auth.Decide, Hash: hash}}, "")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.Authenticate(secret); !ok {
			b.Fatal("refused")
		}
	}
}

// tokens authenticates a fixed set of secrets.
type tokens map[string]auth.Scope

func (t tokens) Authenticate(secret string) (auth.Principal, bool) {
	s, ok := t[secret]
	return auth.Principal{Name: secret, Scope: s}, ok
}

func TestAuthorize(t *testing.T) {
	known := tokens{"rlt_support": auth.Support, "rlt_admin": auth.Admin}
	for _, tc := range []struct {
		header    string
		principal string
		forbidden bool
		detail    string
	}{
		{"Bearer rlt_support", "rlt_support", false, ""},
		{"bearer  rlt_admin ", "rlt_admin", false, ""},
		{"", "", false, "an Authorization: Bearer <token> header is required"},
		{"Basic rlt_support", "", false, "an Authorization: Bearer <token> header is required"},
		{"Bearer   ", "", false, "an Authorization: Bearer <token> header is required"},
		{"Bearer rlt_other", "", false, "the token is unknown or revoked"},
		{"Bearer rlt_support", "", true, `a token of scope "support" may not do this; it needs admin or decide`},
	} {
		scopes := []auth.Scope{auth.Support}
		if tc.forbidden {
			scopes = []auth.Scope{auth.Admin, auth.Decide}
		}
		p, refused := auth.Authorize(known, tc.header, scopes...)
		switch {
		case tc.detail == "" && (refused != nil || p.Name != tc.principal):
			t.Errorf("%q: %+v, %+v", tc.header, p, refused)
		case tc.detail != "" && (refused == nil || refused.Detail != tc.detail || refused.Forbidden != tc.forbidden):
			t.Errorf("%q: refused %+v, want %q", tc.header, refused, tc.detail)
		case refused != nil && !refused.Forbidden && !strings.HasPrefix(refused.Challenge, "Bearer realm="):
			t.Errorf("%q: a 401 without a challenge: %+v", tc.header, refused)
		}
	}
}
