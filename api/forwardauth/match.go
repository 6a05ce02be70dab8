package forwardauth

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"

	"github.com/ratelimitd/ratelimitd/api/descriptor"
	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// maxMatchBody bounds a dry run's body: a query and the headers of one
// request.
const maxMatchBody = 64 << 10

// matchHeaders bounds the headers of a dry run.
const matchHeaders = 100

// matchResponse is what a forward-auth call would do, nothing spent.
type matchResponse struct {
	Domain string `json:"domain"`
	// ClientAddress is the client address the call's headers give,
	// through the trusted proxies; null when no descriptor reads it.
	ClientAddress *string            `json:"client_address"`
	Descriptors   []descriptorResult `json:"descriptors"`
}

// descriptorResult is what one d makes and matches.
type descriptorResult struct {
	D    string `json:"d"`
	Made bool   `json:"made"`
	// Skipped says why no descriptor was made: a header absent or empty.
	Skipped *string      `json:"skipped"`
	Entries []entryBody  `json:"entries"`
	Match   *matchResult `json:"match"`
}

type entryBody struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// matchResult is the rule a descriptor matched and the bucket it would
// spend.
type matchResult struct {
	RuleID   string `json:"rule_id"`
	Limit    string `json:"limit"`
	BucketID string `json:"bucket_id"`
	// Replaced says that another matched rule of the call replaces the
	// limit: the descriptor would spend nothing.
	Replaced bool `json:"replaced"`
	// Source is whether the bucket has an override: default, override or
	// unlimited.
	Source limiter.Source `json:"source"`
}

// match answers a dry run, POST /v1/forward-auth/{domain}/match: the
// query string and headers of a call, and the address of the peer that
// would send it, are read as the route reads them, and the answer says
// which descriptors they make, which rule each matches and the bucket it
// would spend, without spending. A call the route would refuse is refused
// with the same problem.
func (h *Handler) match(x *edge.Exchange, r *http.Request, domain string) error {
	if _, err := problem.Authorize(h.cfg.Auth, first(r.Header["Authorization"]), auth.Decide, auth.Support); err != nil {
		return err
	}
	if msg := input.MediaProblem(first(r.Header["Content-Type"]), "application/json"); msg != "" {
		return problem.Errorf(http.StatusUnsupportedMediaType, "%s", msg)
	}
	call, err := readCall(r)
	if err != nil {
		return err
	}
	if tokenInQuery(call.URL.RawQuery) {
		return errTokenInQuery
	}
	p, err := parsePlan(call.URL.RawQuery)
	if err != nil {
		return err
	}
	snap := h.cfg.Limiter.Snapshot()
	if snap == nil {
		return limiter.ErrNoSnapshot
	}
	sc := new(scratch)
	a := attributes{r: call, clients: h.cfg.Clients}
	if err := sc.fill(snap, domain, p, &a); err != nil {
		return err
	}
	out := matchResponse{Domain: domain, Descriptors: make([]descriptorResult, len(p.descriptors))}
	if a.read[fromAddress] {
		out.ClientAddress = &a.address
	}
	for i := range p.descriptors {
		out.Descriptors[i] = descriptorResult{D: "d[" + strconv.Itoa(i) + "]", Entries: []entryBody{}}
	}
	for k, i := range sc.made {
		d := &out.Descriptors[i]
		d.Made = true
		for _, s := range p.descriptors[i] {
			v, _ := h.sourceValue(call, &a, s)
			d.Entries = append(d.Entries, entryBody{Key: s.key, Value: v, Source: s.text})
		}
		m, ok := sc.batch.Matched(k)
		if !ok {
			continue
		}
		res, err := snap.Resolve(m.Rule.Limit, m.BucketID, h.cfg.Now())
		if err != nil {
			var fe limiter.FieldError
			if errors.As(err, &fe) {
				return sc.name(p, &descriptor.Error{Descriptor: k, Entry: -1, Part: "bucket_id",
					Message: "not a bucket id of limit " + strconv.Quote(m.Rule.Limit) + " (rule " + m.Rule.ID + "): " + fe.Message})
			}
			return err
		}
		d.Match = &matchResult{RuleID: m.Rule.ID, Limit: m.Rule.Limit, BucketID: res.BucketID, Replaced: m.Replaced, Source: res.Source}
	}
	for i := range out.Descriptors {
		if d := &out.Descriptors[i]; !d.Made {
			msg := "a header it reads is absent or empty"
			for _, s := range p.descriptors[i] {
				if s.kind == fromHeader {
					if v, _ := headerValue(call, s.header); v == "" {
						msg = s.header + " is absent or empty"
						break
					}
				}
			}
			d.Skipped = &msg
		}
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	x.Header().Set("Content-Type", "application/json")
	x.WriteHeader(http.StatusOK)
	_, _ = x.Write(append(body, '\n'))
	return nil
}

// sourceValue is the value a made descriptor's source gave.
func (h *Handler) sourceValue(r *http.Request, a *attributes, s source) (string, error) {
	switch s.kind {
	case fromLiteral:
		return s.value, nil
	case fromHeader:
		return headerValue(r, s.header)
	}
	return a.value(s.kind)
}

// readCall reads a dry run's body, {"query", "headers": [{"name",
// "value"}], "peer"}, into the call it describes.
func readCall(r *http.Request) (*http.Request, error) {
	// The edge bounds the body at maxMatchBody.
	data, err := input.Read(r, nil)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, problem.TooLarge(maxMatchBody)
		}
		return nil, err
	}
	b, err := input.Parse(data)
	if err != nil {
		return nil, err
	}
	o := b.Root()
	call := &http.Request{Method: http.MethodGet, Header: http.Header{}, URL: &url.URL{}, RemoteAddr: "127.0.0.1:0"}
	if q, ok := o.String("query"); ok {
		call.URL.RawQuery = q
	}
	if peer, ok := o.String("peer"); ok {
		if _, err := netip.ParseAddr(peer); err != nil {
			b.Errs.Add("peer", "must be an IP address, such as 127.0.0.1 or ::1")
		}
		call.RemoteAddr = peer
	}
	n, _ := o.Objects("headers", matchHeaders, func(i int, e input.Object) {
		e.Require("name", "value")
		name, _ := e.String("name")
		value, _ := e.String("value")
		if !validHeaderName(name) {
			b.Errs.Add(input.Join(e.Path(), "name"), "must be a header name: a token of letters, digits and !#$%&'*+-.^_`|~")
			return
		}
		if msg := limiter.CharProblem(value); msg != "" {
			b.Errs.Add(input.Join(e.Path(), "value"), msg)
			return
		}
		if k := http.CanonicalHeaderKey(name); k == headerHost {
			call.Host = value
		} else {
			call.Header.Add(k, value)
		}
	})
	if n > matchHeaders {
		b.Errs.Add("headers", "must hold at most "+strconv.Itoa(matchHeaders)+" headers")
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return call, nil
}

func first(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
}
