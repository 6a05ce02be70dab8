package api

import (
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/auth"
)

const principalKey = "principal"

// require authenticates the bearer token, checks that its scope is one of
// scopes (admin passes everywhere), and keeps the principal for principal.
func (s *Server) require(scopes ...auth.Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			h := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, secret, ok := strings.Cut(h, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="ratelimitd"`)
				return errorf(errUnauthorized, "an Authorization: Bearer <token> header is required")
			}
			p, ok := s.cfg.Auth.Authenticate(strings.TrimSpace(secret))
			if !ok {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="ratelimitd", error="invalid_token"`)
				return errorf(errUnauthorized, "the token is unknown or revoked")
			}
			if !p.Scope.Allows(scopes...) {
				return errorf(errForbidden, "a token of scope %q may not do this; it needs %s", p.Scope, scopeList(scopes))
			}
			c.Set(principalKey, p)
			return next(c)
		}
	}
}

// principal returns who made the request; require has set it.
func principal(c echo.Context) auth.Principal {
	p, _ := c.Get(principalKey).(auth.Principal)
	return p
}

func scopeList(scopes []auth.Scope) string {
	names := []string{string(auth.Admin)}
	for _, s := range scopes {
		if s != auth.Admin {
			names = append(names, string(s))
		}
	}
	return strings.Join(names, " or ")
}
