// Command tour walks the README's ten requests, and the few things a
// client author tripped over besides, with a client that oapi-codegen
// generated from openapi.yaml with its default settings into package
// ratelimitd. e2e's TestGeneratedGoClient generates that package, builds
// this program against it and runs it against a fresh service, given as
// RATELIMIT_URL and RATELIMIT_ADMIN_TOKEN. It stops at the first answer
// that is not the one the README shows, and exits 1.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/oapi-codegen/nullable"

	"tour/ratelimitd"
)

var ctx = context.Background()

func main() {
	admin := newClient(os.Getenv("RATELIMIT_ADMIN_TOKEN"))

	// 1. Ready, without a token.
	ready, err := newClient("").ReadyzWithResponse(ctx)
	expect(err, ready.HTTPResponse, ready.Body, http.StatusOK)
	check(ready.JSON200.Status == ratelimitd.Ok, "readyz: %s", ready.Body)

	// 2. A limit of Let's Encrypt's catalogue; unit and shadow left out.
	orders, err := admin.PutLimitWithResponse(ctx, "NewOrdersPerAccount",
		ratelimitd.LimitPut{IdFormat: ratelimitd.RegId, Burst: ptr(int64(300)), Count: ptr(int64(300)), Period: ptr("3h")})
	expect(err, orders.HTTPResponse, orders.Body, http.StatusCreated)
	l := orders.JSON201
	check(l.Enum == 3 && l.Period != nil && *l.Period == "3h0m0s" && l.Kind == ratelimitd.Rate && l.Calendar == nil &&
		l.Unit == "requests" && !l.Shadow, "the created limit: %s", orders.Body)

	// 3. A token of scope decide, its secret shown once.
	created, err := admin.CreateTokenWithResponse(ctx, ratelimitd.TokenCreate{Name: "orders-service", Scope: ratelimitd.Decide})
	expect(err, created.HTTPResponse, created.Body, http.StatusCreated)
	check(strings.HasPrefix(created.JSON201.Token, "rlt_"), "the created token: %s", created.Body)
	decide := newClient(created.JSON201.Token)

	// 4. A spend, cost left out (1); the headers describe the bucket.
	spent := spend(decide, "NewOrdersPerAccount", "12345678")
	d := spent.JSON200.Decisions[0]
	check(spent.JSON200.Allowed && d.Remaining == 299 && d.Source == ratelimitd.DecisionSourceDefault && d.Reason == nil,
		"the first spend: %s", spent.Body)
	check(*spent.Headers200.RateLimitPolicy == `"NewOrdersPerAccount";q=300;w=10800`, "RateLimit-Policy %q", *spent.Headers200.RateLimitPolicy)

	// 5. A limit outside the catalogue gets the enum 100.
	resets, err := admin.PutLimitWithResponse(ctx, "PasswordResetsPerAccount",
		ratelimitd.LimitPut{IdFormat: ratelimitd.RegId, Burst: ptr(int64(1)), Count: ptr(int64(1)), Period: ptr("1m")})
	expect(err, resets.HTTPResponse, resets.Body, http.StatusCreated)
	check(resets.JSON201.Enum == 100, "the second limit: %s", resets.Body)

	// 6. and 7. The first reset is allowed and empties the bucket; the
	// second is denied, with Retry-After.
	first := spend(decide, "PasswordResetsPerAccount", "42")
	check(first.JSON200.Allowed && first.JSON200.Decisions[0].Remaining == 0, "the first reset: %s", first.Body)
	second := spend(decide, "PasswordResetsPerAccount", "42")
	d = second.JSON200.Decisions[0]
	check(!second.JSON200.Allowed && d.Reason != nil && *d.Reason == ratelimitd.Limited && d.RetryAfterMs > 0 &&
		second.Headers200.RetryAfter != nil && *second.Headers200.RetryAfter >= 1, "the second reset: %s", second.Body)

	// 8. An override, in another notation of the id; unlimited and
	// enabled left out.
	oc, err := admin.CreateOverrideWithResponse(ctx, ratelimitd.OverrideCreate{
		Limit: "PasswordResetsPerAccount", BucketId: "0007",
		Burst: ptr(int64(5)), Count: ptr(int64(5)), Period: ptr("1m"), Comment: ptr("Ticket 4711"),
	})
	expect(err, oc.HTTPResponse, oc.Body, http.StatusCreated)
	o := oc.JSON201
	check(o.BucketId == "7" && o.Enabled && !o.Unlimited && o.ExpiresAt == nil && *oc.Headers201.ETag == `"1"`, "the override: %s", oc.Body)

	// 9. The next spend for account 7 already gets it.
	seven := spend(decide, "PasswordResetsPerAccount", "7")
	d = seven.JSON200.Decisions[0]
	check(d.Allowed && d.Source == ratelimitd.DecisionSourceOverride && d.Remaining == 4, "a spend of the override: %s", seven.Body)

	// 10. Bad values: a 422 problem naming every field, in body order.
	bad, err := admin.CreateOverrideWithResponse(ctx, ratelimitd.OverrideCreate{
		Limit: "PasswordResetsPerAccount", BucketId: "acct-42", Burst: ptr(int64(-5)), Period: ptr("3 hours"),
	})
	expect(err, bad.HTTPResponse, bad.Body, http.StatusUnprocessableEntity)
	check(fields(bad.ApplicationproblemJSON422) == "bucket_id burst period count", "the bad override: %s", bad.Body)

	// Beyond the README. An expiry set, kept by a PATCH that leaves it
	// out, and cleared by one that sends null.
	expiry := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	patched := patch(admin, o.Id, ratelimitd.OverridePatch{ExpiresAt: nullable.NewNullableWithValue(expiry)})
	check(patched.ExpiresAt != nil && patched.ExpiresAt.Equal(expiry), "an expiry set: %+v", patched)
	patched = patch(admin, o.Id, ratelimitd.OverridePatch{Comment: ptr("Ticket 4712")})
	check(patched.ExpiresAt != nil && patched.ExpiresAt.Equal(expiry), "an expiry left out: %+v", patched)
	var never ratelimitd.OverridePatch
	never.ExpiresAt.SetNull()
	patched = patch(admin, o.Id, never)
	check(patched.ExpiresAt == nil && patched.Comment == "Ticket 4712", "an expiry cleared: %+v", patched)

	// An import sent as YAML text, one refused with the line of its bad
	// entry, and an export read as text.
	doc := "PasswordResetsPerAccount:\n  burst: 2\n  count: 2\n  period: 1m\n  id_format: reg_id\n"
	imported, err := admin.ImportFileWithBodyWithResponse(ctx,
		&ratelimitd.ImportFileParams{Kind: ratelimitd.ImportFileParamsKindDefaults, DryRun: ptr(true)}, "application/yaml", strings.NewReader(doc))
	expect(err, imported.HTTPResponse, imported.Body, http.StatusOK)
	check(imported.JSON200.Updated == 1, "a dry run: %s", imported.Body)
	refused, err := admin.ImportFileWithBodyWithResponse(ctx,
		&ratelimitd.ImportFileParams{Kind: ratelimitd.ImportFileParamsKindDefaults}, "application/yaml", strings.NewReader("Fine:\n  burst: 1\n  count: 1\n  period: 1m\n  id_format: string\nBad:\n  burst: 1\n  count: 1\n  period: 1m\n"))
	expect(err, refused.HTTPResponse, refused.Body, http.StatusUnprocessableEntity)
	p := refused.ApplicationproblemJSON422
	check(len(p.Errors) == 1 && p.Created != nil && *p.Created == 0, "a bad import: %s", refused.Body)
	check(p.Errors[0].Line != nil && *p.Errors[0].Line == 6 && p.Errors[0].Entry != nil && *p.Errors[0].Entry == "Bad", "a bad import: %s", refused.Body)
	unknown, err := admin.ImportFileWithBodyWithResponse(ctx,
		&ratelimitd.ImportFileParams{Kind: "limits"}, "application/yaml", strings.NewReader(doc))
	expect(err, unknown.HTTPResponse, unknown.Body, http.StatusUnprocessableEntity)
	p = unknown.ApplicationproblemJSON422
	check(len(p.Errors) == 1 && p.Errors[0].Field != nil && *p.Errors[0].Field == "kind" && p.Created == nil, "an unknown kind: %s", unknown.Body)
	exported, err := admin.ExportFileWithResponse(ctx, &ratelimitd.ExportFileParams{Kind: ratelimitd.ExportFileParamsKindDefaults})
	expect(err, exported.HTTPResponse, exported.Body, http.StatusOK)
	check(strings.Contains(string(exported.Body), "PasswordResetsPerAccount:"), "the export:\n%s", exported.Body)

	// Many decisions in one request, each answered as its route would, in
	// order (the check sees the spend), a refused one as its problem.
	items := make([]ratelimitd.DecisionsItem, 3)
	check(items[0].FromDecisionsSpend(ratelimitd.DecisionsSpend{Buckets: []ratelimitd.BucketRequest{{Limit: "PasswordResetsPerAccount", BucketId: "8"}}}) == nil &&
		items[1].FromDecisionsCheck(ratelimitd.DecisionsCheck{Buckets: []ratelimitd.BucketRequest{{Limit: "PasswordResetsPerAccount", BucketId: "8", Cost: ptr(int64(0))}}}) == nil &&
		items[2].FromDecisionsSpend(ratelimitd.DecisionsSpend{Buckets: []ratelimitd.BucketRequest{{Limit: "Nope", BucketId: "8"}}}) == nil, "the requests")
	many, err := decide.DecideManyWithResponse(ctx, ratelimitd.DecisionsRequest{Requests: items})
	expect(err, many.HTTPResponse, many.Body, http.StatusOK)
	results := many.JSON200.Results
	check(len(results) == 3, "many decisions: %s", many.Body)
	spent8, err1 := results[0].AsDecisionResult()
	checked8, err2 := results[1].AsDecisionResult()
	refusedMany, err3 := results[2].AsDecisionsProblem()
	check(err1 == nil && err2 == nil && err3 == nil && spent8.Allowed && checked8.Decisions[0].Remaining == 0 &&
		refusedMany.Problem.Status == http.StatusUnprocessableEntity && refusedMany.Problem.Errors != nil &&
		(*refusedMany.Problem.Errors)[0].Field == "buckets[0].limit", "many decisions: %s", many.Body)

	// A path that is no limit name.
	named, err := admin.GetLimitWithResponse(ctx, "1bad")
	expect(err, named.HTTPResponse, named.Body, http.StatusUnprocessableEntity)
	check(fields(named.ApplicationproblemJSON422) == "name", "GET /v1/limits/1bad: %s", named.Body)
	fmt.Println("tour: every answer as expected")
}

// newClient returns a client that sends token, none when it is empty.
func newClient(token string) *ratelimitd.ClientWithResponses {
	c, err := ratelimitd.NewClientWithResponses(os.Getenv("RATELIMIT_URL"),
		ratelimitd.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			if token != "" {
				r.Header.Set("Authorization", "Bearer "+token)
			}
			return nil
		}))
	if err != nil {
		fail("client: %v", err)
	}
	return c
}

func spend(c *ratelimitd.ClientWithResponses, limit, id string) *ratelimitd.SpendResponse {
	res, err := c.SpendWithResponse(ctx, ratelimitd.DecisionRequest{Buckets: []ratelimitd.BucketRequest{{Limit: limit, BucketId: id}}})
	expect(err, res.HTTPResponse, res.Body, http.StatusOK)
	return res
}

func patch(c *ratelimitd.ClientWithResponses, id string, body ratelimitd.OverridePatch) *ratelimitd.Override {
	res, err := c.PatchOverrideWithResponse(ctx, id, nil, body)
	expect(err, res.HTTPResponse, res.Body, http.StatusOK)
	return res.JSON200
}

// fields lists the fields a problem names, space-separated.
func fields(p *ratelimitd.Invalid) string {
	var names []string
	if p.Errors != nil {
		for _, e := range *p.Errors {
			names = append(names, e.Field)
		}
	}
	return strings.Join(names, " ")
}

func expect(err error, res *http.Response, body []byte, status int) {
	if err != nil {
		fail("%v", err)
	}
	check(res.StatusCode == status, "%s %s: status %d, want %d; body %s", res.Request.Method, res.Request.URL.Path, res.StatusCode, status, body)
}

func check(ok bool, format string, args ...any) {
	if !ok {
		fail(format, args...)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "tour: "+format+"\n", args...)
	os.Exit(1)
}

func ptr[T any](v T) *T { return &v }
