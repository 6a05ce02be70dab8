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

	"github.com/ratelimitd/ratelimitd/limiter"
)

// overrideCreateRequest is the body of POST /v1/overrides.
type overrideCreateRequest struct {
	Limit     *string          `json:"limit" validate:"required"`
	BucketID  *string          `json:"bucket_id" validate:"required"`
	Burst     *int64           `json:"burst" validate:"omitempty,min=0"`
	Count     *int64           `json:"count" validate:"omitempty,min=1"`
	Period    *string          `json:"period"`
	Unlimited *bool            `json:"unlimited"`
	Comment   *string          `json:"comment"`
	Enabled   *bool            `json:"enabled"`
	ExpiresAt Nullable[string] `json:"expires_at"`
}

// override converts the request into a domain override, adding the field
// errors it can see without the limit to fs. The bucket id is canonicalised
// later, by canonicalise, once the limit is known.
func (r *overrideCreateRequest) override(now time.Time, fs *fieldSet) limiter.Override {
	o := limiter.Override{Enabled: true}
	if r.Limit != nil {
		o.Limit = *r.Limit
		checkLimitName(o.Limit, "limit", fs)
	}
	if r.BucketID != nil {
		o.BucketID = *r.BucketID
		if o.BucketID == "" {
			// Without a limit nothing else can be said of the id, but no
			// id format accepts this.
			fs.add("bucket_id", "must not be empty")
		}
	}
	if r.Unlimited != nil {
		o.Unlimited = *r.Unlimited
	}
	params := paramFields{burst: r.Burst, count: r.Count, period: r.Period}
	params.require(o.Unlimited, false, fs)
	o.Params = params.parse(fs)
	if !o.Unlimited {
		fs.merge(o.Params.Validate(true))
	}
	if r.Comment != nil {
		o.Comment = *r.Comment
		checkComment(o.Comment, fs)
	}
	if r.Enabled != nil {
		o.Enabled = *r.Enabled
	}
	if r.ExpiresAt.Set && !r.ExpiresAt.Null {
		o.ExpiresAt = parseExpiry(r.ExpiresAt.Value, now, fs)
	}
	return o
}

// checkLimitName adds an error for field to fs unless name is a limit name.
func checkLimitName(name, field string, fs *fieldSet) {
	switch {
	case name == "":
		fs.add(field, "must not be empty")
	case !limiter.ValidName(name):
		fs.add(field, "is not a limit name: it must match ^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
	}
}

// paramFields are the GCRA parameters as a request gives them.
type paramFields struct {
	burst, count *int64
	period       *string
}

// given reports whether any parameter is given.
func (p paramFields) given() bool { return p.burst != nil || p.count != nil || p.period != nil }

// require checks which parameters are given. An unlimited override keeps
// none, so giving one with it is an error rather than silently dropped; a
// limited override needs all three, except in a patch of one that was
// limited before (keep), whose missing parameters keep their values.
func (p paramFields) require(unlimited, keep bool, fs *fieldSet) {
	fields := []struct {
		name  string
		given bool
	}{{"burst", p.burst != nil}, {"count", p.count != nil}, {"period", p.period != nil}}
	for _, f := range fields {
		switch {
		case unlimited && f.given:
			fs.add(f.name, "must be left out when unlimited is true")
		case !unlimited && !f.given && !keep:
			fs.add(f.name, "is required unless unlimited is true")
		}
	}
}

// parse converts the parameters given; the others are zero.
func (p paramFields) parse(fs *fieldSet) limiter.Params {
	var out limiter.Params
	if p.burst != nil {
		out.Burst = *p.burst
	}
	if p.count != nil {
		out.Count = *p.count
	}
	if p.period != nil {
		out.Period = parsePeriod(*p.period, "period", fs)
	}
	return out
}

// checkComment bounds a comment, as the domain does.
func checkComment(s string, fs *fieldSet) {
	if msg := limiter.TextProblem(s); msg != "" {
		fs.add("comment", msg)
	}
}

// parseExpiry parses an RFC 3339 time that must be after now.
func parseExpiry(s string, now time.Time, fs *fieldSet) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	switch {
	case err != nil:
		fs.add("expires_at", `must be an RFC 3339 time such as "2030-01-02T15:04:05Z"`)
	case !t.After(now):
		fs.add("expires_at", "must be in the future")
	}
	return t.UTC()
}

// overridePatchRequest is the body of PATCH /v1/overrides/{id}: any subset
// of the fields that can change.
type overridePatchRequest struct {
	Burst     *int64           `json:"burst" validate:"omitempty,min=0"`
	Count     *int64           `json:"count" validate:"omitempty,min=1"`
	Period    *string          `json:"period"`
	Unlimited *bool            `json:"unlimited"`
	Comment   *string          `json:"comment"`
	Enabled   *bool            `json:"enabled"`
	ExpiresAt Nullable[string] `json:"expires_at"`
}

// overridePatch is a parsed PATCH: the request, its values converted, and
// the field errors found without the override.
type overridePatch struct {
	req       *overridePatchRequest
	given     paramFields
	params    limiter.Params
	expiresAt time.Time
	errs      fieldSet
}

// patch converts the request, adding to errs what it can check without the
// override.
func (r *overridePatchRequest) patch(now time.Time, errs fieldSet) *overridePatch {
	p := &overridePatch{req: r, given: paramFields{burst: r.Burst, count: r.Count, period: r.Period}, errs: errs}
	if !p.given.given() && r.Unlimited == nil && r.Comment == nil && r.Enabled == nil && !r.ExpiresAt.Set {
		p.errs.add("body", "must change at least one field")
	}
	p.params = p.given.parse(&p.errs)
	if r.Comment != nil {
		checkComment(*r.Comment, &p.errs)
	}
	if r.ExpiresAt.Set && !r.ExpiresAt.Null {
		p.expiresAt = parseExpiry(r.ExpiresAt.Value, now, &p.errs)
	}
	return p
}

// apply changes o, the override as stored, and validates the result. It
// returns every field error at once, the patch's own included, so that the
// transaction rolls back with one 422.
func (p *overridePatch) apply(o *limiter.Override) error {
	// A copy, so that apply leaves the patch as it found it.
	fs := p.errs.clone()
	r := p.req
	wasLimited := !o.Unlimited
	if r.Unlimited != nil {
		o.Unlimited = *r.Unlimited
	}
	// Ending an unlimited override needs its parameters anew: it kept none.
	p.given.require(o.Unlimited, wasLimited, &fs)
	if r.Burst != nil {
		o.Burst = p.params.Burst
	}
	if r.Count != nil {
		o.Count = p.params.Count
	}
	if r.Period != nil {
		o.Period = p.params.Period
	}
	if o.Unlimited {
		o.Params = limiter.Params{}
	} else {
		fs.merge(o.Params.Validate(true))
	}
	if r.Comment != nil {
		o.Comment = *r.Comment
	}
	if r.Enabled != nil {
		o.Enabled = *r.Enabled
	}
	if r.ExpiresAt.Set {
		o.ExpiresAt = p.expiresAt
	}
	return fs.err()
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
	var req overrideCreateRequest
	var fs fieldSet
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	o := req.override(s.now(), &fs)
	ctx := c.Request().Context()
	if !fs.empty() {
		// Nothing is written: the limit is read only to report the bucket
		// id's errors together with the others.
		if err := s.canonicalise(ctx, &o, &fs); err != nil {
			return err
		}
		return fs.err()
	}
	o, err := s.cfg.DB.CreateOverride(ctx, principal(c).Name, o)
	if errors.Is(err, limiter.ErrNotFound) {
		fs.add("limit", "unknown limit")
		return fs.err()
	}
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/overrides/"+o.ID)
	return writeOverride(c, http.StatusCreated, o)
}

// canonicalise reads the limit of o and canonicalises o's bucket id by its
// id format, adding the field errors to fs. It serves error reports only:
// the write canonicalises again under the lock.
func (s *Server) canonicalise(ctx context.Context, o *limiter.Override, fs *fieldSet) error {
	if fs.has("limit") || o.Limit == "" {
		return nil
	}
	l, err := s.cfg.DB.GetLimit(ctx, o.Limit)
	if errors.Is(err, limiter.ErrNotFound) {
		fs.add("limit", "unknown limit")
		return nil
	}
	if err != nil {
		return err
	}
	fs.merge(o.Normalize(l))
	return nil
}

func (s *Server) getOverride(c echo.Context) error {
	o, err := s.cfg.DB.GetOverride(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeOverride(c, http.StatusOK, o)
}

// patchOverride changes an override in one transaction; with If-Match,
// only the version the client has seen.
func (s *Server) patchOverride(c echo.Context) error {
	var req overridePatchRequest
	var fs fieldSet
	match, err := parseIfMatch(c.Request().Header.Values("If-Match"))
	if err != nil {
		fs.add("If-Match", err.Error())
	}
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	p := req.patch(s.now(), fs)
	id := c.Param("id")
	o, err := s.cfg.DB.UpdateOverride(c.Request().Context(), principal(c).Name, id, func(o *limiter.Override) error {
		if match != nil && !match(o.Version) {
			return errorf(limiter.ErrPrecondition, "override %q is at version %d, which If-Match does not name", id, o.Version)
		}
		return p.apply(o)
	})
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return writeOverride(c, http.StatusOK, o)
}

// parseIfMatch parses If-Match field values (RFC 9110, section 13.1.1)
// into a test of a version: nil when there are none. "*" matches every
// version; a weak tag never matches, as If-Match compares strongly, and a
// tag that is not one of ours matches nothing.
func parseIfMatch(values []string) (func(int64) bool, error) {
	if len(values) == 0 {
		return nil, nil
	}
	h := strings.TrimSpace(strings.Join(values, ","))
	if h == "*" {
		return func(int64) bool { return true }, nil
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
	if err := s.cfg.DB.DeleteOverride(c.Request().Context(), principal(c).Name, c.Param("id")); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) overrideHistory(c echo.Context) error {
	entries, err := s.cfg.DB.OverrideHistory(c.Request().Context(), c.Param("id"))
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
	var fs fieldSet
	q := readQuery(c, &fs, "limit", "bucket_id", "enabled", "q", "page_size", "page_token")
	f := limiter.OverrideFilter{
		Limit:     q.str("limit"),
		Enabled:   q.boolean("enabled"),
		Query:     q.str("q"),
		PageSize:  q.integer("page_size", 1, maxPageSize, defaultPageSize),
		PageToken: q.str("page_token"),
	}
	if f.Limit != "" {
		checkLimitName(f.Limit, "limit", &fs)
	}
	if bucket := q.str("bucket_id"); bucket != "" && !fs.has("limit") {
		ids, err := s.bucketFilter(c.Request().Context(), f.Limit, bucket, &fs)
		if err != nil {
			return err
		}
		f.BucketIDs = ids
	} else if f.Limit != "" && !fs.has("limit") {
		if _, err := s.cfg.DB.GetLimit(c.Request().Context(), f.Limit); errors.Is(err, limiter.ErrNotFound) {
			fs.add("limit", "unknown limit")
		} else if err != nil {
			return err
		}
	}
	if err := fs.err(); err != nil {
		return err
	}
	page, next, err := s.cfg.DB.ListOverrides(c.Request().Context(), f)
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
// distinct canonical forms. An id that no format accepts is a field error.
func (s *Server) bucketFilter(ctx context.Context, name, bucket string, fs *fieldSet) ([]string, error) {
	var limits []limiter.Limit
	if name != "" {
		l, err := s.cfg.DB.GetLimit(ctx, name)
		if errors.Is(err, limiter.ErrNotFound) {
			fs.add("limit", "unknown limit")
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		limits = []limiter.Limit{l}
	} else {
		var err error
		if limits, err = s.cfg.DB.ListLimits(ctx); err != nil {
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
		id, err := l.IDFormat.CanonicalOverride(bucket)
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
		fs.add("bucket_id", firstErr.Error())
	default:
		fs.add("bucket_id", "is not a valid bucket id of any limit")
	}
	return ids, nil
}
