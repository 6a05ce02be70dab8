package main

import (
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestAdminPageEnvoyRules: the page lists Envoy's rules beside the limits,
// and a staffer looks a bucket up by the domain and descriptor a proxy
// sends, in any notation, with the API's own message for a bad one.
func TestAdminPageEnvoyRules(t *testing.T) {
	chromium := testenv.Chromium(t)
	svc := startAdminService(t)
	svc.mustCall(t, "PUT", "/v1/limits/PerClientIP", svc.bootstrap, map[string]any{
		"id_format": "ip_address", "burst": 20, "count": 10, "period": "1s",
	}, http.StatusCreated, nil)
	svc.mustCall(t, "POST", "/v1/rules", svc.bootstrap, map[string]any{
		"domain": "edge", "descriptor": []map[string]any{{"key": "remote_address"}}, "limit": "PerClientIP",
	}, http.StatusCreated, nil)
	token := svc.createToken(t, "sam", "support")
	p := newAdminPage(t, chromium)
	p.do("open the page", chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(token, "sam", "support")

	p.waitText("the rule is listed", "#rules-table tbody tr", "edge")
	p.waitText("with its pattern", "#rules-table tbody tr", "remote_address=(any)")
	p.waitText("and its limit", "#rules-table tbody tr", "PerClientIP")

	p.do("look up by descriptor",
		chromedp.Click(chromedp.CSS(`#lookup-form input[name="by"][value="descriptor"]`)),
		chromedp.WaitVisible(chromedp.CSS("#lk-domain")),
		p.typeInto("#lk-domain", "edge"),
		p.typeInto("#lk-descriptor", "remote_address=::ffff:10.0.0.7\n"))
	p.waitTextIs("the canonical bucket", "#lk-canonical", "10.0.0.7")
	p.waitTextIs("of the rule's limit", "#lk-limit-name", "PerClientIP")
	p.waitTextIs("the bucket is full", "#lk-remaining", "20")
	p.waitText("the rule is named", "#lk-rule", "remote_address=(any)")

	var problem struct {
		Errors []struct{ Field, Message string }
	}
	svc.mustCall(t, "POST", "/v1/rules/match", svc.bootstrap, map[string]any{
		"domain": "edge", "descriptor": []map[string]any{{"key": "remote_address", "value": "nope"}},
	}, http.StatusUnprocessableEntity, &problem)
	if len(problem.Errors) != 1 || problem.Errors[0].Field != "descriptor" {
		t.Fatalf("match of a bad address: %+v", problem)
	}
	want := problem.Errors[0].Message
	p.do("look up a value that is no address", p.typeInto("#lk-descriptor", "remote_address=nope\n"))
	p.waitTextIs("the API's message is beside the descriptor", "#lk-descriptor-error", want)
	p.do("look up a descriptor no rule matches", p.typeInto("#lk-descriptor", "user=alice\n"))
	p.waitText("no rule matches", "#lookup-problem", "no rule of domain")
	p.checkConsole()
}
