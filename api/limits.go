package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Limits is what the limit routes read and write, and the override routes
// look limits up in.
type Limits interface {
	// PutLimit creates or replaces a limit, and reports whether it created.
	PutLimit(ctx context.Context, actor string, l limiter.Limit) (limiter.Limit, bool, error)
	GetLimit(ctx context.Context, name string) (limiter.Limit, error)
	ListLimits(ctx context.Context) ([]limiter.Limit, error)
	// OverrideCounts returns the number of overrides of each limit that
	// has any.
	OverrideCounts(ctx context.Context) (map[string]int, error)
	DeleteLimit(ctx context.Context, actor, name string) error
}

// limitFromBody converts the body of PUT /v1/limits/{name}, for the limit
// called name (from the path), into a domain limit, adding every field
// error to the body's. A PUT replaces the limit, so a missing description,
// unit, shadow or kind means "", requests, false and rate. What else is
// required depends on the sort of limit: a rate limit needs burst, count
// and period; a calendar quota count (its burst is its count, its time
// zone UTC unless given, and it has no period); a concurrency limit burst
// and period (its count is its burst).
func limitFromBody(b *input.Body, name string) limiter.Limit {
	o := b.Root()
	l := limiter.Limit{Name: name, Kind: limiter.KindRate}
	// The name may repeat the path's; it is never a rename.
	if v, ok := o.String("name"); ok && v != name {
		b.Errs.Add("name", "must be the name in the path, or left out; a limit cannot be renamed")
	}
	if v, ok := o.Int("enum"); ok {
		// 0 is the domain's "not chosen yet", which a client leaves out.
		if v < 1 || v > limiter.MaxEnum {
			b.Errs.Add("enum", "must be between 1 and "+strconv.Itoa(limiter.MaxEnum))
		}
		l.Enum = int(v)
	}
	if v, ok := o.String("id_format"); ok {
		l.IDFormat = limiter.IDFormat(v)
	}
	if v, ok := o.String("kind"); ok {
		// Validate reads an empty kind as the default; given, it is wrong.
		if v == "" {
			b.Errs.Add("kind", "must be rate or concurrency; leave it out for rate")
		}
		l.Kind = limiter.Kind(v)
	}
	calendar, calendared := o.String("calendar")
	zone, zoned := o.String("time_zone")
	quota := calendared && l.Kind != limiter.KindConcurrency
	switch {
	case calendared && !quota:
		b.Errs.Add("calendar", "a concurrency limit cannot be a calendar quota")
	case quota && calendar == "":
		b.Errs.Add("calendar", "must be hour, day, week, month or year; leave it out for a limit that is no quota")
	case quota:
		l.Calendar, l.TimeZone = limiter.Calendar(calendar), "UTC"
		if zoned {
			l.TimeZone = zone
		}
	case zoned:
		b.Errs.Add("time_zone", "only a calendar quota has a time zone: give calendar too, or leave time_zone out")
	}
	switch {
	case quota:
		o.Require("id_format", "count")
	case l.Kind == limiter.KindConcurrency:
		o.Require("id_format", "burst", "period")
	default:
		o.Require("id_format", "burst", "count", "period")
	}
	var burst, count bool
	l.Burst, burst = o.Int("burst")
	l.Count, count = o.Int("count")
	if v, ok := o.String("period"); ok {
		l.Period = parsePeriod(v, "period", &b.Errs)
	}
	switch {
	case quota && !burst:
		l.Burst = l.Count
	case l.Kind == limiter.KindConcurrency && !count:
		l.Count = l.Burst
	}
	l.Description, _ = o.String("description")
	if v, ok := o.String("unit"); ok {
		if v == "" {
			b.Errs.Add("unit", "must not be empty; leave it out to count requests")
		}
		l.Unit = v
	}
	l.Shadow, _ = o.Bool("shadow")
	b.Errs.Merge(l.Validate())
	return l
}

// parsePeriod parses a Go duration, adding an error for field to errs
// when it does not parse. Its range is the domain's to check.
func parsePeriod(s, field string, errs *input.Errors) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		errs.Add(field, `must be a Go duration such as "1s", "180m" or "168h"`)
	}
	return d
}

// limitResponse is a limit as the API shows it. A calendar quota has no
// period; any other limit no calendar and no time zone.
type limitResponse struct {
	Name          string           `json:"name"`
	Enum          int              `json:"enum"`
	IDFormat      limiter.IDFormat `json:"id_format"`
	Kind          limiter.Kind     `json:"kind"`
	Calendar      *string          `json:"calendar"`
	TimeZone      *string          `json:"time_zone"`
	Burst         int64            `json:"burst"`
	Count         int64            `json:"count"`
	Period        *string          `json:"period"`
	Description   string           `json:"description"`
	Unit          string           `json:"unit"`
	Shadow        bool             `json:"shadow"`
	CreatedAt     time.Time        `json:"created_at"`
	UpdatedAt     time.Time        `json:"updated_at"`
	OverrideCount int              `json:"override_count"`
}

// toLimitResponse converts a stored limit and the number of its overrides.
func toLimitResponse(l limiter.Limit, overrides int) limitResponse {
	r := limitResponse{
		Name: l.Name, Enum: l.Enum, IDFormat: l.IDFormat, Kind: l.KindOf(),
		Burst: l.Burst, Count: l.Count,
		Description: l.Description, Unit: l.Counts(), Shadow: l.Shadow,
		CreatedAt: l.CreatedAt.UTC(), UpdatedAt: l.UpdatedAt.UTC(), OverrideCount: overrides,
	}
	if l.Quota() {
		calendar, zone := string(l.Calendar), l.TimeZone
		r.Calendar, r.TimeZone = &calendar, &zone
	} else {
		period := l.Period.String()
		r.Period = &period
	}
	return r
}

type limitListResponse struct {
	Limits []limitResponse `json:"limits"`
}

// putLimit creates (201) or replaces (200) a limit. PUT is idempotent, so
// a client that lost the answer may simply send it again.
func (s *Server) putLimit(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	l := limitFromBody(b, c.Param("name"))
	if err := b.Err(); err != nil {
		return err
	}
	ctx := c.Request().Context()
	l, created, err := s.cfg.Limits.PutLimit(ctx, principal(c).Name, l)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	if created {
		c.Response().Header().Set(echo.HeaderLocation, "/v1/limits/"+l.Name)
		return writeJSON(c, http.StatusCreated, toLimitResponse(l, 0))
	}
	// Read after the write, in a second transaction: the count may be
	// off by the overrides created in between, which is what any later
	// read would show too. Should this read fail, the limit is written
	// and a retry of the PUT answers 200 with the same result.
	counts, err := s.cfg.Limits.OverrideCounts(ctx)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toLimitResponse(l, counts[l.Name]))
}

func (s *Server) listLimits(c echo.Context) error {
	ctx := c.Request().Context()
	limits, err := s.cfg.Limits.ListLimits(ctx)
	if err != nil {
		return err
	}
	counts, err := s.cfg.Limits.OverrideCounts(ctx)
	if err != nil {
		return err
	}
	out := limitListResponse{Limits: make([]limitResponse, len(limits))}
	for i, l := range limits {
		out.Limits[i] = toLimitResponse(l, counts[l.Name])
	}
	return writeJSON(c, http.StatusOK, out)
}

// limitNameParam returns the limit name of the path, or a 422 naming
// `name` when it is not one: no limit can have that name, since PUT
// refuses it alike, and saying why helps a client more than a 404.
func limitNameParam(c echo.Context) (string, error) {
	name := c.Param("name")
	var errs input.Errors
	checkLimitName(name, "name", &errs)
	return name, errs.Err()
}

func (s *Server) getLimit(c echo.Context) error {
	name, err := limitNameParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	l, err := s.cfg.Limits.GetLimit(ctx, name)
	if err != nil {
		return err
	}
	counts, err := s.cfg.Limits.OverrideCounts(ctx)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toLimitResponse(l, counts[l.Name]))
}

func (s *Server) deleteLimit(c echo.Context) error {
	name, err := limitNameParam(c)
	if err != nil {
		return err
	}
	if err := s.cfg.Limits.DeleteLimit(c.Request().Context(), principal(c).Name, name); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
}
