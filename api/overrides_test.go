package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
)

func TestOverrides(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			support := e.token("alice", auth.Support)
			e.limit("PerIP", "ip_address", 10, 10, "1m")

			// A bucket id in another notation is stored canonical.
			res := e.do("POST", "/v1/overrides", support, obj{
				"limit": "PerIP", "bucket_id": "::ffff:192.0.2.1", "burst": 100, "count": 100, "period": "60m",
				"comment": "ticket 1", "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			}).expect(t, http.StatusCreated)
			o := res.object(t)
			id, _ := o["id"].(string)
			if o["bucket_id"] != "192.0.2.1" || o["period"] != "1h0m0s" || o["updated_by"] != "alice" ||
				o["enabled"] != true || o["version"] != float64(1) || o["expires_at"] == nil {
				t.Errorf("created %v", o)
			}
			if loc := res.header.Get("Location"); loc != "/v1/overrides/"+id {
				t.Errorf("Location %q", loc)
			}
			if tag := res.header.Get("ETag"); tag != `"1"` {
				t.Errorf("ETag %q", tag)
			}
			// The same bucket in another notation is a duplicate.
			e.do("POST", "/v1/overrides", support, obj{"limit": "PerIP", "bucket_id": "192.0.2.1", "unlimited": true}).
				expect(t, http.StatusConflict)

			got := e.do("GET", "/v1/overrides/"+id, support, nil).expect(t, http.StatusOK)
			if got.header.Get("ETag") != `"1"` {
				t.Errorf("ETag %q", got.header.Get("ETag"))
			}

			// PATCH: stale and weak If-Match fail, the current one passes.
			patch := func(body any, ifMatch string) *response {
				h := []string{"Content-Type", "application/merge-patch+json"}
				if ifMatch != "" {
					h = append(h, "If-Match", ifMatch)
				}
				return e.do("PATCH", "/v1/overrides/"+id, support, body, h...)
			}
			patch(obj{"burst": 5}, `"7"`).expect(t, http.StatusPreconditionFailed).problem(t)
			patch(obj{"burst": 5}, `W/"1"`).expect(t, http.StatusPreconditionFailed)
			res = patch(obj{"burst": 5, "expires_at": nil}, `"9", "1"`).expect(t, http.StatusOK)
			o = res.object(t)
			if o["burst"] != float64(5) || o["expires_at"] != nil || o["version"] != float64(2) || o["count"] != float64(100) {
				t.Errorf("patched %v", o)
			}
			if res.header.Get("ETag") != `"2"` {
				t.Errorf("ETag after patch %q", res.header.Get("ETag"))
			}
			patch(obj{"burst": 6}, `"1"`).expect(t, http.StatusPreconditionFailed)
			o = patch(obj{"unlimited": true}, "*").expect(t, http.StatusOK).object(t)
			if o["burst"] != nil || o["count"] != nil || o["period"] != nil || o["unlimited"] != true {
				t.Errorf("unlimited %v", o)
			}
			// Ending unlimited needs the parameters anew.
			p := patch(obj{"unlimited": false}, "").expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "burst", "count", "period")
			o = patch(obj{"unlimited": false, "burst": 0, "count": 1, "period": "1s", "enabled": false}, "").
				expect(t, http.StatusOK).object(t)
			if o["burst"] != float64(0) || o["enabled"] != false || o["version"] != float64(4) {
				t.Errorf("blocked %v", o)
			}
			e.do("PATCH", "/v1/overrides/nosuch", support, obj{"burst": 1}).expect(t, http.StatusNotFound)

			e.do("DELETE", "/v1/overrides/"+id, e.admin, nil).expect(t, http.StatusNoContent)
			e.do("GET", "/v1/overrides/"+id, support, nil).expect(t, http.StatusNotFound)
			e.do("DELETE", "/v1/overrides/"+id, support, nil).expect(t, http.StatusNotFound)

			// The history outlives the override.
			var history struct {
				Entries []struct {
					Actor, Action string
					Before, After obj
				} `json:"entries"`
			}
			e.do("GET", "/v1/overrides/"+id+"/history", support, nil).expect(t, http.StatusOK).json(t, &history)
			var actions []string
			for _, h := range history.Entries {
				actions = append(actions, h.Action+" by "+h.Actor)
			}
			want := "create by alice,update by alice,update by alice,update by alice,delete by bootstrap"
			if strings.Join(actions, ",") != want {
				t.Fatalf("history %v, want %s", actions, want)
			}
			first, last := history.Entries[0], history.Entries[len(history.Entries)-1]
			if first.Before != nil || first.After["burst"] != float64(100) || last.After != nil || last.Before["burst"] != float64(0) {
				t.Errorf("history documents: first %v, last %v", first, last)
			}
			if u := history.Entries[1]; u.Before["burst"] != float64(100) || u.After["burst"] != float64(5) {
				t.Errorf("update entry %v", u)
			}
			e.do("GET", "/v1/overrides/nosuch/history", support, nil).expect(t, http.StatusNotFound)
		})
	}
}

func TestListOverrides(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.limit("PerAccount", "reg_id", 10, 10, "1m")
			e.limit("PerDomain", "domain", 10, 10, "1m")
			for i := range 7 {
				e.override(obj{"limit": "PerAccount", "bucket_id": fmt.Sprint(1000 + i), "unlimited": true,
					"enabled": i%2 == 0, "comment": fmt.Sprintf("Ticket-%d", i)})
			}
			e.override(obj{"limit": "PerDomain", "bucket_id": "Example.COM", "unlimited": true})
			e.override(obj{"limit": "PerDomain", "bucket_id": "1000.example", "unlimited": true, "comment": "x"})

			// list pages through every override the query selects.
			list := func(query string, pageSize int) []obj {
				t.Helper()
				var all []obj
				token := ""
				for pages := 0; ; pages++ {
					q, _ := url.ParseQuery(query)
					q.Set("page_size", fmt.Sprint(pageSize))
					if token != "" {
						q.Set("page_token", token)
					}
					var page struct {
						Overrides     []obj  `json:"overrides"`
						NextPageToken string `json:"next_page_token"`
					}
					e.do("GET", "/v1/overrides?"+q.Encode(), e.admin, nil).expect(t, http.StatusOK).json(t, &page)
					all = append(all, page.Overrides...)
					if page.NextPageToken == "" {
						return all
					}
					if pages > 20 {
						t.Fatal("endless pages")
					}
					token = page.NextPageToken
				}
			}
			if got := list("", 2); len(got) != 9 {
				t.Errorf("all: %d", len(got))
			}
			all := list("", 1000)
			if all[0]["bucket_id"] != "1000.example" {
				t.Errorf("not newest first: %v", all[0])
			}
			if got := list("limit=PerAccount&enabled=true", 3); len(got) != 4 {
				t.Errorf("enabled of PerAccount: %d", len(got))
			}
			if got := list("enabled=false", 2); len(got) != 3 {
				t.Errorf("disabled: %d", len(got))
			}
			if got := list("q=ticket-", 2); len(got) != 7 {
				t.Errorf("q: %d", len(got))
			}
			// A bucket id in any notation, by the given limit's format ...
			if got := list("limit=PerDomain&bucket_id=EXAMPLE.com.", 5); len(got) != 1 || got[0]["bucket_id"] != "example.com" {
				t.Errorf("bucket_id of PerDomain: %v", got)
			}
			if got := list("limit=PerAccount&bucket_id=01000", 5); len(got) != 1 || got[0]["bucket_id"] != "1000" {
				t.Errorf("bucket_id of PerAccount: %v", got)
			}
			// ... or by every limit's.
			if got := list("bucket_id=example.COM", 5); len(got) != 1 {
				t.Errorf("bucket_id of any limit: %v", got)
			}
			if got := list("bucket_id=01001", 5); len(got) != 1 || got[0]["bucket_id"] != "1001" {
				t.Errorf("reg id of any limit: %v", got)
			}

			bad := map[string][]string{
				"page_size=0":                      {"page_size"},
				"page_size=1001":                   {"page_size"},
				"page_size=ten":                    {"page_size"},
				"enabled=yes":                      {"enabled"},
				"limit=No%20Such":                  {"limit"},
				"limit=NoSuch":                     {"limit"},
				"limit=PerAccount&bucket_id=x.com": {"bucket_id"},
				"bucket_id=%20":                    {"bucket_id"},
				"page_token=garbage":               {"page_token"},
				"pagesize=10&enabled=1":            {"pagesize", "enabled"},
				"limit=PerAccount&limit=PerDomain": {"limit"},
			}
			for query, fields := range bad {
				p := e.do("GET", "/v1/overrides?"+query, e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, fields...)
			}
		})
	}
}
