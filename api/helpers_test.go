package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// obj is a JSON object of a request or an answer.
type obj = map[string]any

// expect fails the test unless res has the status.
func (r *response) expect(t testing.TB, status int) *response {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	return r
}

// object decodes the body as a JSON object.
func (r *response) object(t testing.TB) obj {
	t.Helper()
	var o obj
	r.json(t, &o)
	return o
}

// fieldErrors returns a problem's errors as field -> message.
func fieldErrors(p problem.Problem) map[string]string {
	out := map[string]string{}
	for _, f := range p.Errors {
		out[f.Field] = f.Message
	}
	return out
}

// wantFields fails unless the problem names exactly the fields given.
func wantFields(t testing.TB, p problem.Problem, fields ...string) {
	t.Helper()
	got := fieldErrors(p)
	for _, f := range fields {
		if _, ok := got[f]; !ok {
			t.Errorf("problem does not name %q: %+v", f, p.Errors)
		}
	}
	if len(got) != len(fields) {
		t.Errorf("problem names %d fields, want %d (%v): %+v", len(got), len(fields), fields, p.Errors)
	}
}

// putLimit creates or replaces a limit, failing the test on an error.
func (e *env) putLimit(name string, body obj) obj {
	e.t.Helper()
	res := e.do("PUT", "/v1/limits/"+name, e.admin, body)
	if res.status != http.StatusCreated && res.status != http.StatusOK {
		e.t.Fatalf("PUT limit %s: %d %s", name, res.status, res.body)
	}
	return res.object(e.t)
}

// limit creates a limit of burst, count and period with the id format.
func (e *env) limit(name, format string, burst, count int, period string) obj {
	e.t.Helper()
	return e.putLimit(name, obj{"id_format": format, "burst": burst, "count": count, "period": period})
}

// override creates an override, failing the test on an error.
func (e *env) override(body obj) obj {
	e.t.Helper()
	return e.do("POST", "/v1/overrides", e.admin, body).expect(e.t, http.StatusCreated).object(e.t)
}

// rows counts what the database holds, to show that a refused request
// wrote nothing.
func (e *env) rows() map[string]int {
	e.t.Helper()
	ctx := context.Background()
	limits, err := e.db.ListLimits(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	tokens, err := e.db.ListTokens(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	overrides, versions := 0, 0
	f := limiter.OverrideFilter{PageSize: 1000}
	for {
		page, next, err := e.db.ListOverrides(ctx, f)
		if err != nil {
			e.t.Fatal(err)
		}
		overrides += len(page)
		for _, o := range page {
			versions += int(o.Version)
		}
		if next == "" {
			break
		}
		f.PageToken = next
	}
	revoked := 0
	for _, t := range tokens {
		if !t.RevokedAt.IsZero() {
			revoked++
		}
	}
	// A digest of the limits' update times changes with any update.
	updated := 0
	for _, l := range limits {
		updated += int(l.UpdatedAt.UnixNano() % 1000003)
	}
	return map[string]int{"limits": len(limits), "limit_updates": updated, "tokens": len(tokens), "revoked": revoked,
		"overrides": overrides, "override_versions": versions}
}

// unchanged fails the test unless the database holds what before counted.
func (e *env) unchanged(before map[string]int) {
	e.t.Helper()
	after := e.rows()
	for k, v := range before {
		if after[k] != v {
			e.t.Errorf("%s: %d before, %d after", k, v, after[k])
		}
	}
}

// decide sends a decision and returns the answer.
func (e *env) decide(op, token string, buckets ...obj) *response {
	e.t.Helper()
	return e.do("POST", "/v1/"+op, token, obj{"buckets": buckets})
}

func bucket(limit, id string, cost int) obj {
	return obj{"limit": limit, "bucket_id": id, "cost": cost}
}
