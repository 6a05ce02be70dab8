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
	// UpdateOverride calls change with the override as stored, in the
	// transaction that writes what change leaves; an error from change
	// rolls it back.
	UpdateOverride(ctx context.Context, actor, id string, change func(*limiter.Override) error) (limiter.Override, error)
	DeleteOverride(ctx context.Context, actor, id string) error
	OverrideHistory(ctx context.Context, id string) ([]limiter.HistoryEntry, error)
}

// overrideFromBody converts the body of POST /v1/overrides into a domain
// override, adding the field errors it can see without the limit to the
// body's. The bucket id is canonicalised later, under the limit's id
// format (see db.CreateOverride).
func overrideFromBody(b *input.Body, now time.Time) limiter.Override {
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
	params.require(ov.Unlimited, false, &b.Errs)
	ov.Params = params.Params
	if !ov.Unlimited {
		b.Errs.Merge(ov.Params.Validate(true))
	}
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
	return ov
}

// checkLimitName adds an error for field to errs unless name is a limit
// name, in the domain's words.
func checkLimitName(name, field string, errs *input.Errors) {
	if msg := limiter.NameProblem(name); msg != "" {
		errs.Add(field, msg)
	}
}

// givenParams are the GCRA parameters a body gives, and which it gives.
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

// any reports whether any parameter is given.
func (p givenParams) any() bool { return p.burst || p.count || p.period }

// require checks which parameters are given. An unlimited override keeps
// none, so giving one with it is an error rather than silently dropped; a
// limited override needs all three, except in a patch of one that was
// limited before (keep), whose missing parameters keep their values.
func (p givenParams) require(unlimited, keep bool, errs *input.Errors) {
	fields := []struct {
		name  string
		given bool
	}{{"burst", p.burst}, {"count", p.count}, {"period", p.period}}
	for _, f := range fields {
		switch {
		case unlimited && f.given:
			errs.Add(f.name, "must be left out when unlimited is true")
		case !unlimited && !f.given && !keep:
			errs.Add(f.name, "is required unless unlimited is true")
		}
	}
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

// apply changes o, the override as stored, and validates the result. It
// returns every field error at once, the patch's own included, so that the
// transaction rolls back with one 422.
func (p *overridePatch) apply(o *limiter.Override) error {
	// A copy, so that apply leaves the patch as it found it.
	errs := p.errs.Clone()
	wasLimited := !o.Unlimited
	if p.unlimited != nil {
		o.Unlimited = *p.unlimited
	}
	// Ending an unlimited override needs its parameters anew: it kept none.
	p.params.require(o.Unlimited, wasLimited, &errs)
	if p.params.burst {
		o.Burst = p.params.Burst
	}
	if p.params.count {
		o.Count = p.params.Count
	}
	if p.params.period {
		o.Period = p.params.Period
	}
	if o.Unlimited {
		o.Params = limiter.Params{}
	} else {
		errs.Merge(o.Params.Validate(true))
	}
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
// override has no parameters.
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
		period := o.Period.String()
		r.Burst, r.Count, r.Period = &o.Burst, &o.Count, &period
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
// id under the write lock (see db.CreateOverride). A duplicate is the unique
// constraint's 409.
func (s *Server) createOverride(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	o := overrideFromBody(b, s.now())
	if err := b.Shape(); err != nil {
		return err
	}
	if !b.Errs.Empty() {
		// Nothing is written: the limit is read only to report the bucket
		// id's errors together with the others.
		if err := s.canonicalise(c.Request().Context(), &o, &b.Errs); err != nil {
			return err
		}
		return b.Errs.Err()
	}
	o, err = s.cfg.Overrides.CreateOverride(c.Request().Context(), principal(c).Name, o)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/overrides/"+o.ID)
	return writeOverride(c, http.StatusCreated, o)
}

// canonicalise reads the limit of o and canonicalises o's bucket id by its
// id format, adding the field errors to errs. It serves error reports only:
// the write canonicalises again under the lock.
func (s *Server) canonicalise(ctx context.Context, o *limiter.Override, errs *input.Errors) error {
	if errs.Has("limit") || o.Limit == "" {
		return nil
	}
	l, err := s.cfg.Limits.GetLimit(ctx, o.Limit)
	if errors.Is(err, limiter.ErrLimitNotFound) {
		errs.Add("limit", "unknown limit")
		return nil
	}
	if err != nil {
		return err
	}
	errs.Merge(bucketid.NormalizeOverride(o, l))
	return nil
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
	o, err := s.cfg.Overrides.UpdateOverride(c.Request().Context(), principal(c).Name, id, func(o *limiter.Override) error {
		if !match(o.Version) {
			return problem.Errorf(http.StatusPreconditionFailed, "override %q is at version %d, which If-Match does not name", id, o.Version)
		}
		return p.apply(o)
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
