package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestServingBesideRowsLeftOut: a stored limit whose time zone the binary
// lacks, with its override, and a rule that a newer version wrote, put
// into the database with SQL, stop no replica, on both engines. A replica
// that starts is ready, serves the other limits, and reports the rows in
// /v1/status, in its metrics and in its log; one already running applies
// the limits created after them.
func TestServingBesideRowsLeftOut(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			url := "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
			if engine == "postgres" {
				url = testenv.Postgres(t)
			}
			env := func() map[string]string {
				return map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_rows", "RATELIMIT_DATABASE_URL": url, "RATELIMIT_GRPC_ADDR": ""}
			}
			running := startServe(t, env())
			running.waitReady(t)
			mustCall := func(s *service, method, path, body string, want int) string {
				t.Helper()
				code, answer := s.call(t, method, path, "rlt_rows", body)
				if code != want {
					t.Fatalf("%s %s: %d %s, want %d", method, path, code, answer, want)
				}
				return answer
			}
			mustCall(running, "PUT", "/v1/limits/Good", `{"id_format":"string","burst":2,"count":2,"period":"1m"}`, 201)
			mustCall(running, "PUT", "/v1/limits/Daily", `{"id_format":"string","calendar":"day","time_zone":"Europe/Paris","count":5}`, 201)
			mustCall(running, "POST", "/v1/overrides", `{"limit":"Daily","bucket_id":"b","burst":7,"count":7}`, 201)
			var rule struct{ ID string }
			if err := json.Unmarshal([]byte(mustCall(running, "POST", "/v1/rules", `{"domain":"d","descriptor":[{"key":"k"}],"limit":"Good"}`, 201)), &rule); err != nil {
				t.Fatal(err)
			}
			testenv.Corrupt(t, url,
				testenv.Corruption{SQL: "UPDATE limits SET time_zone = 'localtime' WHERE name = 'Daily'", Entity: "limit", ID: "Daily"},
				testenv.Corruption{SQL: `UPDATE rules SET descriptor = '[{"key":"k","regex":"a.*"}]' WHERE id = $1`, Args: []any{rule.ID},
					Entity: "rule", ID: rule.ID})
			// The running replica applies a limit created after them.
			mustCall(running, "PUT", "/v1/limits/Later", `{"id_format":"string","burst":1,"count":1,"period":"1m"}`, 201)
			spend := `{"buckets":[{"limit":"Later","bucket_id":"x"}]}`
			if answer := mustCall(running, "POST", "/v1/spend", spend, 200); !strings.Contains(answer, `"allowed":true`) {
				t.Errorf("the running replica's spend of a later limit: %s", answer)
			}

			fresh := startServe(t, env())
			fresh.waitReady(t)
			for name, s := range map[string]*service{"running": running, "fresh": fresh} {
				if answer := mustCall(s, "POST", "/v1/check", `{"buckets":[{"limit":"Good","bucket_id":"a"}]}`, 200); !strings.Contains(answer, `"allowed":true`) {
					t.Errorf("%s: the good limit: %s", name, answer)
				}
				mustCall(s, "POST", "/v1/check", `{"buckets":[{"limit":"Daily","bucket_id":"b"}]}`, 422)
				var st struct {
					Snapshot struct {
						LeftOut []struct {
							Entity, ID, Reason string
							Limit              *string
						} `json:"left_out"`
					}
				}
				if err := json.Unmarshal([]byte(mustCall(s, "GET", "/v1/status", "", 200)), &st); err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, r := range st.Snapshot.LeftOut {
					limit := "-"
					if r.Limit != nil {
						limit = *r.Limit
					}
					got = append(got, r.Entity+" "+r.ID+" "+limit+" "+strings.SplitN(r.Reason, ":", 2)[0])
				}
				want := "limit Daily - time_zone|override " + overrideOf(t, s, "Daily") + " Daily its limit Daily is left out|rule " + rule.ID + " Good holds what this version cannot read"
				if strings.Join(got, "|") != want {
					t.Errorf("%s: left out\n%s\nwant\n%s", name, strings.Join(got, "|"), want)
				}
				res, err := http.Get(s.url + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				metrics, _ := io.ReadAll(res.Body)
				res.Body.Close()
				for _, m := range []string{`ratelimitd_snapshot_left_out{entity="limit"} 1`, `ratelimitd_snapshot_left_out{entity="override"} 1`, `ratelimitd_snapshot_left_out{entity="rule"} 1`} {
					if !strings.Contains(string(metrics), m) {
						t.Errorf("%s: the metrics lack %s", name, m)
					}
				}
			}
			if n := len(regexp.MustCompile(`left out of the snapshot`).FindAllString(fresh.stderr.String(), -1)); n != 3 {
				t.Errorf("%d log lines of rows left out, want 3:\n%s", n, fresh.stderr.String())
			}
		})
	}
}

// overrideOf returns the id of the one override of limit.
func overrideOf(t *testing.T, s *service, limit string) string {
	t.Helper()
	code, body := s.call(t, "GET", "/v1/overrides?limit="+limit, "rlt_rows", "")
	var page struct{ Overrides []struct{ ID string } }
	if err := json.Unmarshal([]byte(body), &page); code != http.StatusOK || err != nil || len(page.Overrides) != 1 {
		t.Fatalf("overrides of %s: %d %s", limit, code, body)
	}
	return page.Overrides[0].ID
}

// TestAdminPageRowsLeftOut: the admin page shows a limit, its override
// and a rule that the service left out as not in force, each with the
// reason, and lists them above the limits.
func TestAdminPageRowsLeftOut(t *testing.T) {
	chromium := testenv.Chromium(t)
	url := "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
	svc := &adminService{service: startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "rlt_page", "RATELIMIT_DATABASE_URL": url}), bootstrap: "rlt_page"}
	svc.mustCall(t, "PUT", "/v1/limits/Daily", svc.bootstrap, map[string]any{"id_format": "string", "calendar": "day", "time_zone": "Europe/Paris", "count": 5},
		http.StatusCreated, nil)
	svc.mustCall(t, "PUT", "/v1/limits/Good", svc.bootstrap, map[string]any{"id_format": "string", "burst": 2, "count": 2, "period": "1m"}, http.StatusCreated, nil)
	svc.mustCall(t, "POST", "/v1/overrides", svc.bootstrap, map[string]any{"limit": "Daily", "bucket_id": "b", "burst": 7, "count": 7}, http.StatusCreated, nil)
	o := svc.override(t, "Daily", "b")
	var rule struct{ ID string }
	svc.mustCall(t, "POST", "/v1/rules", svc.bootstrap, map[string]any{"domain": "d", "descriptor": []map[string]any{{"key": "k"}}, "limit": "Good"},
		http.StatusCreated, &rule)
	testenv.Corrupt(t, url,
		testenv.Corruption{SQL: "UPDATE limits SET time_zone = 'localtime' WHERE name = 'Daily'", Entity: "limit", ID: "Daily"},
		testenv.Corruption{SQL: `UPDATE rules SET descriptor = '[{"key":"k","regex":"a.*"}]' WHERE id = $1`, Args: []any{rule.ID},
			Entity: "rule", ID: rule.ID})
	// The service sees the rows within a second (SQLite is polled).
	svc.waitFor(t, func() bool {
		_, body := svc.call(t, "GET", "/v1/status", svc.bootstrap, nil)
		return strings.Contains(string(body), `"entity":"rule"`)
	})

	token := svc.createToken(t, "ada", "admin")
	p := newAdminPage(t, chromium)
	p.do("open the page", chromedp.Navigate(svc.url+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.signIn(token, "ada", "admin")
	p.waitText("the limit is not in force", `#limits-table tr[data-limit="Daily"]`, "Not in force time_zone: must be an IANA zone name")
	p.waitText("the rule is not in force", "#rules-table tbody tr", "Not in force holds what this version cannot read")
	p.waitText("the list names the override", "#left-out-list", "override "+o["id"].(string)+" of Daily: its limit Daily is left out")
	if p.visible(`#limits-table tr[data-limit="Good"] .left-out`) {
		t.Error("a limit in force is marked")
	}
	p.do("search the limit's overrides", chromedp.SetValue(chromedp.CSS("#s-limit"), "Daily"), chromedp.Click(chromedp.CSS(`#search-form button[type="submit"]`)))
	p.waitText("its override is not in force", `#override-list li[data-id="`+o["id"].(string)+`"]`, "Not in force its limit Daily is left out")
	p.checkConsole()
}
