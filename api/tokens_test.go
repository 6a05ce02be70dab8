package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
)

func TestTokens(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			res := e.do("POST", "/v1/tokens", e.admin, obj{"name": "support desk", "scope": "support"}).expect(t, http.StatusCreated)
			created := res.object(t)
			secret, _ := created["token"].(string)
			id, _ := created["id"].(string)
			if secret == "" || id == "" || created["name"] != "support desk" || created["scope"] != "support" {
				t.Fatalf("created %v", created)
			}
			if loc := res.header.Get("Location"); loc != "/v1/tokens/"+id {
				t.Errorf("Location %q", loc)
			}
			// The new token works at once, in this process.
			who := e.do("GET", "/v1/whoami", secret, nil).expect(t, http.StatusOK).object(t)
			if who["name"] != "support desk" || who["scope"] != "support" {
				t.Errorf("whoami %v", who)
			}
			boot := e.do("GET", "/v1/whoami", e.admin, nil).expect(t, http.StatusOK).object(t)
			if boot["name"] != "bootstrap" || boot["scope"] != "admin" {
				t.Errorf("whoami of the bootstrap token %v", boot)
			}

			list := e.do("GET", "/v1/tokens", e.admin, nil).expect(t, http.StatusOK)
			var tokens struct {
				Tokens []map[string]any `json:"tokens"`
			}
			list.json(t, &tokens)
			if len(tokens.Tokens) != 1 || tokens.Tokens[0]["id"] != id || tokens.Tokens[0]["revoked_at"] != nil {
				t.Fatalf("tokens %s", list.body)
			}
			if _, ok := tokens.Tokens[0]["token"]; ok {
				t.Error("a listing shows a secret")
			}
			for _, s := range []string{secret, auth.Hash(secret)} {
				if contains(list.body, s) {
					t.Error("a listing shows the secret or its hash")
				}
			}

			// A token may not manage tokens unless it is admin.
			e.do("POST", "/v1/tokens", secret, obj{"name": "x", "scope": "admin"}).expect(t, http.StatusForbidden)

			e.do("DELETE", "/v1/tokens/"+id, e.admin, nil).expect(t, http.StatusNoContent)
			e.do("GET", "/v1/whoami", secret, nil).expect(t, http.StatusUnauthorized)
			e.do("DELETE", "/v1/tokens/"+id, e.admin, nil).expect(t, http.StatusNotFound)
			e.do("DELETE", "/v1/tokens/nosuchtoken", e.admin, nil).expect(t, http.StatusNotFound)

			list = e.do("GET", "/v1/tokens", e.admin, nil).expect(t, http.StatusOK)
			list.json(t, &tokens)
			revoked, _ := tokens.Tokens[0]["revoked_at"].(string)
			if _, err := time.Parse(time.RFC3339, revoked); err != nil {
				t.Errorf("revoked_at %q: %v", revoked, err)
			}
		})
	}
}

// TestTokenRevokedElsewhere shows that a token revoked by another replica
// (straight in the database here) stops working within a second.
func TestTokenRevokedElsewhere(t *testing.T) {
	e := newEnv(t)
	secret := e.token("elsewhere", auth.Decide)
	tokens, err := e.db.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.db.RevokeToken(t.Context(), "test", tokens[0].ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for e.do("GET", "/v1/whoami", secret, nil).status != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("the revoked token still works after a second")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
