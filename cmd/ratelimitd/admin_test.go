package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// The limit and the bucket of the staffer's task.
const (
	adminLimit  = "NewOrdersPerAccount"
	adminBucket = "12345678"
)

// adminZone is the browser's time zone: half an hour off any whole-hour
// zone, so that a page that mixed up local time and UTC could not pass by
// luck. India has had no daylight saving time since 1945, so the test
// knows its offset without a time zone database.
const (
	adminZone       = "Asia/Kolkata"
	adminZoneOffset = 5*time.Hour + 30*time.Minute
)

// TestAdminPage walks a support staffer's task through the admin page, in
// a headless Chromium, against the whole program started by run: sign in
// with a pasted token, find the limit, look up a bucket, grant an override
// (first with a mistyped bucket id), find it again in another notation,
// see the bucket's new allowance, give it an expiry, disable it, read its
// history, meet someone else's concurrent change, and delete it. Every
// step is asserted on the DOM, waiting for it rather than sleeping.
func TestAdminPage(t *testing.T) {
	chromium := testenv.Chromium(t)
	svc := startAdminService(t)

	svc.mustCall(t, "PUT", "/v1/limits/"+adminLimit, svc.bootstrap, map[string]any{
		"id_format": "reg_id", "burst": 300, "count": 300, "period": "3h",
		"description": "New orders per ACME account",
	}, http.StatusCreated, nil)
	// A write is answered once decisions use it.
	svc.mustCall(t, "POST", "/v1/check", svc.bootstrap, adminCheckBody("1"), http.StatusOK, nil)

	// The staffer's own support token: the page needs nothing more, its
	// look-up panel included (POST /v1/check spends nothing, so support
	// tokens may call it).
	token := svc.createToken(t, "sam", "support")
	p := newAdminPage(t, chromium)
	p.do("open the page", chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(token, "sam", "support")
	if leaked := adminEval[bool](p, "token stays out of URLs and cookies",
		fmt.Sprintf(`location.href.includes(%q) || document.cookie !== ''`, token)); leaked {
		t.Error("the token is in the URL or a cookie")
	}
	p.do("reload the page", chromedp.Reload())
	p.waitText("still signed in after a reload (sessionStorage)", "#who-scope", "support")

	// The limit is in the list with its kind, id format, defaults, shadow
	// flag and number of overrides; a support token may not change it.
	row := fmt.Sprintf(`#limits-table tr[data-limit=%q]`, adminLimit)
	p.waitText("the limit is listed", row, adminLimit)
	cells := adminEval[[]string](p, "read the limit's row",
		fmt.Sprintf(`[...document.querySelector('%s').cells].map(c => c.textContent.trim())`, row))
	if want := []string{"rate", "reg_id", "300 per 3 hours, burst 300", "No", "0"}; len(cells) < 6 || !slices.Equal(cells[1:5], want[:4]) || !strings.HasPrefix(cells[5], want[4]) {
		t.Errorf("limit row = %q, want %q after the name", cells, want)
	}
	if shown := adminEval[bool](p, "look for the limit controls",
		`document.querySelector('#new-limit').checkVisibility() || document.querySelector('[data-act="edit-limit"]').checkVisibility()`); shown {
		t.Error("a support token is offered to create or edit limits")
	}

	// Look up the bucket: full, by the default.
	p.do("look up the bucket",
		chromedp.SendKeys(chromedp.CSS("#lk-limit"), "N"),
		p.typeInto("#lk-bucket", adminBucket+"\n"))
	p.waitTextIs("the bucket is full", "#lk-remaining", "300")
	p.waitText("the bucket has the default", "#lk-source", "default")
	p.waitTextIs("the limit counts requests", "#lk-unit", "requests")
	p.waitTextIs("the bucket owes nothing", "#lk-debt", "None")

	// A settle that charges 100 more than the burst puts the bucket into
	// debt, which the look-up shows; a reset clears it.
	svc.mustCall(t, "POST", "/v1/settle", svc.bootstrap, map[string]any{"buckets": []map[string]any{
		{"limit": adminLimit, "bucket_id": adminBucket, "reserved": 0, "actual": 400}}}, http.StatusOK, nil)
	p.do("look the bucket up again", chromedp.Click(chromedp.CSS("#lk-refresh")))
	p.waitTextIs("the bucket is empty", "#lk-remaining", "0")
	p.waitTextIs("the bucket is in debt", "#lk-debt", "100 requests owed: spends are denied until it is paid off")
	svc.mustCall(t, "POST", "/v1/buckets/reset", svc.bootstrap, map[string]any{"buckets": []map[string]any{
		{"limit": adminLimit, "bucket_id": adminBucket}}}, http.StatusOK, nil)

	// Grant an override with a mistyped bucket id: the API's own message
	// is shown beside the bucket id field, which takes the focus.
	p.do("open the new override dialog",
		chromedp.Click(chromedp.CSS("#new-override")),
		chromedp.WaitVisible(chromedp.CSS("#of-limit")),
		chromedp.SendKeys(chromedp.CSS("#of-limit"), "N"),
	)
	p.waitValue("the form starts from the limit's count", "#of-count", "300")
	p.waitValue("and its period, in words", "#of-period", "3 hours")
	p.do("fill the form with a typo",
		p.typeInto("#of-bucket", adminBucket+"x"),
		p.typeInto("#of-burst", "600"),
		p.typeInto("#of-comment", "Migration week, ticket 4711"),
		chromedp.Click(chromedp.CSS("#of-save")),
	)
	want := svc.fieldError(t, "POST", "/v1/overrides", map[string]any{"limit": adminLimit, "bucket_id": adminBucket + "x", "burst": 600, "count": 300, "period": "3h"}, "bucket_id")
	p.waitTextIs("the API's error is beside the bucket id", "#of-bucket-error", want)
	if got := adminEval[string](p, "where the focus is", `document.activeElement.id + ' ' + document.activeElement.getAttribute('aria-invalid')`); got != "of-bucket true" {
		t.Errorf("focus after the 422: %q, want the invalid bucket id field", got)
	}

	p.do("correct the bucket id and save",
		p.typeInto("#of-bucket", adminBucket),
		chromedp.Click(chromedp.CSS("#of-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")),
	)
	p.waitText("the creation is confirmed", "#overrides-notice", "Created the override of "+adminLimit+" for "+adminBucket)
	p.waitFocus("the focus is back on the button that opened the dialog", `#new-override`)

	// Find it by its bucket id in another notation.
	p.do("search by bucket id with a leading zero", p.typeInto("#s-bucket", "0"+adminBucket+"\n"))
	p.waitText("the search ran", "#override-summary", "Showing 1 override for bucket id “0"+adminBucket+"”")
	card := fmt.Sprintf(`#override-list li[data-bucket=%q]`, adminBucket)
	p.waitText("the card shows the new allowance", card+` [data-slot="allowance"]`, "300 per 3 hours, burst 600")

	// The bucket now has the override's burst: the write was answered
	// once decisions used it.
	p.do("look the bucket up from its card", chromedp.Click(chromedp.CSS(card+` [data-act="check"]`)))
	p.waitTextIs("the bucket has the override's burst", "#lk-remaining", "600")
	p.waitText("the source is the override", "#lk-source", "An override")

	// Give it an expiry with the date picker, in the browser's local time.
	local := time.FixedZone("IST", int(adminZoneOffset/time.Second))
	expires := time.Now().In(local).Add(7*24*time.Hour + time.Hour).Truncate(time.Minute)
	p.do("edit the override", chromedp.Click(chromedp.CSS(card+` [data-act="edit"]`)), chromedp.WaitVisible(chromedp.CSS("#of-expires")))
	p.waitFocus("the edit dialog focuses its first field", "#of-burst")
	p.do("pick the expiry", chromedp.SendKeys(chromedp.CSS("#of-expires"),
		expires.Format("01022006")+kb.Tab+expires.Format("0304")+expires.Format("PM")[:1]))
	p.waitValue("the date picker holds the local time", "#of-expires", expires.Format("2006-01-02T15:04"))
	p.waitText("the form says when it expires", "#of-expires-hint", "Expires in 7 days")
	p.waitText("and shows the UTC value", "#of-expires-hint", expires.UTC().Format("2006-01-02 15:04")+" UTC")
	p.do("save the expiry", chromedp.Click(chromedp.CSS("#of-save")), chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")))
	p.waitText("the card says when it expires", card+` [data-expires]`, "Expires in 7 days")
	if got := svc.override(t, adminLimit, adminBucket)["expires_at"]; got != expires.UTC().Format(time.RFC3339) {
		t.Errorf("stored expires_at = %v, want %s", got, expires.UTC().Format(time.RFC3339))
	}

	// Disable it.
	p.do("disable the override", chromedp.Click(chromedp.CSS(card+` [data-act="toggle"]`)))
	p.waitText("the card says disabled", card+" .badges", "Disabled")
	p.waitText("the button now enables", card+` [data-act="toggle"]`, "Enable")
	p.waitFocus("the focus stays on the toggle", card+` [data-act="toggle"]`)

	// Its history: the creation and both changes, by the staffer, each
	// with what changed.
	p.do("open the history", chromedp.Click(chromedp.CSS(card+` [data-act="history"]`)), chromedp.WaitVisible(chromedp.CSS("#history-list > li")))
	type entry struct {
		Action  string     `json:"action"`
		Heading string     `json:"heading"`
		Rows    [][]string `json:"rows"`
	}
	history := adminEval[[]entry](p, "read the history", `[...document.querySelectorAll('#history-list > li')].map(li => ({
		action: li.dataset.action,
		heading: li.querySelector('h3').textContent,
		rows: [...li.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(c => c.textContent)),
	}))`)
	var actions []string
	for _, e := range history {
		actions = append(actions, e.Action)
		if !strings.HasSuffix(e.Heading, " by sam") {
			t.Errorf("history heading %q does not name sam", e.Heading)
		}
	}
	if want := []string{"create", "update", "update"}; !slices.Equal(actions, want) {
		t.Fatalf("history actions = %q, want %q", actions, want)
	}
	if !historyHasRow(history[0].Rows, "Burst", "—", "600") {
		t.Errorf("the creation does not show burst 600: %q", history[0].Rows)
	}
	if len(history[1].Rows) != 1 || history[1].Rows[0][0] != "Expires" || history[1].Rows[0][1] != "never" ||
		!strings.Contains(history[1].Rows[0][2], expires.UTC().Format("2006-01-02 15:04")+" UTC") {
		t.Errorf("the first change should show only the new expiry: %q", history[1].Rows)
	}
	if len(history[2].Rows) != 1 || !historyHasRow(history[2].Rows, "Enabled", "yes", "no") {
		t.Errorf("the second change should show only enabled yes -> no: %q", history[2].Rows)
	}
	p.do("close the history with Escape", chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.CSS("#history-dialog")))
	p.waitFocus("the focus is back on the history button", card+` [data-act="history"]`)

	// A dialog's close event comes in a task of its own, which may run
	// after the user's next click: it must not pull the focus back from
	// where they went. The script closes the dialog and moves the focus
	// at once, and answers where the focus is once the event has run.
	p.do("open the history again", chromedp.Click(chromedp.CSS(card+` [data-act="history"]`)), chromedp.WaitVisible(chromedp.CSS("#history-list > li")))
	focused := adminEval[string](p, "close the history and move on before its close event", fmt.Sprintf(`new Promise((resolve) => {
		const dialog = document.querySelector('#history-dialog');
		dialog.addEventListener('close', () => setTimeout(() => resolve(document.activeElement.dataset.act ?? document.activeElement.id)), { once: true });
		dialog.close();
		document.querySelector('%s [data-act="edit"]').focus();
	})`, card), chromedp.EvalAwaitPromise)
	if focused != "edit" {
		t.Errorf("after a dialog closed, the focus moved from where the user went to %q", focused)
	}

	// Someone else changes the override while the staffer edits it: the
	// save is refused with 412, and the form shows the other change.
	p.do("edit the override again", chromedp.Click(chromedp.CSS(card+` [data-act="edit"]`)), chromedp.WaitVisible(chromedp.CSS("#of-comment")))
	id, _ := svc.override(t, adminLimit, adminBucket)["id"].(string)
	svc.mustCall(t, "PATCH", "/v1/overrides/"+id, svc.bootstrap, map[string]any{"comment": "Raised by the on-call admin"}, http.StatusOK, nil)
	p.do("change the comment and save", p.typeInto("#of-comment", "Extended after the call"), chromedp.Click(chromedp.CSS("#of-save")))
	p.waitText("the page says someone else changed it", "#of-problem", "Changed by someone else (412)")
	p.waitText("and that it was reloaded", "#of-problem", "reloaded")
	p.waitFocus("the message has the focus, in view", "#of-problem")
	p.waitValue("the form shows the other change", "#of-comment", "Raised by the on-call admin")
	p.do("cancel the edit", chromedp.Click(chromedp.CSS(`#override-dialog [data-close]`)), chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")))

	// Nothing overflows sideways on a 360 px wide phone.
	p.do("narrow the window to 360 px", chromedp.EmulateViewport(360, 780))
	if width := adminEval[int](p, "measure the page", `document.documentElement.scrollWidth`); width > 360 {
		t.Errorf("at 360 px the page is %d px wide", width)
	}
	p.do("widen the window again", chromedp.EmulateViewport(1280, 900))

	// Delete it, after a confirmation that starts on the safe choice.
	p.do("ask to delete", chromedp.Click(chromedp.CSS(card+` [data-act="delete"]`)), chromedp.WaitVisible(chromedp.CSS("#del-confirm")))
	p.waitFocus("the confirmation focuses the safe choice", "#del-cancel")
	p.do("confirm", chromedp.Click(chromedp.CSS("#del-confirm")), chromedp.WaitNotPresent(chromedp.CSS(card)))
	p.waitText("the deletion is confirmed", "#overrides-notice", "Deleted the override of "+adminLimit+" for "+adminBucket)

	p.checkConsole()
}

// TestAdminPageKinds walks an admin through the sorts of limits on the
// page, beside a rate limit: create a concurrency limit and a daily quota
// in Europe/Paris from
// the limit dialog, which shows and sends only what each sort takes, and
// see them listed with their kind, calendar and zone; hold a lease through
// the API and see it held on look-up; spend the quota and see its usage
// and when its window ends; find the kind fixed on edit; have a mistyped
// zone answered beside its field; move the quota to another zone, which
// the form says restarts its usage, and see that it did; and grant
// overrides that set what each sort takes.
func TestAdminPageKinds(t *testing.T) {
	chromium := testenv.Chromium(t)
	svc := startAdminService(t)
	svc.mustCall(t, "PUT", "/v1/limits/"+adminLimit, svc.bootstrap, map[string]any{
		"id_format": "reg_id", "burst": 300, "count": 300, "period": "3h",
	}, http.StatusCreated, nil)
	token := svc.createToken(t, "ada", "admin")
	p := newAdminPage(t, chromium)
	p.do("open the page", chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(token, "ada", "admin")

	// A concurrency limit: its count is its burst, so the form asks for
	// none, and its period is the longest a lease lives.
	p.do("create a concurrency limit",
		chromedp.Click(chromedp.CSS("#new-limit")),
		chromedp.WaitVisible(chromedp.CSS("#lf-name")),
		p.typeInto("#lf-name", "ModelCalls"),
		p.choose("#lf-kind", "concurrency"),
		chromedp.SendKeys(chromedp.CSS("#lf-id-format"), "s"))
	p.waitTextIs("the burst reads as what is held at once", `label[for="lf-burst"]`, "At most at once (burst)")
	p.waitTextIs("the period reads as the longest lease", `label[for="lf-period"]`, "Longest lease (period)")
	if p.visible("#lf-count") || p.visible("#lf-calendar") || p.visible("#lf-zone") {
		t.Error("a concurrency limit's form shows a count, a calendar or a zone")
	}
	p.do("save the concurrency limit",
		p.typeInto("#lf-burst", "10"),
		p.typeInto("#lf-period", "1h"),
		chromedp.Click(chromedp.CSS("#lf-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#limit-dialog")))
	p.waitText("the creation is confirmed", "#limits-notice", "Created the limit ModelCalls")
	p.waitFocus("the focus is back on the button that opened the dialog", "#new-limit")
	checkFields(t, "the concurrency limit", svc.limit(t, "ModelCalls"), map[string]any{
		"kind": "concurrency", "burst": 10.0, "count": 10.0, "period": "1h0m0s", "calendar": nil, "time_zone": nil, "unit": "requests"})

	// A daily quota in Paris: a count per window, no burst, no period.
	p.do("create a daily quota",
		chromedp.Click(chromedp.CSS("#new-limit")),
		chromedp.WaitVisible(chromedp.CSS("#lf-name")),
		p.typeInto("#lf-name", "ExportsPerDay"),
		p.choose("#lf-kind", "quota"),
		chromedp.SendKeys(chromedp.CSS("#lf-id-format"), "s"),
		chromedp.WaitVisible(chromedp.CSS("#lf-calendar")),
		chromedp.SendKeys(chromedp.CSS("#lf-calendar"), "D"),
		p.typeInto("#lf-zone", "Europe/Paris"),
		p.typeInto("#lf-count", "5"))
	if p.visible("#lf-burst") || p.visible("#lf-period") {
		t.Error("a quota's form shows a burst or a period")
	}
	if got := adminEval[string](p, "read the restart warning", `document.querySelector('#lf-restart').textContent`); got != "" {
		t.Errorf("a new quota warns of a restart: %q", got)
	}
	p.do("save the quota", chromedp.Click(chromedp.CSS("#lf-save")), chromedp.WaitNotVisible(chromedp.CSS("#limit-dialog")))
	p.waitText("the creation is confirmed", "#limits-notice", "Created the limit ExportsPerDay: 5 per calendar day in Europe/Paris")
	checkFields(t, "the quota", svc.limit(t, "ExportsPerDay"), map[string]any{
		"kind": "rate", "calendar": "day", "time_zone": "Europe/Paris", "count": 5.0, "burst": 5.0, "period": nil})

	// Both are listed with their kind; the quota with its calendar and
	// zone, the concurrency limit with what it holds and for how long.
	rowOf := func(name string) []string {
		t.Helper()
		row := fmt.Sprintf(`#limits-table tr[data-limit=%q]`, name)
		p.waitText(name+" is listed", row, name)
		return adminEval[[]string](p, "read the row of "+name,
			fmt.Sprintf(`[...document.querySelector('%s').cells].slice(0, 4).map(c => c.textContent.trim())`, row))
	}
	if got, want := rowOf("ModelCalls"), []string{"ModelCalls", "concurrency", "string", "At most 10 at once, leases up to 1 hour"}; !slices.Equal(got, want) {
		t.Errorf("row of ModelCalls = %q, want %q", got, want)
	}
	if got, want := rowOf("ExportsPerDay"), []string{"ExportsPerDay", "rate · calendar quota (day, Europe/Paris)", "string", "5 per calendar day in Europe/Paris"}; !slices.Equal(got, want) {
		t.Errorf("row of ExportsPerDay = %q, want %q", got, want)
	}

	// A lease taken through the API is held on look-up.
	svc.mustCall(t, "POST", "/v1/acquire", svc.bootstrap, map[string]any{"buckets": []map[string]any{
		{"limit": "ModelCalls", "bucket_id": "acct-42", "cost": 3}}}, http.StatusOK, nil)
	p.do("look up the concurrency bucket",
		chromedp.SendKeys(chromedp.CSS("#lk-limit"), "M"),
		p.typeInto("#lk-bucket", "acct-42\n"))
	p.waitTextIs("the lease is held", "#lk-held", "3 of 10 held")
	p.waitTextIs("and the rest remains", "#lk-remaining", "7")
	p.waitText("its parameters", "#lk-params", "At most 10 at once, leases up to 1 hour")
	if p.visible("#lk-used") || p.visible("#lk-debt") {
		t.Error("a concurrency bucket's look-up shows a quota's usage or a debt")
	}

	// Spending the quota shows its usage of the day, which ends at
	// midnight in Paris, whatever the browser's zone.
	svc.mustCall(t, "POST", "/v1/spend", svc.bootstrap, map[string]any{"buckets": []map[string]any{
		{"limit": "ExportsPerDay", "bucket_id": "acct-42", "cost": 2}}}, http.StatusOK, nil)
	p.do("look up the quota's bucket",
		chromedp.SendKeys(chromedp.CSS("#lk-limit"), "E"),
		p.typeInto("#lk-bucket", "acct-42\n"))
	p.waitText("the usage of the day", "#lk-used", "Used 2 of 5 this day (Europe/Paris), resets in ")
	p.waitTextIs("and what is left", "#lk-remaining", "3")
	paris, msg := limiter.LoadZone("Europe/Paris")
	if msg != "" {
		t.Fatal(msg)
	}
	y, m, d := time.Now().In(paris).Date()
	midnight := time.Date(y, m, d+1, 0, 0, 0, 0, paris)
	p.waitText("the window ends at midnight in Paris", "#lk-reset-at", midnight.UTC().Format("2006-01-02 15:04")+" UTC")
	if p.visible("#lk-held") {
		t.Error("a quota's look-up shows leases held")
	}

	// The kind is fixed once a limit exists: the control is disabled, and
	// says why.
	editOf := func(name string) string {
		return fmt.Sprintf(`#limits-table tr[data-limit=%q] [data-act="edit-limit"]`, name)
	}
	p.do("edit the concurrency limit", chromedp.Click(chromedp.CSS(editOf("ModelCalls"))), chromedp.WaitVisible(chromedp.CSS("#lf-kind")))
	p.waitValue("the dialog shows its kind", "#lf-kind", "concurrency")
	p.waitText("and why it is fixed", "#lf-kind-hint", "Fixed: ModelCalls is a concurrency limit")
	if !adminEval[bool](p, "read the kind control", `document.querySelector('#lf-kind').disabled && document.querySelector('#lf-name').disabled`) {
		t.Error("the kind or the name of an existing limit can be changed")
	}
	p.do("cancel the edit", chromedp.Click(chromedp.CSS(`#limit-dialog [data-close]`)), chromedp.WaitNotVisible(chromedp.CSS("#limit-dialog")))
	p.waitFocus("the focus is back on the row's edit button", editOf("ModelCalls"))

	// A mistyped zone: the form first says that a new zone restarts the
	// usage, then shows the API's message beside the zone, and nothing
	// is written.
	p.do("edit the quota", chromedp.Click(chromedp.CSS(editOf("ExportsPerDay"))), chromedp.WaitVisible(chromedp.CSS("#lf-zone")))
	p.waitValue("the dialog shows its zone", "#lf-zone", "Europe/Paris")
	p.do("mistype the zone", p.typeInto("#lf-zone", "Europe/Pariss"))
	p.waitText("the form says the usage restarts", "#lf-restart", "starts the quota's usage again")
	p.do("save the mistyped zone", chromedp.Click(chromedp.CSS("#lf-save")))
	want := svc.fieldError(t, "PUT", "/v1/limits/ExportsPerDay", map[string]any{
		"id_format": "string", "calendar": "day", "time_zone": "Europe/Pariss", "count": 5}, "time_zone")
	p.waitTextIs("the API's message is beside the zone", "#lf-zone-error", want)
	p.waitFocus("the zone has the focus", "#lf-zone")
	if got := svc.limit(t, "ExportsPerDay")["time_zone"]; got != "Europe/Paris" {
		t.Errorf("after a refused zone, time_zone = %v", got)
	}

	// Another zone gives the quota new windows: the day's usage starts
	// again, as the form said.
	p.do("move the quota to New York",
		p.typeInto("#lf-zone", "America/New_York"),
		chromedp.Click(chromedp.CSS("#lf-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#limit-dialog")))
	p.waitText("the save says the usage restarts", "#limits-notice", "Its usage starts again in the new windows.")
	p.do("look the quota's bucket up again", chromedp.Click(chromedp.CSS("#lk-refresh")))
	p.waitText("the usage starts again", "#lk-used", "Used 0 of 5 this day (America/New_York)")

	// An override of the quota sets its count alone.
	p.do("open the new override dialog for the quota",
		chromedp.Click(chromedp.CSS("#new-override")),
		chromedp.WaitVisible(chromedp.CSS("#of-limit")),
		chromedp.SendKeys(chromedp.CSS("#of-limit"), "E"))
	p.waitValue("the count starts from the quota's", "#of-count", "5")
	p.waitTextIs("and reads as the window's", `label[for="of-count"]`, "Per window (count)")
	if p.visible("#of-burst") || p.visible("#of-period") {
		t.Error("a quota's override form shows a burst or a period")
	}
	p.do("raise the quota for one bucket",
		p.typeInto("#of-bucket", "acct-42"),
		p.typeInto("#of-count", "8"),
		chromedp.Click(chromedp.CSS("#of-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")))
	quotaCard := `#override-list li[data-limit="ExportsPerDay"][data-bucket="acct-42"]`
	p.waitText("the card shows the quota's new count", quotaCard+` [data-slot="allowance"]`, "8 per calendar day in America/New_York")
	checkFields(t, "the quota's override", svc.override(t, "ExportsPerDay", "acct-42"), map[string]any{"count": 8.0, "burst": 8.0, "period": nil})

	// An override of the concurrency limit sets its burst and lease
	// period, and the bucket holds its lease under it.
	p.do("open the new override dialog for the concurrency limit",
		chromedp.Click(chromedp.CSS("#new-override")),
		chromedp.WaitVisible(chromedp.CSS("#of-limit")),
		chromedp.SendKeys(chromedp.CSS("#of-limit"), "M"))
	p.waitValue("the burst starts from the limit's", "#of-burst", "10")
	p.waitValue("and the lease period, in words", "#of-period", "1 hour")
	if p.visible("#of-count") {
		t.Error("a concurrency limit's override form shows a count")
	}
	p.do("allow more leases for one bucket",
		p.typeInto("#of-bucket", "acct-42"),
		p.typeInto("#of-burst", "20"),
		chromedp.Click(chromedp.CSS("#of-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")))
	leaseCard := `#override-list li[data-limit="ModelCalls"][data-bucket="acct-42"]`
	p.waitText("the card shows the new burst", leaseCard+` [data-slot="allowance"]`, "At most 20 at once, leases up to 1 hour")
	checkFields(t, "the concurrency limit's override", svc.override(t, "ModelCalls", "acct-42"), map[string]any{"burst": 20.0, "count": 20.0, "period": "1h0m0s"})
	p.do("look the bucket up from its card", chromedp.Click(chromedp.CSS(leaseCard+` [data-act="check"]`)))
	p.waitTextIs("the lease is held under the override", "#lk-held", "3 of 20 held")
	if os.Getenv("RATELIMIT_SCREENSHOT") == "1" {
		p.screenshot(filepath.Join("..", "..", "docs", "admin.png"))
	}

	p.checkConsole()
}

// TestAdminPageWords checks the page's words and layout on a laptop's
// screen, 1280×757: kinds named as the API names them, a quota said to be
// one; counts in the singular for one; burst and count explained beside
// their inputs; lengths of time typed as people type them, read back in
// words and sent as the Go durations the API takes, and hostile ones
// answered in words with nothing sent; and Save in view whenever a dialog
// is open, however long it grows.
func TestAdminPageWords(t *testing.T) {
	chromium := testenv.Chromium(t)
	svc := startAdminService(t)
	svc.mustCall(t, "PUT", "/v1/limits/Logins", svc.bootstrap, map[string]any{
		"id_format": "string", "burst": 1, "count": 1, "period": "1m"}, http.StatusCreated, nil)
	svc.mustCall(t, "PUT", "/v1/limits/ExportsPerDay", svc.bootstrap, map[string]any{
		"id_format": "string", "calendar": "day", "time_zone": "Europe/Paris", "count": 5}, http.StatusCreated, nil)
	p := newAdminPage(t, chromium)
	p.do("open the page on a laptop's screen", chromedp.EmulateViewport(1280, 757),
		chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(svc.createToken(t, "ada", "admin"), "ada", "admin")

	row := func(name string) []string {
		t.Helper()
		sel := fmt.Sprintf(`#limits-table tr[data-limit=%q]`, name)
		p.waitText(name+" is listed", sel, name)
		return adminEval[[]string](p, "read the row of "+name,
			fmt.Sprintf(`[...document.querySelector('%s').cells].slice(1, 4).map(c => c.textContent.trim())`, sel))
	}
	if got, want := row("Logins"), []string{"rate", "string", "1 per minute, burst 1"}; !slices.Equal(got, want) {
		t.Errorf("row of Logins = %q, want %q", got, want)
	}
	if got, want := row("ExportsPerDay"), []string{"rate · calendar quota (day, Europe/Paris)", "string", "5 per calendar day in Europe/Paris"}; !slices.Equal(got, want) {
		t.Errorf("row of ExportsPerDay = %q, want %q", got, want)
	}

	p.do("look up a bucket of one request", p.choose("#lk-limit", "Logins"), p.typeInto("#lk-bucket", "alice\n"))
	p.waitTextIs("one request remains", "#lk-remaining", "1")
	p.waitTextIs("in the singular", "#lk-unit", "request")
	p.waitText("the notice too", "#lookup-notice", "1 request of 1 remaining")

	// The override dialog: Save in view as it opens, and burst and count
	// each explained in a sentence beside its input.
	p.do("open the new override dialog", chromedp.Click(chromedp.CSS("#new-override")), chromedp.WaitVisible(chromedp.CSS("#of-limit")))
	if !p.inView("#of-save") {
		t.Error("the override dialog opens with Save out of view")
	}
	p.do("choose the rate limit", p.choose("#of-limit", "Logins"), p.typeInto("#of-bucket", "bob"))
	p.waitText("burst is explained", "#of-burst-hint", "at once, after a quiet spell")
	p.waitText("count is explained", "#of-count-hint", "steady rate")
	p.waitValue("the period starts from the limit's, in words", "#of-period", "1 minute")

	// Lengths of time as people type them, read back in words.
	for _, tc := range []struct{ typed, words string }{
		{"1 minute", "1 minute"}, {"90 seconds", "1 minute 30 seconds"}, {"2h30m", "2 hours 30 minutes"},
		{"1h 30m", "1 hour 30 minutes"}, {"3 hours", "3 hours"}, {"1 day", "1 day"},
	} {
		p.do("type "+tc.typed, p.typeInto("#of-period", tc.typed))
		p.waitTextIs("the page reads "+tc.typed, "#of-period-words", "Reads as "+tc.words+".")
	}

	// Hostile lengths of time and counts are answered in words beside the
	// field, and nothing is sent.
	for _, tc := range []struct{ field, text, want string }{
		{"#of-period", "1e400 seconds", "without an exponent"},
		{"#of-period", "-5 minutes", "cannot be negative"},
		{"#of-period", "99999999999999999999 hours", "longer than ratelimitd can count"},
		{"#of-period", "2562048 hours", "longer than ratelimitd can count"},
		{"#of-period", "1\x00 minute", "Not a length of time"},
		{"#of-period", "90", "Add a unit: “90 seconds”"},
		{"#of-period", "1 fortnight", "“fortnight” is not a unit of time"},
		{"#of-period", strings.Repeat("1h", 100), "too long"},
		{"#of-burst", "1e400", "whole number"},
		{"#of-burst", "-1", "whole number"},
		{"#of-count", "99999999999999999999", "Too large"},
	} {
		errBox := tc.field + "-error"
		p.do("enter "+tc.text, p.typeInto("#of-period", "1 minute"), p.typeInto("#of-burst", "1"), p.typeInto("#of-count", "1"),
			p.enter(tc.field, tc.text), chromedp.Click(chromedp.CSS("#of-save")))
		p.waitText(fmt.Sprintf("%q is answered in words", tc.text), errBox, tc.want)
		p.waitFocus("the field has the focus", tc.field)
		if got := adminEval[string](p, "read the error", fmt.Sprintf(`document.querySelector(%q).textContent`, errBox)); strings.Contains(got, "Go duration") {
			t.Errorf("%q: %q speaks of Go", tc.text, got)
		}
		if !p.inView("#of-save") {
			t.Errorf("with the error of %q shown, Save is out of view", tc.text)
		}
	}
	var none struct{ Overrides []any }
	svc.mustCall(t, "GET", "/v1/overrides?limit=Logins", svc.bootstrap, nil, http.StatusOK, &none)
	if len(none.Overrides) != 0 {
		t.Fatalf("a hostile value was sent: %v", none.Overrides)
	}

	p.do("save 90 seconds", p.typeInto("#of-burst", "2"), p.typeInto("#of-count", "1"), p.typeInto("#of-period", "90 seconds"),
		chromedp.Click(chromedp.CSS("#of-save")), chromedp.WaitNotVisible(chromedp.CSS("#override-dialog")))
	card := `#override-list li[data-limit="Logins"][data-bucket="bob"]`
	p.waitText("the card says it in words", card+` [data-slot="allowance"]`, "1 per 1 minute 30 seconds, burst 2")
	checkFields(t, "the override", svc.override(t, "Logins", "bob"), map[string]any{"period": "1m30s", "burst": 2.0, "count": 1.0})

	// The limit dialog: Save in view, and a length of time in words.
	p.do("open the new limit dialog", chromedp.Click(chromedp.CSS("#new-limit")), chromedp.WaitVisible(chromedp.CSS("#lf-name")))
	if !p.inView("#lf-save") {
		t.Error("the limit dialog opens with Save out of view")
	}
	p.waitText("burst is explained", "#lf-burst-hint", "at once, after a quiet spell")
	p.waitText("count is explained", "#lf-count-hint", "steady rate")
	p.do("create a limit of 100 per 2h30m",
		p.typeInto("#lf-name", "Reports"), p.choose("#lf-id-format", "string"),
		p.typeInto("#lf-burst", "100"), p.typeInto("#lf-count", "100"), p.typeInto("#lf-period", "2 hours and 30 minutes"))
	p.waitTextIs("the page reads it", "#lf-period-words", "Reads as 2 hours 30 minutes.")
	p.do("save it", chromedp.Click(chromedp.CSS("#lf-save")), chromedp.WaitNotVisible(chromedp.CSS("#limit-dialog")))
	p.waitText("the creation is confirmed in words", "#limits-notice", "Created the limit Reports: 100 per 2 hours 30 minutes, burst 100")
	checkFields(t, "the limit", svc.limit(t, "Reports"), map[string]any{"period": "2h30m0s"})

	p.checkConsole()
}

func historyHasRow(rows [][]string, want ...string) bool {
	return slices.ContainsFunc(rows, func(r []string) bool { return slices.Equal(r, want) })
}

// ---- the service ----

// adminService is the program started by run, with its bootstrap token.
type adminService struct {
	*service
	bootstrap string
}

// startAdminService runs "ratelimitd serve" on a free port with a fresh
// SQLite database; the test fails unless it stops cleanly when it ends.
func startAdminService(t *testing.T) *adminService {
	t.Helper()
	bootstrap := testenv.RandomName("bootstrap-")
	s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": bootstrap, "RATELIMIT_SHUTDOWN_TIMEOUT": "5s"})
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("the service's log:\n%s", s.stderr.String())
		}
	})
	return &adminService{service: s, bootstrap: bootstrap}
}

// call sends body, when not nil, as JSON and returns the status and the
// answer.
func (s *adminService) call(t *testing.T, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	status, out := s.service.call(t, method, path, token, string(raw))
	return status, []byte(out)
}

// mustCall is call that fails the test unless the status is want, and
// decodes the answer into out unless it is nil.
func (s *adminService) mustCall(t *testing.T, method, path, token string, body any, want int, out any) {
	t.Helper()
	status, b := s.call(t, method, path, token, body)
	if status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, status, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

func (s *adminService) createToken(t *testing.T, name, scope string) string {
	t.Helper()
	var out struct{ Token string }
	s.mustCall(t, "POST", "/v1/tokens", s.bootstrap, map[string]any{"name": name, "scope": scope}, http.StatusCreated, &out)
	return out.Token
}

func adminCheckBody(bucketID string) map[string]any {
	return map[string]any{"buckets": []map[string]any{{"limit": adminLimit, "bucket_id": bucketID, "cost": 0}}}
}

// fieldError returns the API's message for one field of an invalid body,
// which the API refuses with a 422 and writes nothing of.
func (s *adminService) fieldError(t *testing.T, method, path string, body map[string]any, field string) string {
	t.Helper()
	var p struct {
		Errors []struct{ Field, Message string }
	}
	s.mustCall(t, method, path, s.bootstrap, body, http.StatusUnprocessableEntity, &p)
	for _, e := range p.Errors {
		if e.Field == field {
			return e.Message
		}
	}
	t.Fatalf("no error for %s in %+v", field, p.Errors)
	return ""
}

// override returns the one override of the bucket, as the API has it.
func (s *adminService) override(t *testing.T, limit, bucketID string) map[string]any {
	t.Helper()
	var out struct{ Overrides []map[string]any }
	s.mustCall(t, "GET", "/v1/overrides?limit="+limit+"&bucket_id="+bucketID, s.bootstrap, nil, http.StatusOK, &out)
	if len(out.Overrides) != 1 {
		t.Fatalf("%d overrides of %s, want 1", len(out.Overrides), bucketID)
	}
	return out.Overrides[0]
}

// limit returns a limit as the API has it.
func (s *adminService) limit(t *testing.T, name string) map[string]any {
	t.Helper()
	var out map[string]any
	s.mustCall(t, "GET", "/v1/limits/"+name, s.bootstrap, nil, http.StatusOK, &out)
	return out
}

// checkFields fails the test for every field of got that is not as in
// want (JSON numbers are float64, a missing or null field nil).
func checkFields(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s = %v, want %v", what, k, got[k], w)
		}
	}
}

// ---- the browser ----

// adminPage is a tab of a headless Chromium, and the steps of a test in it.
type adminPage struct {
	t   *testing.T
	ctx context.Context

	mu      sync.Mutex
	console []string
}

// adminStepTimeout bounds each step; the whole walk takes a few seconds.
const adminStepTimeout = 15 * time.Second

func newAdminPage(t *testing.T, chromium string) *adminPage {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		// The date picker's fields follow the browser's language.
		chromedp.Flag("lang", "en-US"),
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	// The first action starts the browser; it must not have a deadline,
	// which would end the browser with it.
	if err := chromedp.Do(ctx); err != nil {
		testenv.Unavailable(t, "chromium", err)
	}
	p := &adminPage{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			// The API's 4xx answers are logged by the network as errors;
			// anything else that is an error is the page's fault.
			if m.IsException() || m.Type == chromedp.ConsoleError && m.Source != "network" ||
				strings.Contains(m.Text, "Content Security Policy") {
				p.mu.Lock()
				p.console = append(p.console, m.String())
				p.mu.Unlock()
			}
		}
	}()
	for _, call := range []func() error{
		func() error {
			_, err := chromedp.Call(ctx, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: adminZone})
			return err
		},
		func() error {
			_, err := chromedp.Call(ctx, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: "en-US"})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatalf("setting up the browser: %v", err)
		}
	}
	return p
}

// do runs the actions of one step, failing the test with its name.
func (p *adminPage) do(step string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", step, err)
	}
}

// adminEval evaluates a JavaScript expression in the page.
func adminEval[T any](p *adminPage, step, expr string, opts ...chromedp.EvaluateOption) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		p.t.Fatalf("%s: %v", step, err)
	}
	return v
}

// waitFor waits until the element that sel finds is visible and test
// holds for its text or value, and says what it saw when it never does.
func (p *adminPage) waitFor(step, sel, test, prop, want string) {
	p.t.Helper()
	fn := fmt.Sprintf(`(sel, want) => {
		const el = document.querySelector(sel);
		if (!el || !el.checkVisibility()) return false;
		const got = el.%s.replace(/\s+/g, ' ').trim();
		return %s;
	}`, prop, test)
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.PollFunction[bool](fn,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(adminStepTimeout-time.Second),
		chromedp.WithPollingArgs(sel, want)))
	if err != nil {
		got := adminEval[string](p, step, fmt.Sprintf(`(el => el ? (el.checkVisibility() ? '' : '(hidden) ') + el.%s : '(missing)')(document.querySelector(%q))`, prop, sel))
		p.t.Fatalf("%s: %s: want %q, have %q: %v", step, sel, want, got, err)
	}
}

func (p *adminPage) waitText(step, sel, want string) {
	p.t.Helper()
	p.waitFor(step, sel, "got.includes(want)", "textContent", want)
}

func (p *adminPage) waitTextIs(step, sel, want string) {
	p.t.Helper()
	p.waitFor(step, sel, "got === want", "textContent", want)
}

func (p *adminPage) waitValue(step, sel, want string) {
	p.t.Helper()
	p.waitFor(step, sel, "got === want", "value", want)
}

// waitFocus waits until the element that sel finds has the focus, and
// says where the focus is when it never comes.
func (p *adminPage) waitFocus(step, sel string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.PollFunction[bool](`(sel) => document.activeElement === document.querySelector(sel)`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(adminStepTimeout-time.Second),
		chromedp.WithPollingArgs(sel)))
	if err != nil {
		at := adminEval[string](p, step, `(el => el ? el.outerHTML.slice(0, 200) : '(none)')(document.activeElement)`)
		p.t.Fatalf("%s: the focus is not on %s but on %s: %v", step, sel, at, err)
	}
}

// visible reports whether the element that sel finds is shown now.
func (p *adminPage) visible(sel string) bool {
	p.t.Helper()
	return adminEval[bool](p, "see whether "+sel+" is shown", fmt.Sprintf(`document.querySelector(%q)?.checkVisibility() ?? false`, sel))
}

// typeInto replaces the text of a field: it empties the field, then types
// the text key by key. (chromedp.SetValue cannot set an empty value.)
func (p *adminPage) typeInto(sel, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).value = ''`, sel)),
		chromedp.SendKeys(chromedp.CSS(sel), text),
	)
}

// choose picks the option of a select by its value, as a user's choice
// does, change event included.
func (p *adminPage) choose(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(el => { el.value = %q; el.dispatchEvent(new Event('change', { bubbles: true })); })(document.querySelector(%q))`, value, sel))
}

// setValue puts text into a field as a paste would, input event included:
// text a keyboard cannot type, such as NUL.
func (p *adminPage) setValue(sel, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(el => { el.value = %q; el.dispatchEvent(new Event('input', { bubbles: true })); })(document.querySelector(%q))`, text, sel))
}

// enter types text into a field, or pastes it when a keyboard cannot type
// it (NUL).
func (p *adminPage) enter(sel, text string) chromedp.Action[chromedp.Void] {
	if strings.ContainsFunc(text, func(r rune) bool { return r < ' ' }) {
		return p.setValue(sel, text)
	}
	return p.typeInto(sel, text)
}

// inView reports whether the element that sel finds is wholly inside the
// viewport and on top there, where a click lands on it.
func (p *adminPage) inView(sel string) bool {
	p.t.Helper()
	return adminEval[bool](p, "see whether "+sel+" is in view", fmt.Sprintf(`(el => {
		const r = el.getBoundingClientRect();
		if (r.width === 0 || r.top < 0 || r.left < 0 || r.bottom > innerHeight || r.right > innerWidth) return false;
		const at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
		return el === at || el.contains(at);
	})(document.querySelector(%q))`, sel))
}

// signIn pastes a token and waits for the page to show who it is.
func (p *adminPage) signIn(token, name, scope string) {
	p.t.Helper()
	p.do("paste the token", p.typeInto("#token", token+"\n"))
	p.waitTextIs("the page shows the token's name", "#who-name", name)
	p.waitTextIs("the page shows the token's scope", "#who-scope", scope)
}

func (p *adminPage) screenshot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(name, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("wrote %s", name)
}

// checkConsole fails the test for every script error and every refusal
// of the Content-Security-Policy that the page met.
func (p *adminPage) checkConsole() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.console {
		p.t.Errorf("browser console: %s", m)
	}
}
