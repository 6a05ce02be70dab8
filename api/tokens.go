package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/auth"
)

// Tokens is what the token routes read and write. Requests are
// authenticated by an Authenticator, which never asks the database.
type Tokens interface {
	CreateToken(ctx context.Context, actor string, t auth.Token) (auth.Token, error)
	GetToken(ctx context.Context, id string) (auth.Token, error)
	ListTokens(ctx context.Context) ([]auth.Token, error)
	RevokeToken(ctx context.Context, actor, id string) error
}

// tokenFromBody converts the body of POST /v1/tokens into a token to
// store, adding its field errors to the body's.
func tokenFromBody(b *input.Body) auth.Token {
	o := b.Root()
	o.Require("name", "scope")
	var t auth.Token
	if v, ok := o.String("name"); ok {
		t.Name = v
		if msg := auth.NameProblem(v); msg != "" {
			b.Errs.Add("name", msg)
		}
	}
	if v, ok := o.String("scope"); ok {
		t.Scope = auth.Scope(v)
		if !t.Scope.Valid() {
			b.Errs.Add("scope", "must be one of admin, support, decide")
		}
	}
	return t
}

// tokenResponse is a token as listed: never its secret or hash.
type tokenResponse struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Scope     auth.Scope `json:"scope"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// toTokenResponse converts a stored token for a listing.
func toTokenResponse(t auth.Token) tokenResponse {
	r := tokenResponse{ID: t.ID, Name: t.Name, Scope: t.Scope, CreatedAt: t.CreatedAt.UTC()}
	if !t.RevokedAt.IsZero() {
		revoked := t.RevokedAt.UTC()
		r.RevokedAt = &revoked
	}
	return r
}

// tokenCreatedResponse is a new token with its secret, shown this once.
type tokenCreatedResponse struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Scope     auth.Scope `json:"scope"`
	CreatedAt time.Time  `json:"created_at"`
	Token     string     `json:"token"`
}

type tokenListResponse struct {
	Tokens []tokenResponse `json:"tokens"`
}

type principalResponse struct {
	Name  string     `json:"name"`
	Scope auth.Scope `json:"scope"`
}

// createToken stores a new token's hash and answers its secret once.
func (s *Server) createToken(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	t := tokenFromBody(b)
	if err := b.Err(); err != nil {
		return err
	}
	secret, hash := auth.NewSecret()
	t.Hash = hash
	ctx := c.Request().Context()
	t, err = s.cfg.Tokens.CreateToken(ctx, principal(c).Name, t)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/tokens/"+t.ID)
	return writeJSON(c, http.StatusCreated, tokenCreatedResponse{
		ID: t.ID, Name: t.Name, Scope: t.Scope, CreatedAt: t.CreatedAt.UTC(), Token: secret,
	})
}

func (s *Server) listTokens(c echo.Context) error {
	tokens, err := s.cfg.Tokens.ListTokens(c.Request().Context())
	if err != nil {
		return err
	}
	out := tokenListResponse{Tokens: make([]tokenResponse, len(tokens))}
	for i, t := range tokens {
		out.Tokens[i] = toTokenResponse(t)
	}
	return writeJSON(c, http.StatusOK, out)
}

// getToken answers a token as listed, where a creation's Location points.
func (s *Server) getToken(c echo.Context) error {
	t, err := s.cfg.Tokens.GetToken(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toTokenResponse(t))
}

func (s *Server) revokeToken(c echo.Context) error {
	if err := s.cfg.Tokens.RevokeToken(c.Request().Context(), principal(c).Name, c.Param("id")); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) whoami(c echo.Context) error {
	p := principal(c)
	return writeJSON(c, http.StatusOK, principalResponse{Name: p.Name, Scope: p.Scope})
}
