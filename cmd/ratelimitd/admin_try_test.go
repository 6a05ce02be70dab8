package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestAdminPageTryForwardAuth: a platform engineer pastes the URL nginx
// calls and the headers it sends into the "try a request" box and reads,
// for each d, the descriptor made, the rule matched, the limit and the
// canonical bucket id, or why no descriptor is made; a call the route
// would refuse shows the refusal beside the field; and trying spends
// nothing, as the real call afterwards shows.
func TestAdminPageTryForwardAuth(t *testing.T) {
	chromium := testenv.Chromium(t)
	svc := startAdminService(t)
	svc.mustCall(t, "PUT", "/v1/limits/PerClient", svc.bootstrap, map[string]any{
		"id_format": "ip_address", "burst": 1, "count": 1, "period": "1h"}, http.StatusCreated, nil)
	var rule struct{ ID string }
	svc.mustCall(t, "POST", "/v1/rules", svc.bootstrap, map[string]any{
		"domain": "web", "descriptor": []map[string]any{{"key": "remote_address"}}, "limit": "PerClient"}, http.StatusCreated, &rule)
	token := svc.createToken(t, "pat", "decide")
	p := newAdminPage(t, chromium)
	p.do("open the page", chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(token, "pat", "decide")
	p.waitText("the rule is listed", "#rules-table", "remote_address=(any)")

	p.do("try a call of nginx",
		p.typeInto("#try-url", "http://ratelimitd:8080/v1/forward-auth/web?d=remote_address&d=header:X-Api-Key:api_key"),
		p.typeInto("#try-headers", "X-Forwarded-For: 6.6.6.6, ::ffff:198.51.100.7\nX-Forwarded-Uri: /orders/7"),
		chromedp.Click(chromedp.CSS(`#try-form button[type="submit"]`)))
	p.waitText("the client address behind the trusted gateway", "#try-client", "198.51.100.7")
	row := func(d string) []string {
		return adminEval[[]string](p, "read the row of "+d,
			`[...document.querySelector('#try-table tr[data-d="`+d+`"]').cells].map(c => c.textContent.trim())`)
	}
	if got := row("d[0]"); len(got) != 5 || got[1] != "remote_address=198.51.100.7" || got[2] != "remote_address=(any)" ||
		got[3] != "PerClient" || got[4] != "198.51.100.7" {
		t.Errorf("d[0] = %q", got)
	}
	if got := row("d[1]"); len(got) != 5 || !strings.Contains(got[1], "X-Api-Key is absent or empty") || got[3] != "" {
		t.Errorf("d[1] = %q", got)
	}

	p.do("try a call whose URI is refused",
		p.typeInto("#try-url", "/v1/forward-auth/web?d=path"),
		p.typeInto("#try-headers", "X-Forwarded-Uri: /a%00b"),
		chromedp.Click(chromedp.CSS(`#try-form button[type="submit"]`)))
	p.waitText("the refusal names the header", "#try-headers-error", "control character")
	p.do("try a URL that is no forward auth's",
		p.typeInto("#try-url", "/v1/spend"),
		chromedp.Click(chromedp.CSS(`#try-form button[type="submit"]`)))
	p.waitText("the URL is refused", "#try-url-error", "/v1/forward-auth/{domain}")

	// Three tries spent nothing: the one token of the bucket is left.
	req, _ := http.NewRequest(http.MethodGet, svc.url+"/v1/forward-auth/web?d=remote_address", nil)
	req.Header.Set("X-Ratelimit-Authorization", "Bearer "+token)
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the real call after the tries: %d", res.StatusCode)
	}
	p.checkConsole()
}
