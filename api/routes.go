package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/auth"
)

// routes registers every route of the admin API; openapi.yaml describes
// each one, and a test keeps the two in step. Route middleware runs in
// order: the token first (401, 403), then the body's media type (415), so
// that nobody learns anything about a route they may not use; the edge
// bounds the body (413).
func (s *Server) routes() {
	e := s.echo
	admin := s.require(auth.Admin)
	support := s.require(auth.Support)
	anyScope := s.require(auth.Admin, auth.Support, auth.Decide)
	// Routes that read or write the database get a deadline, so that a
	// database that stops answering costs a 503, not a hung request.
	db := within(dbTimeout)
	json := requireMedia(mediaJSON)
	patch := requireMedia(mediaJSON, mediaMergePatch)
	yaml := requireMedia(mediaYAML, mediaTextYAML, mediaXYAML)

	// Operations: no token, and nothing that names a bucket.
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metrics)
	e.GET("/openapi.yaml", s.openAPI)
	e.GET("/admin", s.adminRedirect)
	e.GET("/admin/*", s.adminFiles)

	// v1 registers a route under /v1. The routes on buckets (check, spend,
	// refund, reset) are package decide's.
	v1 := func(method, path string, h echo.HandlerFunc, mw ...echo.MiddlewareFunc) {
		e.Add(method, "/v1"+path, pathParams(h), mw...)
	}
	v1(http.MethodGet, "/whoami", s.whoami, anyScope)
	v1(http.MethodGet, "/status", s.status, anyScope)

	v1(http.MethodPost, "/tokens", s.createToken, admin, db, json)
	v1(http.MethodGet, "/tokens", s.listTokens, admin, db)
	v1(http.MethodGet, "/tokens/:id", s.getToken, admin, db)
	v1(http.MethodDelete, "/tokens/:id", s.revokeToken, admin, db)

	v1(http.MethodPut, "/limits/:name", s.putLimit, admin, db, json)
	v1(http.MethodGet, "/limits", s.listLimits, anyScope, db)
	v1(http.MethodGet, "/limits/:name", s.getLimit, anyScope, db)
	v1(http.MethodDelete, "/limits/:name", s.deleteLimit, admin, db)

	v1(http.MethodPost, "/overrides", s.createOverride, support, db, json)
	v1(http.MethodGet, "/overrides", s.listOverrides, support, db)
	v1(http.MethodGet, "/overrides/:id", s.getOverride, support, db)
	v1(http.MethodPatch, "/overrides/:id", s.patchOverride, support, db, patch)
	v1(http.MethodDelete, "/overrides/:id", s.deleteOverride, support, db)
	v1(http.MethodGet, "/overrides/:id/history", s.overrideHistory, support, db)

	v1(http.MethodPost, "/rules", s.createRule, admin, db, json)
	v1(http.MethodGet, "/rules", s.listRules, anyScope, db)
	v1(http.MethodPost, "/rules/match", s.matchRule, anyScope, json)
	v1(http.MethodGet, "/rules/:id", s.getRule, anyScope, db)
	v1(http.MethodPatch, "/rules/:id", s.patchRule, admin, db, patch)
	v1(http.MethodDelete, "/rules/:id", s.deleteRule, admin, db)

	v1(http.MethodPost, "/import", s.importFile, admin, within(importTimeout), slowIO, yaml)
	v1(http.MethodGet, "/export", s.exportFile, admin, within(importTimeout), slowIO)
}

// Deadlines of the routes that use the database. Imports and exports move
// up to hundreds of thousands of rows at once.
const (
	dbTimeout     = 5 * time.Second
	importTimeout = 5 * time.Minute
	// syncTimeout bounds the wait of a successful write for the snapshot
	// to hold it: past it, the write is answered anyway and decisions see
	// it when the loader next reads the changes.
	syncTimeout = time.Second
)

// within bounds the request's context to d.
func within(d time.Duration) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx, cancel := context.WithTimeout(c.Request().Context(), d)
			defer cancel()
			c.SetRequest(c.Request().WithContext(ctx))
			return next(c)
		}
	}
}

// slowIO lets a route read its body and write its answer for as long as an
// import may take, past the HTTP server's read and write timeouts, which
// suit every other route: a large import would otherwise be committed
// with its answer cut off.
func slowIO(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		deadline := time.Now().Add(importTimeout + time.Minute)
		rc := http.NewResponseController(c.Response())
		// These fail only on a writer without deadlines (a test's
		// recorder), where there is no timeout to extend.
		_ = rc.SetReadDeadline(deadline)
		_ = rc.SetWriteDeadline(deadline)
		return next(c)
	}
}

// awaitSnapshot is called by every write after it committed and before
// it is answered: it waits until this process's snapshot holds the write, so
// that the client's next decision here sees it (read your writes). Past
// syncTimeout the write is answered anyway, and decisions see it when the
// loader next reads the changes. Other replicas see it when their loader
// does.
func (s *Server) awaitSnapshot(c echo.Context) {
	if s.cfg.Sync == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), syncTimeout)
	defer cancel()
	if err := s.cfg.Sync(ctx); err != nil {
		s.log.Warn("the snapshot does not hold a write yet", "err", err, "request_id", exchange(c).RequestID())
	}
}
