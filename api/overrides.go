package api

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

// Overrides is what the override routes read and write.
type Overrides interface {
	CreateOverride(ctx context.Context, actor string, o limiter.Override) (limiter.Override, error)
	GetOverride(ctx context.Context, id string) (limiter.Override, error)
	// ListOverrides returns a page of the overrides f selects and the
	// token of the next page, "" after the last.
	ListOverrides(ctx context.Context, f limiter.OverrideFilter) ([]limiter.Override, string, error)
	// UpdateOverride calls change with the override and its limit as
	// stored, in the transaction that writes what change leaves; an error
	// from change rolls it back.
	UpdateOverride(ctx context.Context, actor, id string, change func(*limiter.Override, limiter.Limit) error) (limiter.Override, error)
	DeleteOverride(ctx context.Context, actor, id string) error
	OverrideHistory(ctx context.Context, id string) ([]limiter.HistoryEntry, error)
}

// overrideFromBody converts the body of POST /v1/overrides into a domain
// override without its parameters, which it returns as given, adding the
// field errors it can see without the limit to the body's. The limit's
// kind tells what the parameters default to (givenParams.resolve); the
// bucket id is canonicalised later, under the limit's id format (see
// db.CreateOverride).
func overrideFromBody(b *input.Body, now time.Time) (limiter.Override, givenParams) {
	o := b.Root()
	o.Require("limit", "bucket_id")
	ov := limiter.Override{Enabled: true}
	if v, ok := o.String("limit"); ok {
		ov.Limit = v
		checkLimitName(v, "limit", &b.Errs)
	}
	if v, ok := o.String("bucket_id"); ok {
		ov.BucketID = v
		if v == "" {
			// Without a limit nothing else can be said of the id, but no
			// id format accepts this.
			b.Errs.Add("bucket_id", "must not be empty")
		}
	}
	ov.Unlimited, _ = o.Bool("unlimited")
	params := readParams(o, &b.Errs)
	if v, ok := o.String("comment"); ok {
		ov.Comment = v
		checkComment(v, &b.Errs)
	}
	if v, ok := o.Bool("enabled"); ok {
		ov.Enabled = v
	}
	if v, ok := readExpiry(o, now, &b.Errs); ok {
		ov.ExpiresAt = v
	}
	return ov, params
}

// checkLimitName adds an error for field to errs unless name is a limit
// name, in the domain's words.
func checkLimitName(name, field string, errs *input.Errors) {
	if msg := limiter.NameProblem(name); msg != "" {
		errs.Add(field, msg)
	}
}

// givenParams are the parameters a body gives, and which it gives.
type givenParams struct {
	limiter.Params
	burst, count, period bool
}

// readParams reads burst, count and period, those given.
func readParams(o input.Object, errs *input.Errors) givenParams {
	var p givenParams
	p.Burst, p.burst = o.Int("burst")
	p.Count, p.count = o.Int("count")
	var period string
	if period, p.period = o.String("period"); p.period {
		p.Period = parsePeriod(period, "period", errs)
	}
	return p
}

// checkSigns adds the errors that parameters have whatever their limit's
// kind, for a body whose limit is unknown: no kind has negative ones.
func (p givenParams) checkSigns(errs *input.Errors) {
	if p.burst && p.Burst < 0 {
		errs.Add("burst", "must be at least 0")
	}
	if p.count && p.Count < 0 {
		errs.Add("count", "must be at least 0")
	}
	if p.period && p.Period < 0 {
		errs.Add("period", "must not be negative")
	}
}

// any reports whether any parameter is given.
func (p givenParams) any() bool { return p.burst || p.count || p.period }

// resolve returns the parameters of an override of limit l: those given,
// the others kept from old (the parameters of a limited override that a
// patch changes; nil otherwise) or, as l's kind says, taken from the
// others: a calendar quota's burst is its count, a concurrency limit's
// count its burst. An unlimited override keeps none, so giving one with it
// is an error rather than silently dropped. It adds the field errors of
// what is missing or given wrongly, and of the result
// (Limit.ParamsProblems, which also refuses a quota's period).
func (p givenParams) resolve(l limiter.Limit, unlimited bool, old *limiter.Params, errs *input.Errors) limiter.Params {
	if unlimited {
		for _, f := range []struct {
			name  string
			given bool
		}{{"burst", p.burst}, {"count", p.count}, {"period", p.period}} {
			if f.given {
				errs.Add(f.name, "must be left out when unlimited is true")
			}
		}
		return limiter.Params{}
	}
	out := p.Params
	if old != nil {
		if !p.burst {
			out.Burst = old.Burst
		}
		if !p.count {
			out.Count = old.Count
		}
		if !p.period {
			out.Period = old.Period
		}
	}
	// Which parameters the override has: given, or taken from another.
	burst, count, period := p.burst, p.count, p.period
	switch {
	case l.Quota():
		if !p.burst {
			out.Burst, burst = out.Count, true
		}
		period = true // must be absent, which ParamsProblems says
	case l.KindOf() == limiter.KindConcurrency:
		if !p.count {
			out.Count, count = out.Burst, true
		}
	}
	if old == nil {
		for _, f := range []struct {
			name  string
			given bool
		}{{"burst", burst}, {"count", count}, {"period", period}} {
			if !f.given {
				errs.Add(f.name, "is required unless unlimited is true")
			}
		}
	}
	errs.Merge(l.ParamsProblems(out, true))
	return out
}

// checkComment bounds a comment by the domain's rule, which nobody checks
// again.
func checkComment(s string, errs *input.Errors) {
	if msg := limiter.TextProblem(s); msg != "" {
		errs.Add("comment", msg)
	}
}

// readExpiry reads expires_at, an RFC 3339 time that must be after now, or
// null for none; ok is false when it is absent or invalid.
func readExpiry(o input.Object, now time.Time, errs *input.Errors) (t time.Time, ok bool) {
	if o.Null("expires_at") {
		return time.Time{}, true
	}
	s, ok := o.String("expires_at")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	switch {
	case err != nil:
		errs.Add("expires_at", `must be an RFC 3339 time such as "2030-01-02T15:04:05Z"`)
	case !t.After(now):
		errs.Add("expires_at", "must be in the future")
	}
	return t.UTC(), true
}

// overridePatch is the body of PATCH /v1/overrides/{id}, any subset of the
// fields that can change, converted, with the field errors found without
// the override.
type overridePatch struct {
	params    givenParams
	unlimited *bool
	comment   *string
	enabled   *bool
	// expires is whether expires_at was given; a zero expiresAt clears it.
	expires   bool
	expiresAt time.Time
	errs      input.Errors
}

// patchFromBody converts the body of a PATCH, with what it can check
// without the override.
func patchFromBody(b *input.Body, now time.Time) *overridePatch {
	o := b.Root()
	p := &overridePatch{params: readParams(o, &b.Errs)}
	if v, ok := o.Bool("unlimited"); ok {
		p.unlimited = &v
	}
	if v, ok := o.String("comment"); ok {
		p.comment = &v
		checkComment(v, &b.Errs)
	}
	if v, ok := o.Bool("enabled"); ok {
		p.enabled = &v
	}
	p.expiresAt, p.expires = readExpiry(o, now, &b.Errs)
	if !p.params.any() && p.unlimited == nil && p.comment == nil && p.enabled == nil && !o.Has("expires_at") {
		b.Errs.Add("body", "must change at least one field")
	}
	p.errs = b.Errs.Clone()
	return p
}

// apply changes o, the override as stored, by the kind of l, its limit as
// stored, and validates the result. It returns every field error at once,
// the patch's own included, so that the transaction rolls back with one
// 422.
func (p *overridePatch) apply(o *limiter.Override, l limiter.Limit) error {
	// A copy, so that apply leaves the patch as it found it.
	errs := p.errs.Clone()
	// Ending an unlimited override needs its parameters anew: it kept none.
	var old *limiter.Params
	if !o.Unlimited {
		prev := o.Params
		old = &prev
	}
	if p.unlimited != nil {
		o.Unlimited = *p.unlimited
	}
	o.Params = p.params.resolve(l, o.Unlimited, old, &errs)
	if p.comment != nil {
		o.Comment = *p.comment
	}
	if p.enabled != nil {
		o.Enabled = *p.enabled
	}
	if p.expires {
		o.ExpiresAt = p.expiresAt
	}
	return errs.Err()
}

// overrideResponse is an override as the API shows it. An unlimited
// override has no parameters, and an override of a calendar quota no
// period.
type overrideResponse struct {
	ID        string     `json:"id"`
	Limit     string     `json:"limit"`
	BucketID  string     `json:"bucket_id"`
	Burst     *int64     `json:"burst"`
	Count     *int64     `json:"count"`
	Period    *string    `json:"period"`
	Unlimited bool       `json:"unlimited"`
	Comment   string     `json:"comment"`
	Enabled   bool       `json:"enabled"`
	ExpiresAt *time.Time `json:"expires_at"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	UpdatedBy string     `json:"updated_by"`
	Version   int64      `json:"version"`
}

// toOverrideResponse converts a stored override.
func toOverrideResponse(o limiter.Override) *overrideResponse {
	r := &overrideResponse{
		ID: o.ID, Limit: o.Limit, BucketID: o.BucketID, Unlimited: o.Unlimited,
		Comment: o.Comment, Enabled: o.Enabled, CreatedAt: o.CreatedAt.UTC(), UpdatedAt: o.UpdatedAt.UTC(),
		UpdatedBy: o.UpdatedBy, Version: o.Version,
	}
	if !o.Unlimited {
		r.Burst, r.Count = &o.Burst, &o.Count
	}
	// A calendar quota's override has no period.
	if !o.Unlimited && o.Period != 0 {
		period := o.Period.String()
		r.Period = &period
	}
	if !o.ExpiresAt.IsZero() {
		t := o.ExpiresAt.UTC()
		r.ExpiresAt = &t
	}
	return r
}

type overrideListResponse struct {
	Overrides     []*overrideResponse `json:"overrides"`
	NextPageToken string              `json:"next_page_token"`
}

type historyEntryResponse struct {
	At     time.Time         `json:"at"`
	Actor  string            `json:"actor"`
	Action string            `json:"action"`
	Before *overrideResponse `json:"before"`
	After  *overrideResponse `json:"after"`
}

type historyResponse struct {
	Entries []historyEntryResponse `json:"entries"`
}

// toHistoryResponse converts the recorded changes of an override.
func toHistoryResponse(entries []limiter.HistoryEntry) historyResponse {
	out := historyResponse{Entries: make([]historyEntryResponse, len(entries))}
	for i, e := range entries {
		h := historyEntryResponse{At: e.At.UTC(), Actor: e.Actor, Action: e.Action}
		if e.Before != nil {
			h.Before = toOverrideResponse(*e.Before)
		}
		if e.After != nil {
			h.After = toOverrideResponse(*e.After)
		}
		out.Entries[i] = h
	}
	return out
}

// etag is the entity tag of an override version.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// writeOverride answers an override with its ETag.
func writeOverride(c echo.Context, status int, o limiter.Override) error {
	c.Response().Header().Set("ETag", etag(o.Version))
	return writeJSON(c, status, toOverrideResponse(o))
}

// createOverride stores an override; the database canonicalises its bucket
// id and checks its parameters under the write lock (see
// db.CreateOverride). A duplicate is the unique constraint's 409.
func (s *Server) createOverride(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	o, params := overrideFromBody(b, s.now())
	if err := b.Shape(); err != nil {
		return err
	}
	ctx := c.Request().Context()
	// The limit is read for the defaults of its kind and to report every
	// error at once; the write reads it again.
	l, ok, err := s.overrideLimit(ctx, o.Limit, &b.Errs)
	if err != nil {
		return err
	}
	if ok {
		o.Params = params.resolve(l, o.Unlimited, nil, &b.Errs)
	} else {
		params.checkSigns(&b.Errs)
	}
	if !b.Errs.Empty() {
		if ok {
			b.Errs.Merge(bucketid.NormalizeOverride(&o, l))
		}
		return b.Errs.Err()
	}
	o, err = s.cfg.Overrides.CreateOverride(ctx, principal(c).Name, o)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/overrides/"+o.ID)
	return writeOverride(c, http.StatusCreated, o)
}

// overrideLimit reads the limit called name for an override, reporting
// false, with an error in errs, when there is none.
func (s *Server) overrideLimit(ctx context.Context, name string, errs *input.Errors) (limiter.Limit, bool, error) {
	if errs.Has("limit") || name == "" {
		return limiter.Limit{}, false, nil
	}
	l, err := s.cfg.Limits.GetLimit(ctx, name)
	if errors.Is(err, limiter.ErrLimitNotFound) {
		errs.Add("limit", "unknown limit")
		return limiter.Limit{}, false, nil
	}
	if err != nil {
		return limiter.Limit{}, false, err
	}
	return l, true, nil
}

func (s *Server) getOverride(c echo.Context) error {
	o, err := s.cfg.Overrides.GetOverride(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeOverride(c, http.StatusOK, o)
}

// patchOverride changes an override in one transaction; with If-Match,
// only the version the client has seen.
func (s *Server) patchOverride(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	match, err := parseIfMatch(c.Request().Header.Values("If-Match"))
	if err != nil {
		// The 422 that names If-Match comes from apply, with the body's
		// field errors.
		b.Errs.Add("If-Match", err.Error())
		match = anyVersion
	}
	p := patchFromBody(b, s.now())
	if err := b.Shape(); err != nil {
		return err
	}
	id := c.Param("id")
	o, err := s.cfg.Overrides.UpdateOverride(c.Request().Context(), principal(c).Name, id, func(o *limiter.Override, l limiter.Limit) error {
		if !match(o.Version) {
			return problem.Errorf(http.StatusPreconditionFailed, "override %q is at version %d, which If-Match does not name", id, o.Version)
		}
		return p.apply(o, l)
	})
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return writeOverride(c, http.StatusOK, o)
}

// anyVersion is the test of a version that passes them all.
func anyVersion(int64) bool { return true }

// parseIfMatch parses If-Match field values (RFC 9110, section 13.1.1)
// into a test of a version, which passes every version when there are
// none, as "*" does; a weak tag never matches, as If-Match compares strongly, and a
// tag that is not one of ours matches nothing.
func parseIfMatch(values []string) (func(int64) bool, error) {
	h := strings.TrimSpace(strings.Join(values, ","))
	if len(values) == 0 || h == "*" {
		return anyVersion, nil
	}
	bad := errors.New(`must be "*" or a list of ETags such as "3"`)
	if h == "" {
		return nil, bad
	}
	var versions []int64
	for h != "" {
		weak := strings.HasPrefix(h, "W/")
		h = strings.TrimPrefix(h, "W/")
		if !strings.HasPrefix(h, `"`) {
			return nil, bad
		}
		end := strings.IndexByte(h[1:], '"')
		if end < 0 {
			return nil, bad
		}
		if v, err := strconv.ParseInt(h[1:1+end], 10, 64); err == nil && !weak {
			versions = append(versions, v)
		}
		h = strings.TrimLeft(h[2+end:], " \t")
		if h != "" {
			if h[0] != ',' {
				return nil, bad
			}
			h = strings.TrimLeft(h[1:], " \t")
			if h == "" {
				return nil, bad
			}
		}
	}
	return func(v int64) bool { return slices.Contains(versions, v) }, nil
}

func (s *Server) deleteOverride(c echo.Context) error {
	if err := s.cfg.Overrides.DeleteOverride(c.Request().Context(), principal(c).Name, c.Param("id")); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) overrideHistory(c echo.Context) error {
	entries, err := s.cfg.Overrides.OverrideHistory(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toHistoryResponse(entries))
}

// The parameters of GET /v1/overrides.
const (
	maxPageSize     = 1000
	defaultPageSize = 50
)

// listOverrides searches overrides. A bucket id is canonicalised first, so
// that any notation finds the override.
func (s *Server) listOverrides(c echo.Context) error {
	var errs input.Errors
	q := readQuery(c, &errs, "limit", "bucket_id", "enabled", "q", "page_size", "page_token")
	f := limiter.OverrideFilter{
		Limit:     q.str("limit"),
		Enabled:   q.boolean("enabled"),
		Query:     q.str("q"),
		PageSize:  q.integer("page_size", 1, maxPageSize, defaultPageSize),
		PageToken: q.str("page_token"),
	}
	if f.Limit != "" {
		checkLimitName(f.Limit, "limit", &errs)
	}
	if bucket := q.str("bucket_id"); bucket != "" && !errs.Has("limit") {
		ids, err := s.bucketFilter(c.Request().Context(), f.Limit, bucket, &errs)
		if errors.Is(err, limiter.ErrLimitNotFound) {
			errs.Add("limit", "unknown limit")
		} else if err != nil {
			return err
		}
		f.BucketIDs = ids
	} else if f.Limit != "" && !errs.Has("limit") {
		if _, err := s.cfg.Limits.GetLimit(c.Request().Context(), f.Limit); errors.Is(err, limiter.ErrLimitNotFound) {
			errs.Add("limit", "unknown limit")
		} else if err != nil {
			return err
		}
	}
	if err := errs.Err(); err != nil {
		return err
	}
	page, next, err := s.cfg.Overrides.ListOverrides(c.Request().Context(), f)
	if err != nil {
		return err
	}
	out := overrideListResponse{Overrides: make([]*overrideResponse, len(page)), NextPageToken: next}
	for i, o := range page {
		out.Overrides[i] = toOverrideResponse(o)
	}
	return writeJSON(c, http.StatusOK, out)
}

// bucketFilter canonicalises a bucket id by the id format of the limit
// called name, or, without a name, by every limit's format, and returns the
// distinct canonical forms. An id that no format accepts is a field error;
// a limit that does not exist is limiter.ErrLimitNotFound.
func (s *Server) bucketFilter(ctx context.Context, name, bucket string, errs *input.Errors) ([]string, error) {
	var limits []limiter.Limit
	if name != "" {
		l, err := s.cfg.Limits.GetLimit(ctx, name)
		if err != nil {
			return nil, err
		}
		limits = []limiter.Limit{l}
	} else {
		var err error
		if limits, err = s.cfg.Limits.ListLimits(ctx); err != nil {
			return nil, err
		}
	}
	var ids []string
	var firstErr error
	seen := map[limiter.IDFormat]bool{}
	for _, l := range limits {
		if seen[l.IDFormat] {
			continue
		}
		seen[l.IDFormat] = true
		id, err := bucketid.CanonicalOverride(l.IDFormat, bucket)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) > 0:
	case name != "" && firstErr != nil:
		errs.Add("bucket_id", firstErr.Error())
	default:
		errs.Add("bucket_id", "is not a valid bucket id of any limit")
	}
	return ids, nil
}
