package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/ratelimitd/ratelimitd/api/problem"
)

// readyTimeout bounds the store's answer to a readiness probe: a store
// that slow would fail decisions too.
const readyTimeout = time.Second

type healthResponse struct {
	Status string `json:"status"`
}

// statusResponse is the answer of GET /v1/status.
type statusResponse struct {
	Snapshot    snapshotStatus `json:"snapshot"`
	Store       string         `json:"store"`
	StoreHealth storeHealth    `json:"store_health"`
	Database    string         `json:"database"`
	FailMode    string         `json:"fail_mode"`
}

// storeHealth is whether the bucket store answers now and what it knows of
// its primaries, so that a failover shows where the decisions are kept.
type storeHealth struct {
	Available        bool       `json:"available"`
	Primaries        []string   `json:"primaries"`
	PrimaryChanges   int64      `json:"primary_changes"`
	PrimaryChangedAt *time.Time `json:"primary_changed_at"`
	WaitReplicas     int        `json:"wait_replicas"`
}

type snapshotStatus struct {
	Loaded    bool       `json:"loaded"`
	Version   int64      `json:"version"`
	SyncedAt  *time.Time `json:"synced_at"`
	AgeMS     int64      `json:"age_ms"`
	Limits    int        `json:"limits"`
	Overrides int        `json:"overrides"`
	InStep    bool       `json:"in_step"`
	LeftOut   []leftOut  `json:"left_out"`
}

// leftOut is a stored row the snapshot does not hold.
type leftOut struct {
	Entity string  `json:"entity"`
	ID     string  `json:"id"`
	Limit  *string `json:"limit"`
	Reason string  `json:"reason"`
}

// healthz says the process is up; it checks nothing else, so that an
// orchestrator does not restart a replica for a database outage.
func (s *Server) healthz(c echo.Context) error {
	return writeJSON(c, http.StatusOK, healthResponse{Status: "ok"})
}

// readyz says whether this replica can decide: it has a snapshot of the
// limits, knows the tokens and reaches the store. The database is not
// asked: decisions go on from the snapshot while it is down.
func (s *Server) readyz(c echo.Context) error {
	if err := s.Ready(c.Request().Context()); err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, healthResponse{Status: "ok"})
}

// Ready returns nil when /readyz would answer 200, else the reason, so
// that other front ends (Envoy's gRPC health) agree with it.
func (s *Server) Ready(ctx context.Context) error {
	switch {
	case !s.cfg.Status().Loaded:
		return problem.Errorf(http.StatusServiceUnavailable, "no snapshot of the limits is loaded yet")
	case !s.cfg.Auth.Loaded():
		return problem.Errorf(http.StatusServiceUnavailable, "the tokens have not been read yet")
	}
	pingCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := s.cfg.Limiter.Ping(pingCtx); err != nil {
		if ctx.Err() != nil {
			// The caller went away, or its own deadline passed, before the
			// store answered: that says nothing of the store.
			return fmt.Errorf("readiness: %w", ctx.Err())
		}
		s.log.Warn("readiness: the store does not answer", "err", err)
		return problem.Errorf(http.StatusServiceUnavailable, "the store does not answer")
	}
	return nil
}

// status describes the snapshot in use and what backs the service. It
// pings the store as /readyz does, and then reports its primaries, which
// the ping may have just found.
func (s *Server) status(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
	available := s.cfg.Limiter.Ping(ctx) == nil
	cancel()
	st := s.cfg.Status()
	out := statusResponse{
		Snapshot: snapshotStatus{
			Loaded: st.Loaded, Version: st.Version, Limits: st.Limits, Overrides: st.Overrides,
			InStep: st.Err == nil, LeftOut: []leftOut{},
		},
		Store: s.cfg.StoreName, Database: s.cfg.DatabaseName, FailMode: "closed",
		StoreHealth: storeHealth{Available: available, Primaries: []string{}},
	}
	if s.cfg.StoreTopology != nil {
		topo := s.cfg.StoreTopology()
		h := &out.StoreHealth
		h.Primaries = append(h.Primaries, topo.Primaries...)
		h.PrimaryChanges, h.WaitReplicas = topo.PrimaryChanges, topo.WaitReplicas
		if !topo.PrimaryChangedAt.IsZero() {
			at := topo.PrimaryChangedAt.UTC()
			h.PrimaryChangedAt = &at
		}
	}
	if s.cfg.FailOpen {
		out.FailMode = "open"
	}
	for _, r := range st.LeftOut {
		lo := leftOut{Entity: r.Entity, ID: r.ID, Reason: r.Reason}
		if r.Limit != "" {
			lo.Limit = &r.Limit
		}
		out.Snapshot.LeftOut = append(out.Snapshot.LeftOut, lo)
	}
	if !st.SyncedAt.IsZero() {
		synced := st.SyncedAt.UTC()
		out.Snapshot.SyncedAt = &synced
		out.Snapshot.AgeMS = max(0, s.now().Sub(st.SyncedAt).Milliseconds())
	}
	return writeJSON(c, http.StatusOK, out)
}

// openAPI serves the contract.
func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, mediaYAML, s.cfg.OpenAPI)
}

func (s *Server) adminRedirect(c echo.Context) error {
	return c.Redirect(http.StatusMovedPermanently, "/admin/")
}

// adminCSP keeps the admin page, which handles tokens, from running any
// script but its own files (no inline script an injection could add),
// from being framed, and from posting anywhere else.
const adminCSP = "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; " +
	"base-uri 'none'; frame-ancestors 'none'; form-action 'self'"

// adminFiles serves the admin page's files; the page itself at /admin/.
// Directories are never listed.
func (s *Server) adminFiles(c echo.Context) error {
	h := c.Response().Header()
	h.Set("Content-Security-Policy", adminCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	// The URL of the page stays here.
	h.Set("Referrer-Policy", "no-referrer")
	// Revalidated on every load, so that a deployment's new page is used
	// at once.
	h.Set("Cache-Control", "no-cache")
	name := c.Param("*")
	if name == "" {
		name = "index.html"
	}
	if s.cfg.Web == nil || !fs.ValidPath(name) {
		return echo.ErrNotFound
	}
	info, err := fs.Stat(s.cfg.Web, name)
	if errors.Is(err, fs.ErrNotExist) || err == nil && info.IsDir() {
		return echo.ErrNotFound
	}
	if err != nil {
		return err
	}
	body, err := fs.ReadFile(s.cfg.Web, name)
	if err != nil {
		return err
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = http.DetectContentType(body)
	}
	h.Set(echo.HeaderContentType, ct)
	http.ServeContent(c.Response(), c.Request(), name, info.ModTime(), bytes.NewReader(body))
	return nil
}

// metrics serves the Prometheus text of the service's registry.
func (s *Server) metrics(c echo.Context) error {
	if s.cfg.Metrics == nil {
		return problem.Errorf(http.StatusNotFound, "no metrics are kept")
	}
	s.cfg.Metrics.ServeHTTP(c.Response(), c.Request())
	return nil
}
