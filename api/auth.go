package api

import (
	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
)

const principalKey = "principal"

// require authenticates the bearer token, checks that its scope is one of
// scopes (admin passes everywhere), and keeps the principal for principal.
func (s *Server) require(scopes ...auth.Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p, err := problem.Authorize(s.cfg.Auth, c.Request().Header.Get(echo.HeaderAuthorization), scopes...)
			if err != nil {
				return err
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
