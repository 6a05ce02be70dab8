package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Rules is what the rule routes read and write.
type Rules interface {
	CreateRule(ctx context.Context, actor string, r limiter.Rule) (limiter.Rule, error)
	GetRule(ctx context.Context, id string) (limiter.Rule, error)
	// ListRules returns the rules of domain, of every domain when it is "".
	ListRules(ctx context.Context, domain string) ([]limiter.Rule, error)
	SetRuleLimit(ctx context.Context, actor, id, limit string) (limiter.Rule, error)
	DeleteRule(ctx context.Context, actor, id string) error
}

// descriptorEntryBody is an entry of a rule's descriptor as the API writes
// it: no value for an entry that matches any value.
type descriptorEntryBody struct {
	Key    string  `json:"key"`
	Value  *string `json:"value,omitempty"`
	Shared bool    `json:"shared,omitempty"`
}

// ruleFromBody converts the body of POST /v1/rules, adding every field
// error the rule shows on its own to the body's; whether the limit exists
// and suits the rule is the database's to check.
func ruleFromBody(b *input.Body) limiter.Rule {
	o := b.Root()
	o.Require("domain", "descriptor", "limit")
	var r limiter.Rule
	r.Domain, r.Descriptor = readDescriptor(o, &b.Errs)
	r.Limit, _ = o.String("limit")
	// As envoyproxy/ratelimit writes it: a list of {name}.
	n, _ := o.Objects("replaces", rules.MaxReplaces, func(i int, e input.Object) {
		e.Require("name")
		name, _ := e.String("name")
		r.Replaces = append(r.Replaces, name)
	})
	// The names beyond the most were not read.
	if n > rules.MaxReplaces {
		b.Errs.Add("replaces", "must hold at most "+strconv.Itoa(rules.MaxReplaces)+" limit names")
	}
	r.QuotaMode, _ = o.Bool("quota_mode")
	b.Errs.Merge(rules.Validate(r))
	return r
}

// readDescriptor reads a domain and its descriptor's entries. An empty
// value given is an error, as leaving it out is how an entry matches any
// value.
func readDescriptor(o input.Object, errs *input.Errors) (string, []limiter.DescriptorEntry) {
	domain, _ := o.String("domain")
	var entries []limiter.DescriptorEntry
	n, _ := o.Objects("descriptor", rules.MaxDescriptorEntries, func(i int, e input.Object) {
		e.Require("key")
		var entry limiter.DescriptorEntry
		entry.Key, _ = e.String("key")
		if v, ok := e.String("value"); ok {
			entry.Value = v
			if v == "" {
				errs.Add(input.Join(e.Path(), "value"), "must not be empty; leave it out to match any value")
			}
		}
		entry.Shared, _ = e.Bool("shared")
		entries = append(entries, entry)
	})
	// The entries beyond the most were not read; the domain sees the rest.
	if n > rules.MaxDescriptorEntries {
		errs.Add("descriptor", rules.DescriptorSizeProblem(n))
	}
	return domain, entries
}

// replacedBody names a limit a rule replaces.
type replacedBody struct {
	Name string `json:"name"`
}

// ruleResponse is a rule as the API shows it.
type ruleResponse struct {
	ID         string                `json:"id"`
	Domain     string                `json:"domain"`
	Descriptor []descriptorEntryBody `json:"descriptor"`
	Limit      string                `json:"limit"`
	Replaces   []replacedBody        `json:"replaces"`
	QuotaMode  bool                  `json:"quota_mode"`
	CreatedAt  time.Time             `json:"created_at"`
	UpdatedAt  time.Time             `json:"updated_at"`
}

func toRuleResponse(r limiter.Rule) ruleResponse {
	out := ruleResponse{ID: r.ID, Domain: r.Domain, Limit: r.Limit, QuotaMode: r.QuotaMode,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
		Descriptor: make([]descriptorEntryBody, len(r.Descriptor)), Replaces: make([]replacedBody, len(r.Replaces))}
	for i, name := range r.Replaces {
		out.Replaces[i].Name = name
	}
	for i, e := range r.Descriptor {
		out.Descriptor[i].Key = e.Key
		if e.Value != "" {
			out.Descriptor[i].Value = &e.Value
		}
		out.Descriptor[i].Shared = e.Shared
	}
	return out
}

type ruleListResponse struct {
	Rules []ruleResponse `json:"rules"`
}

// createRule stores a rule; the same domain and pattern twice is the
// unique constraint's 409, an unknown or unsuitable limit a 422.
func (s *Server) createRule(c echo.Context) error {
	b, err := readObject(c)
	if err != nil {
		return err
	}
	r := ruleFromBody(b)
	if err := b.Err(); err != nil {
		return err
	}
	r, err = s.cfg.Rules.CreateRule(c.Request().Context(), principal(c).Name, r)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	c.Response().Header().Set(echo.HeaderLocation, "/v1/rules/"+r.ID)
	return writeJSON(c, http.StatusCreated, toRuleResponse(r))
}

func (s *Server) listRules(c echo.Context) error {
	var errs input.Errors
	q := readQuery(c, &errs, "domain")
	if err := errs.Err(); err != nil {
		return err
	}
	rules, err := s.cfg.Rules.ListRules(c.Request().Context(), q.str("domain"))
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
	r, err := s.cfg.Rules.GetRule(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toRuleResponse(r))
}

func (s *Server) patchRule(c echo.Context) error {
	// A rule's pattern is what identifies it, so only its limit changes.
	b, err := readObject(c)
	if err != nil {
		return err
	}
	o := b.Root()
	o.Require("limit")
	limit, ok := o.String("limit")
	if ok {
		checkLimitName(limit, "limit", &b.Errs)
	}
	if err := b.Err(); err != nil {
		return err
	}
	r, err := s.cfg.Rules.SetRuleLimit(c.Request().Context(), principal(c).Name, c.Param("id"), limit)
	if err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return writeJSON(c, http.StatusOK, toRuleResponse(r))
}

func (s *Server) deleteRule(c echo.Context) error {
	if err := s.cfg.Rules.DeleteRule(c.Request().Context(), principal(c).Name, c.Param("id")); err != nil {
		return err
	}
	s.awaitSnapshot(c)
	return c.NoContent(http.StatusNoContent)
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
	// The body is a request descriptor as Envoy would send it.
	b, err := readObject(c)
	if err != nil {
		return err
	}
	o := b.Root()
	o.Require("domain", "descriptor")
	domain, entries := readDescriptor(o, &b.Errs)
	b.Errs.Merge(rules.ValidateDescriptor(domain, entries))
	if err := b.Err(); err != nil {
		return err
	}
	snap := s.cfg.Limiter.Snapshot()
	if snap == nil {
		return limiter.ErrNoSnapshot
	}
	rule, ok := snap.Match(domain, entries)
	if !ok {
		return problem.Errorf(http.StatusNotFound, "no rule of domain %q matches the descriptor", domain)
	}
	res, err := snap.Resolve(rule.Limit, rules.BucketID(rule, entries), s.now())
	if err != nil {
		b.Errs.Add("descriptor", "its values are no bucket id of limit "+strconv.Quote(rule.Limit)+": "+err.Error())
		return b.Errs.Err()
	}
	return writeJSON(c, http.StatusOK, ruleMatchResponse{Rule: toRuleResponse(rule), Limit: rule.Limit, BucketID: res.BucketID})
}
