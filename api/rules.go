package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// descriptorEntryBody is an entry of a rule's descriptor as the API writes
// it: no value for an entry that matches any value.
type descriptorEntryBody struct {
	Key   *string `json:"key" validate:"required"`
	Value *string `json:"value,omitempty"`
}

// ruleCreateRequest is the body of POST /v1/rules.
type ruleCreateRequest struct {
	Domain     *string               `json:"domain" validate:"required"`
	Descriptor []descriptorEntryBody `json:"descriptor" validate:"required"`
	Limit      *string               `json:"limit" validate:"required"`
}

// rule converts the request, adding every field error the rule shows on
// its own to fs; the limit is checked by the database.
func (r *ruleCreateRequest) rule(fs *fieldSet) limiter.Rule {
	var out limiter.Rule
	if r.Domain != nil {
		out.Domain = *r.Domain
	}
	if r.Limit != nil {
		out.Limit = *r.Limit
		checkLimitName(out.Limit, "limit", fs)
	}
	out.Descriptor = descriptorOf(r.Descriptor, fs)
	if r.Descriptor != nil || r.Domain != nil {
		fs.merge(out.Validate())
	}
	return out
}

// descriptorOf converts the entries of a body; an empty value given is an
// error, as leaving it out is how an entry matches any value.
func descriptorOf(body []descriptorEntryBody, fs *fieldSet) []limiter.DescriptorEntry {
	var out []limiter.DescriptorEntry
	for i, e := range body {
		var entry limiter.DescriptorEntry
		if e.Key != nil {
			entry.Key = *e.Key
		}
		if e.Value != nil {
			entry.Value = *e.Value
			if entry.Value == "" {
				fs.add("descriptor["+strconv.Itoa(i)+"].value", "must not be empty; leave it out to match any value")
			}
		}
		out = append(out, entry)
	}
	return out
}

// rulePatchRequest is the body of PATCH /v1/rules/{id}: a rule's pattern
// is what identifies it, so only its limit changes.
type rulePatchRequest struct {
	Limit *string `json:"limit" validate:"required"`
}

// ruleResponse is a rule as the API shows it.
type ruleResponse struct {
	ID         string                `json:"id"`
	Domain     string                `json:"domain"`
	Descriptor []descriptorEntryBody `json:"descriptor"`
	Limit      string                `json:"limit"`
	CreatedAt  time.Time             `json:"created_at"`
	UpdatedAt  time.Time             `json:"updated_at"`
}

func toRuleResponse(r limiter.Rule) ruleResponse {
	out := ruleResponse{ID: r.ID, Domain: r.Domain, Limit: r.Limit, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
		Descriptor: make([]descriptorEntryBody, len(r.Descriptor))}
	for i, e := range r.Descriptor {
		out.Descriptor[i].Key = &e.Key
		if e.Value != "" {
			out.Descriptor[i].Value = &e.Value
		}
	}
	return out
}

type ruleListResponse struct {
	Rules []ruleResponse `json:"rules"`
}

// createRule stores a rule; the same domain and pattern twice is the
// unique constraint's 409, an unknown or unsuitable limit a 422.
func (s *Server) createRule(c echo.Context) error {
	var req ruleCreateRequest
	var fs fieldSet
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	r := req.rule(&fs)
	if err := fs.err(); err != nil {
		return err
	}
	r, err := s.cfg.DB.CreateRule(c.Request().Context(), principal(c).Name, r)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/rules/"+r.ID)
	return writeJSON(c, http.StatusCreated, toRuleResponse(r))
}

func (s *Server) listRules(c echo.Context) error {
	var fs fieldSet
	q := readQuery(c, &fs, "domain")
	if err := fs.err(); err != nil {
		return err
	}
	rules, err := s.cfg.DB.ListRules(c.Request().Context(), q.str("domain"))
	if err != nil {
		return err
	}
	out := ruleListResponse{Rules: make([]ruleResponse, len(rules))}
	for i, r := range rules {
		out.Rules[i] = toRuleResponse(r)
	}
	return writeJSON(c, http.StatusOK, out)
}

func (s *Server) getRule(c echo.Context) error {
	r, err := s.cfg.DB.GetRule(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toRuleResponse(r))
}

func (s *Server) patchRule(c echo.Context) error {
	var req rulePatchRequest
	var fs fieldSet
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	if req.Limit != nil {
		checkLimitName(*req.Limit, "limit", &fs)
	}
	if err := fs.err(); err != nil {
		return err
	}
	r, err := s.cfg.DB.SetRuleLimit(c.Request().Context(), principal(c).Name, c.Param("id"), *req.Limit)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return writeJSON(c, http.StatusOK, toRuleResponse(r))
}

func (s *Server) deleteRule(c echo.Context) error {
	if err := s.cfg.DB.DeleteRule(c.Request().Context(), principal(c).Name, c.Param("id")); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
}

// ruleMatchRequest is the body of POST /v1/rules/match: a request
// descriptor as Envoy would send it.
type ruleMatchRequest struct {
	Domain     *string               `json:"domain" validate:"required"`
	Descriptor []descriptorEntryBody `json:"descriptor" validate:"required"`
}

// ruleMatchResponse says which rule a descriptor matches and the bucket it
// spends, canonical.
type ruleMatchResponse struct {
	Rule     ruleResponse `json:"rule"`
	Limit    string       `json:"limit"`
	BucketID string       `json:"bucket_id"`
}

// matchRule answers what Envoy's ShouldRateLimit would do with one
// descriptor, from the snapshot decisions use, so that people can look up
// the bucket of a proxy's request: 404 when no rule matches.
func (s *Server) matchRule(c echo.Context) error {
	var req ruleMatchRequest
	var fs fieldSet
	if err := s.bind(c, &req, &fs); err != nil {
		return err
	}
	var domain string
	if req.Domain != nil {
		domain = *req.Domain
	}
	entries := descriptorOf(req.Descriptor, &fs)
	if req.Domain != nil || req.Descriptor != nil {
		fs.merge(limiter.ValidateDescriptor(domain, entries))
	}
	if err := fs.err(); err != nil {
		return err
	}
	snap := s.cfg.Limiter.Snapshot()
	if snap == nil {
		return limiter.ErrNoSnapshot
	}
	rule, ok := snap.Match(domain, entries)
	if !ok {
		return errorf(limiter.ErrNotFound, "no rule of domain %q matches the descriptor", domain)
	}
	res, err := snap.Resolve(rule.Limit, rule.BucketID(entries), s.now())
	if err != nil {
		fs.add("descriptor", "its values are no bucket id of limit "+strconv.Quote(rule.Limit)+": "+err.Error())
		return fs.err()
	}
	return writeJSON(c, http.StatusOK, ruleMatchResponse{Rule: toRuleResponse(rule), Limit: rule.Limit, BucketID: res.BucketID})
}
