//go:build linux

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
)

// TestClient drives the real service through the generated client: tokens,
// a limit, an override, decisions up to a denial with its headers, a PATCH
// with If-Match and its 412, history, import and export, and errors
// decoded as problems. Every response is checked against openapi.yaml on
// the way (see validating), so the client, the contract and the service
// are tested against each other.
func TestClient(t *testing.T) {
	t.Parallel()
	svc := newService(t, "ratelimitd", options{})
	root := svc.admin()

	// Tokens: the secret once, never in a listing.
	created, err := root.CreateTokenWithResponse(bg, client.TokenCreate{Name: "ops", Scope: client.ScopeAdmin})
	must(t, err, created, created.JSON201 != nil)
	if created.Headers201 == nil || created.Headers201.Location == nil || !strings.HasSuffix(*created.Headers201.Location, "/"+created.JSON201.ID) {
		t.Errorf("a created token's Location: %+v", created.Headers201)
	}
	admin := svc.client(created.JSON201.Token)
	support := svc.client(createToken(t, admin, "helpdesk", client.ScopeSupport))
	decide := svc.client(createToken(t, admin, "checkout", client.ScopeDecide))
	who, err := support.WhoamiWithResponse(bg)
	must(t, err, who, who.JSON200 != nil)
	if who.JSON200.Name != "helpdesk" || who.JSON200.Scope != client.ScopeSupport {
		t.Errorf("whoami: %+v", *who.JSON200)
	}
	tokens, err := admin.ListTokensWithResponse(bg)
	must(t, err, tokens, tokens.JSON200 != nil)
	if len(tokens.JSON200.Tokens) != 3 || strings.Contains(string(tokens.Body), created.JSON201.Token) {
		t.Errorf("token list: %s", tokens.Body)
	}

	// A limit: created (201), then replaced (200).
	put, err := admin.PutLimitWithResponse(bg, "NewOrders", client.LimitPut{IDFormat: client.IDFormatRegID, Burst: ptr(int64(2)), Count: ptr(int64(2)), Period: ptr("180m")})
	must(t, err, put, put.JSON201 != nil)
	if put.JSON201.Period == nil || *put.JSON201.Period != "3h0m0s" || put.JSON201.Kind != client.LimitKindRate || put.JSON201.Calendar != nil || put.JSON201.Enum < 100 {
		t.Errorf("a created limit: %+v", *put.JSON201)
	}
	put, err = admin.PutLimitWithResponse(bg, "NewOrders", client.LimitPut{IDFormat: client.IDFormatRegID, Burst: ptr(int64(2)), Count: ptr(int64(2)), Period: ptr("3h"), Description: ptr("orders")})
	must(t, err, put, put.JSON200 != nil)
	got, err := decide.GetLimitWithResponse(bg, "NewOrders")
	must(t, err, got, got.JSON200 != nil)
	if got.JSON200.Description != "orders" || got.JSON200.OverrideCount != 0 {
		t.Errorf("the limit: %+v", *got.JSON200)
	}

	// An override, written in another notation of the id than decisions
	// will use.
	oc, err := support.CreateOverrideWithResponse(bg, client.OverrideCreate{Limit: "NewOrders", BucketID: "000123", Burst: ptr(int64(3)), Count: ptr(int64(3)), Period: ptr("3h"), Comment: ptr("ticket 1")})
	must(t, err, oc, oc.JSON201 != nil)
	o := *oc.JSON201
	if o.BucketID != "123" || o.Version != 1 || o.UpdatedBy != "helpdesk" {
		t.Errorf("a created override: %+v", o)
	}
	if h := oc.Headers201; h == nil || h.ETag == nil || *h.ETag != `"1"` || h.Location == nil || *h.Location != "/v1/overrides/"+o.ID {
		t.Errorf("a created override's headers: %+v", oc.HTTPResponse.Header)
	}
	waitFor(t, 10*time.Second, "the override in the snapshot", func() bool {
		return usesOverride(decide, "NewOrders", "123", 3)
	})

	// Decisions: the override's three tokens, then a denial with its
	// headers; nothing is spent by the denial.
	for i := range 3 {
		res, err := decide.SpendWithResponse(bg, bucket("NewOrders", "123"))
		must(t, err, res, res.JSON200 != nil)
		if d := res.JSON200.Decisions[0]; !res.JSON200.Allowed || d.Remaining != int64(2-i) || d.Source != client.DecisionSourceOverride || d.Burst != 3 {
			t.Errorf("spend %d: %s", i+1, res.Body)
		}
		if h := res.Headers200; h == nil || h.RateLimit == nil || h.RateLimitPolicy == nil || h.RetryAfter != nil {
			t.Errorf("spend %d: headers %v", i+1, res.HTTPResponse.Header)
		}
	}
	denied, err := decide.SpendWithResponse(bg, bucket("NewOrders", "123"))
	must(t, err, denied, denied.JSON200 != nil)
	if d := denied.JSON200.Decisions[0]; denied.JSON200.Allowed || d.Reason == nil || *d.Reason != client.DecisionReasonLimited ||
		d.RetryAfterMs <= 0 || denied.JSON200.RetryAfterMs != d.RetryAfterMs {
		t.Errorf("the fourth spend: %s", denied.Body)
	}
	if h := denied.Headers200; h == nil || h.RetryAfter == nil || *h.RetryAfter < 1 ||
		h.RateLimitPolicy == nil || *h.RateLimitPolicy != `"NewOrders";q=3;w=10800` ||
		h.RateLimit == nil || !strings.HasPrefix(*h.RateLimit, `"NewOrders";r=0;t=`) {
		t.Errorf("the denial's headers: %v", denied.HTTPResponse.Header)
	}
	// Another bucket has the defaults; a refund gives a token back.
	if d := check(t, decide, "NewOrders", "7", 1); !d.Allowed || d.Source != client.DecisionSourceDefault || d.Burst != 2 {
		t.Errorf("a default bucket: %+v", d)
	}
	refund, err := decide.RefundWithResponse(bg, bucket("NewOrders", "123"))
	must(t, err, refund, refund.JSON200 != nil && refund.JSON200.Allowed)
	reset, err := support.ResetBucketsWithResponse(bg, client.ResetRequest{Buckets: []struct {
		BucketID string           `json:"bucket_id"`
		Limit    client.LimitName `json:"limit"`
	}{{BucketID: "123", Limit: "NewOrders"}}})
	must(t, err, reset, reset.JSON200 != nil && reset.JSON200.Reset == 1)
	if d := check(t, decide, "NewOrders", "123", 0); d.Remaining != 3 {
		t.Errorf("after a reset: %d tokens, want 3", d.Remaining)
	}

	// PATCH with If-Match: the current version applies, a stale one is 412.
	patched, err := support.PatchOverrideWithResponse(bg, o.ID, &client.PatchOverrideParams{IfMatch: ptr(`"1"`)}, client.OverridePatch{Comment: ptr("ticket 2"), Burst: ptr(int64(5))})
	must(t, err, patched, patched.JSON200 != nil)
	if patched.JSON200.Version != 2 || patched.Headers200 == nil || *patched.Headers200.ETag != `"2"` {
		t.Errorf("a patch: %s %v", patched.Body, patched.HTTPResponse.Header)
	}
	stale, err := support.PatchOverrideWithResponse(bg, o.ID, &client.PatchOverrideParams{IfMatch: ptr(`"1"`)}, client.OverridePatch{Comment: ptr("lost update")})
	must(t, err, stale, stale.ApplicationProblemJSON412 != nil)
	if p := stale.ApplicationProblemJSON412; p.Status != 412 || p.Type != "urn:ratelimitd:problem:precondition-failed" || p.RequestID == "" {
		t.Errorf("a stale If-Match: %+v", *p)
	}
	current, err := support.GetOverrideWithResponse(bg, o.ID)
	must(t, err, current, current.JSON200 != nil)
	if current.JSON200.Comment != "ticket 2" || *current.Headers200.ETag != `"2"` {
		t.Errorf("the override after a refused patch: %s", current.Body)
	}

	// History: who changed what, oldest first.
	history, err := support.OverrideHistoryWithResponse(bg, o.ID)
	must(t, err, history, history.JSON200 != nil)
	if e := history.JSON200.Entries; len(e) != 2 || e[0].Action != client.HistoryEntryActionCreate || e[0].Before != nil ||
		e[1].Action != client.HistoryEntryActionUpdate || e[1].Before.Comment != "ticket 1" || e[1].After.Comment != "ticket 2" || e[1].Actor != "helpdesk" {
		t.Errorf("history: %s", history.Body)
	}
	list, err := support.ListOverridesWithResponse(bg, &client.ListOverridesParams{Limit: ptr("NewOrders"), BucketID: ptr("0123")})
	must(t, err, list, list.JSON200 != nil)
	if len(list.JSON200.Overrides) != 1 || list.JSON200.Overrides[0].ID != o.ID {
		t.Errorf("searching by a bucket id in another notation: %s", list.Body)
	}

	// Import and export in Boulder's formats.
	yaml := "- NewOrders:\n    burst: 50\n    count: 50\n    period: 3h\n    ids:\n      - id: 9\n        comment: imported\n"
	dry, err := admin.ImportFileWithBodyWithResponse(bg, &client.ImportFileParams{Kind: client.ImportFileParamsKindOverrides, DryRun: ptr(true)}, "application/yaml", strings.NewReader(yaml))
	must(t, err, dry, dry.JSON200 != nil && dry.JSON200.Created == 1)
	imported, err := admin.ImportFileWithBodyWithResponse(bg, &client.ImportFileParams{Kind: client.ImportFileParamsKindOverrides}, "application/yaml", strings.NewReader(yaml))
	must(t, err, imported, imported.JSON200 != nil && imported.JSON200.Created == 1)
	bad, err := admin.ImportFileWithBodyWithResponse(bg, &client.ImportFileParams{Kind: client.ImportFileParamsKindOverrides}, "application/yaml",
		strings.NewReader("- NewOrders:\n    burst: 1\n    count: 1\n    period: 1h\n    ids: [\"x\"]\n"))
	must(t, err, bad, bad.ApplicationProblemJSON422 != nil)
	if p := bad.ApplicationProblemJSON422; len(p.Errors) != 1 || p.Errors[0].Line == nil || *p.Errors[0].Line == 0 || p.Created == nil || *p.Created != 0 {
		t.Errorf("a bad import: %s", bad.Body)
	}
	export, err := admin.ExportFileWithResponse(bg, &client.ExportFileParams{Kind: client.ExportFileParamsKindOverrides})
	must(t, err, export, export.StatusCode() == http.StatusOK)
	if body := string(export.Body); !strings.Contains(body, "NewOrders") || !strings.Contains(body, "imported") || !strings.Contains(body, "ticket 2") {
		t.Errorf("the export of overrides:\n%s", body)
	}
	defaults, err := admin.ExportFileWithResponse(bg, &client.ExportFileParams{Kind: client.ExportFileParamsKindDefaults})
	must(t, err, defaults, defaults.StatusCode() == http.StatusOK && strings.Contains(string(defaults.Body), "NewOrders"))

	// Errors are problems, decoded into their status's field.
	anon := svc.client("")
	unauth, err := anon.ListLimitsWithResponse(bg)
	must(t, err, unauth, unauth.ApplicationProblemJSON401 != nil && unauth.Headers401 != nil && unauth.Headers401.WWWAuthenticate != nil)
	forbidden, err := decide.CreateOverrideWithResponse(bg, client.OverrideCreate{Limit: "NewOrders", BucketID: "1", Unlimited: ptr(true)})
	must(t, err, forbidden, forbidden.ApplicationProblemJSON403 != nil)
	missing, err := admin.GetLimitWithResponse(bg, "Nope")
	must(t, err, missing, missing.ApplicationProblemJSON404 != nil)
	conflict, err := support.CreateOverrideWithResponse(bg, client.OverrideCreate{Limit: "NewOrders", BucketID: "123", Unlimited: ptr(true)})
	must(t, err, conflict, conflict.ApplicationProblemJSON409 != nil)
	invalid, err := admin.PutLimitWithResponse(bg, "Broken", client.LimitPut{IDFormat: client.IDFormatRegID, Burst: ptr(int64(0)), Count: ptr(int64(0)), Period: ptr("-1s")})
	must(t, err, invalid, invalid.ApplicationProblemJSON422 != nil)
	if p := invalid.ApplicationProblemJSON422; p.Errors == nil || len(*p.Errors) != 3 {
		t.Errorf("an invalid limit: %s; want burst, count and period named", invalid.Body)
	}
	unknown, err := decide.CheckWithResponse(bg, bucket("Nope", "1"))
	must(t, err, unknown, unknown.ApplicationProblemJSON422 != nil)
	referenced, err := admin.DeleteLimitWithResponse(bg, "NewOrders")
	must(t, err, referenced, referenced.ApplicationProblemJSON409 != nil)

	// Operations.
	health, err := anon.HealthzWithResponse(bg)
	must(t, err, health, health.JSON200 != nil)
	ready, err := anon.ReadyzWithResponse(bg)
	must(t, err, ready, ready.JSON200 != nil)
	st, err := decide.StatusWithResponse(bg)
	must(t, err, st, st.JSON200 != nil && st.JSON200.Database == client.StatusDatabasePostgres && st.JSON200.Store == client.StatusStoreMemory)
	metrics, err := anon.MetricsWithResponse(bg)
	must(t, err, metrics, metrics.StatusCode() == http.StatusOK && strings.Contains(string(metrics.Body), "ratelimitd_decisions_total"))
	spec, err := anon.OpenapiWithResponse(bg)
	must(t, err, spec, spec.StatusCode() == http.StatusOK && strings.HasPrefix(string(spec.Body), "openapi: 3"))

	// Deletions: the override's history stays; a revoked token stops
	// working.
	del, err := support.DeleteOverrideWithResponse(bg, o.ID)
	must(t, err, del, del.StatusCode() == http.StatusNoContent)
	history, err = support.OverrideHistoryWithResponse(bg, o.ID)
	must(t, err, history, history.JSON200 != nil && len(history.JSON200.Entries) == 3)
	revoked, err := admin.RevokeTokenWithResponse(bg, tokenID(t, admin, "checkout"))
	must(t, err, revoked, revoked.StatusCode() == http.StatusNoContent)
	took := waitFor(t, 10*time.Second, "a revoked token to stop working", func() bool {
		res, err := decide.WhoamiWithResponse(bg)
		return err == nil && res.ApplicationProblemJSON401 != nil
	})
	t.Logf("measured: a revoked token stopped working %v after the revocation was answered", took.Round(time.Millisecond))
}

// must fails the test when a call failed or its answer is not what ok
// says it should be.
func must(t *testing.T, err error, res interface {
	StatusCode() int
}, ok bool) {
	t.Helper()
	if err != nil {
		t.Fatalf("the call failed: %v", err)
	}
	if !ok {
		t.Fatalf("unexpected answer %s", describe(res, nil))
	}
}

// tokenID returns the id of the token named name.
func tokenID(t *testing.T, c *client.ClientWithResponses, name string) string {
	t.Helper()
	res, err := c.ListTokensWithResponse(bg)
	must(t, err, res, res.JSON200 != nil)
	for _, tk := range res.JSON200.Tokens {
		if tk.Name == name {
			return tk.ID
		}
	}
	t.Fatalf("no token named %s", name)
	return ""
}
