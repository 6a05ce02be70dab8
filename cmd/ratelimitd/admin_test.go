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

	// The limit is in the list with its id format, defaults, shadow flag
	// and number of overrides.
	row := fmt.Sprintf(`#limits-table tr[data-limit=%q]`, adminLimit)
	p.waitText("the limit is listed", row, adminLimit)
	cells := adminEval[[]string](p, "read the limit's row",
		fmt.Sprintf(`[...document.querySelector('%s').cells].map(c => c.textContent.trim())`, row))
	if want := []string{"reg_id", "300 per 3h, burst 300", "No", "0"}; len(cells) < 5 || !slices.Equal(cells[1:4], want[:3]) || !strings.HasPrefix(cells[4], want[3]) {
		t.Errorf("limit row = %q, want %q after the name", cells, want)
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
	p.waitValue("and its period", "#of-period", "3h")
	p.do("fill the form with a typo",
		p.typeInto("#of-bucket", adminBucket+"x"),
		p.typeInto("#of-burst", "600"),
		p.typeInto("#of-comment", "Migration week, ticket 4711"),
		chromedp.Click(chromedp.CSS("#of-save")),
	)
	want := svc.fieldError(t, map[string]any{"limit": adminLimit, "bucket_id": adminBucket + "x", "burst": 600, "count": 300, "period": "3h"}, "bucket_id")
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
	p.waitText("the card shows the new allowance", card+` [data-slot="allowance"]`, "300 per 3h, burst 600")

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
	if got := svc.override(t, adminBucket)["expires_at"]; got != expires.UTC().Format(time.RFC3339) {
		t.Errorf("stored expires_at = %v, want %s", got, expires.UTC().Format(time.RFC3339))
	}
	if os.Getenv("RATELIMIT_SCREENSHOT") == "1" {
		p.screenshot(filepath.Join("..", "..", "docs", "admin.png"))
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

	// Someone else changes the override while the staffer edits it: the
	// save is refused with 412, and the form shows the other change.
	p.do("edit the override again", chromedp.Click(chromedp.CSS(card+` [data-act="edit"]`)), chromedp.WaitVisible(chromedp.CSS("#of-comment")))
	id, _ := svc.override(t, adminBucket)["id"].(string)
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

// fieldError returns the API's message for one field of an invalid new
// override.
func (s *adminService) fieldError(t *testing.T, body map[string]any, field string) string {
	t.Helper()
	var p struct {
		Errors []struct{ Field, Message string }
	}
	s.mustCall(t, "POST", "/v1/overrides", s.bootstrap, body, http.StatusUnprocessableEntity, &p)
	for _, e := range p.Errors {
		if e.Field == field {
			return e.Message
		}
	}
	t.Fatalf("no error for %s in %+v", field, p.Errors)
	return ""
}

// override returns the one override of the bucket, as the API has it.
func (s *adminService) override(t *testing.T, bucketID string) map[string]any {
	t.Helper()
	var out struct{ Overrides []map[string]any }
	s.mustCall(t, "GET", "/v1/overrides?limit="+adminLimit+"&bucket_id="+bucketID, s.bootstrap, nil, http.StatusOK, &out)
	if len(out.Overrides) != 1 {
		t.Fatalf("%d overrides of %s, want 1", len(out.Overrides), bucketID)
	}
	return out.Overrides[0]
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
func adminEval[T any](p *adminPage, step, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", step, err)
	}
	return v
}

// poll waits until a JavaScript function of no arguments returns true.
func (p *adminPage) poll(step, fn string, args ...any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, adminStepTimeout)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.PollFunction[bool](fn,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(adminStepTimeout-time.Second),
		chromedp.WithPollingArgs(args...)))
	if err != nil {
		p.t.Fatalf("%s: %v", step, err)
	}
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

// waitFocus waits until the element that sel finds has the focus.
func (p *adminPage) waitFocus(step, sel string) {
	p.t.Helper()
	p.poll(step, `(sel) => document.activeElement === document.querySelector(sel)`, sel)
}

// typeInto replaces the text of a field: it empties the field, then types
// the text key by key. (chromedp.SetValue cannot set an empty value.)
func (p *adminPage) typeInto(sel, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).value = ''`, sel)),
		chromedp.SendKeys(chromedp.CSS(sel), text),
	)
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
