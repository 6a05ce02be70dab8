package api

import (
	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/auth"
)

const principalKey = "principal"

// require authenticates the bearer token, checks that its scope is one of
// scopes (admin passes everywhere), and keeps the principal for principal.
func (s *Server) require(scopes ...auth.Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p, refused := auth.Authorize(s.cfg.Auth, c.Request().Header.Get(echo.HeaderAuthorization), scopes...)
			switch {
			case refused == nil:
				c.Set(principalKey, p)
				return next(c)
			case refused.Forbidden:
				return errorf(errForbidden, "%s", refused.Detail)
			}
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, refused.Challenge)
			return errorf(errUnauthorized, "%s", refused.Detail)
		}
	}
}

// principal returns who made the request; require has set it.
func principal(c echo.Context) auth.Principal {
	p, _ := c.Get(principalKey).(auth.Principal)
	return p
}
