package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const defaultsYAML = `# Boulder's names need no id format.
NewOrdersPerAccount:
  burst: 300
  count: 300
  period: 180m
Custom:
  burst: 5
  count: 5
  period: 1s
  id_format: domain
  description: ours
`

const overridesYAML = `- NewOrdersPerAccount:
    burst: 3000
    count: 3000
    period: 3h
    ids:
      - "0012345"
      - id: "67890"
        comment: a big customer
- Custom:
    unlimited: true
    ids: [Example.COM]
`

// importYAML posts a YAML document.
func (e *env) importYAML(query, body string) *response {
	e.t.Helper()
	return e.do("POST", "/v1/import?"+query, e.admin, body, "Content-Type", "application/yaml")
}

type importResult struct {
	Created, Updated, Unchanged int
	Errors                      []struct {
		Line           int
		Entry, Message string
	}
}

func (e *env) imported(query, body string, created, updated, unchanged int) {
	e.t.Helper()
	var r importResult
	e.importYAML(query, body).expect(e.t, http.StatusOK).json(e.t, &r)
	if r.Created != created || r.Updated != updated || r.Unchanged != unchanged || len(r.Errors) != 0 {
		e.t.Errorf("import %s: %+v, want %d created, %d updated, %d unchanged", query, r, created, updated, unchanged)
	}
}

func TestImportExport(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			before := e.rows()
			e.imported("kind=defaults&dry_run=true", defaultsYAML, 2, 0, 0)
			e.unchanged(before)
			e.imported("kind=defaults", defaultsYAML, 2, 0, 0)
			l := e.do("GET", "/v1/limits/NewOrdersPerAccount", e.admin, nil).expect(t, http.StatusOK).object(t)
			if l["enum"] != float64(3) || l["id_format"] != "reg_id" || l["period"] != "3h0m0s" {
				t.Errorf("imported limit %v", l)
			}
			e.imported("kind=overrides", overridesYAML, 3, 0, 0)
			e.imported("kind=overrides&dry_run=false", overridesYAML, 0, 0, 3)

			res := e.do("GET", "/v1/export?kind=overrides", e.admin, nil).expect(t, http.StatusOK)
			if res.header.Get("Content-Type") != "application/yaml" || !contains(res.body, `"12345"`) || !contains(res.body, "example.com") {
				t.Errorf("export: %s %s", res.header.Get("Content-Type"), res.body)
			}
			e.imported("kind=overrides", string(res.body), 0, 0, 3)
			res = e.do("GET", "/v1/export?kind=defaults", e.admin, nil).expect(t, http.StatusOK)
			e.imported("kind=defaults", string(res.body), 0, 0, 2)

			// A bad entry: nothing is written, every entry is named.
			before = e.rows()
			bad := "- NewOrdersPerAccount:\n    burst: -1\n    count: 1\n    period: 1s\n    ids: [\"1\"]\n" +
				"- NoSuchLimit:\n    unlimited: true\n    ids: [\"1\"]\n- Custom:\n    unlimited: true\n    ids: [new.example]\n"
			var r importResult
			p := e.importYAML("kind=overrides", bad).expect(t, http.StatusUnprocessableEntity)
			p.problem(t)
			p.json(t, &r)
			if len(r.Errors) != 2 || r.Errors[0].Line != 2 || r.Errors[1].Entry != "NoSuchLimit" || r.Created != 0 {
				t.Errorf("errors %+v", r)
			}
			for name, doc := range map[string]string{
				"malformed":      "{{{",
				"not a map":      "- 1\n- 2\n",
				"wrong types":    "Custom: {burst: five, count: [1], period: 5, id_format: domain}\n",
				"huge numbers":   "Custom: {burst: 99999999999999999999, count: 1e400, period: 1s, id_format: domain}\n",
				"negative":       "Custom: {burst: -1, count: -1, period: -1s, id_format: domain}\n",
				"unknown fields": "Custom: {burst: 1, count: 1, period: 1s, id_format: domain, colour: red}\n",
				"empty strings":  "Custom: {burst: 1, count: 1, period: '', id_format: ''}\n",
				"unicode name":   "Zoë: {burst: 1, count: 1, period: 1s, id_format: string}\n",
				"no id format":   "Brand.New: {burst: 1, count: 1, period: 1s}\n",
			} {
				var r importResult
				res := e.importYAML("kind=defaults", doc).expect(t, http.StatusUnprocessableEntity)
				res.problem(t)
				res.json(t, &r)
				if len(r.Errors) == 0 {
					t.Errorf("%s: no errors in %s", name, res.body)
				}
			}
			e.unchanged(before)
		})
	}
}

func TestImportExportBadRequests(t *testing.T) {
	e := newEnv(t)
	before := e.rows()
	for query, fields := range map[string][]string{
		"":                               {"kind"},
		"kind=":                          {"kind"},
		"kind=limits":                    {"kind"},
		"kind=defaults&dry_run=maybe":    {"dry_run"},
		"kind=defaults&force=true":       {"force"},
		"kind=defaults&kind=overrides":   {"kind"},
		"dry_run=1&kind=overrides&x=&y=": {"dry_run", "x", "y"},
	} {
		p := e.importYAML(query, defaultsYAML).expect(t, http.StatusUnprocessableEntity).problem(t)
		wantFields(t, p, fields...)
	}
	for _, ct := range []string{"application/json", "text/plain", ""} {
		e.do("POST", "/v1/import?kind=defaults", e.admin, defaultsYAML, "Content-Type", ct).
			expect(t, http.StatusUnsupportedMediaType).problem(t)
	}
	for _, ct := range []string{"text/yaml", "application/x-yaml; charset=utf-8"} {
		e.do("POST", "/v1/import?kind=defaults&dry_run=true", e.admin, defaultsYAML, "Content-Type", ct).expect(t, http.StatusOK)
	}
	huge := "# " + strings.Repeat("x", 10<<20) + "\n"
	e.importYAML("kind=defaults", huge).expect(t, http.StatusRequestEntityTooLarge).problem(t)
	e.unchanged(before)
	for _, query := range []string{"", "kind=all", "kind=defaults&x=1"} {
		e.do("GET", "/v1/export?"+query, e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t)
	}
}

// TestSlowImportBody: an import may take longer to upload than the HTTP
// server's read timeout allows other requests; a body sent in two halves,
// the second after that timeout, is still read and imported.
func TestSlowImportBody(t *testing.T) {
	e := newEnv(t)
	const timeout = 200 * time.Millisecond
	hs := httptest.NewUnstartedServer(e.handler)
	hs.Config.ReadTimeout, hs.Config.WriteTimeout = timeout, timeout
	hs.Start()
	defer hs.Close()
	send := func(path, contentType, body string) (int, error) {
		pr, pw := io.Pipe()
		go func() {
			half := len(body) / 2
			_, _ = io.WriteString(pw, body[:half])
			time.Sleep(2 * timeout)
			_, _ = io.WriteString(pw, body[half:])
			_ = pw.Close()
		}()
		req, err := http.NewRequest("POST", hs.URL+path, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e.admin)
		req.Header.Set("Content-Type", contentType)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode, nil
	}
	if status, err := send("/v1/import?kind=defaults", "application/yaml", defaultsYAML); err != nil || status != http.StatusOK {
		t.Fatalf("a slow import: status %d, error %v", status, err)
	}
	// Another route with a body keeps the server's timeout.
	if status, err := send("/v1/tokens", "application/json", `{"name":"slow","scope":"decide"}`); err == nil && status < 400 {
		t.Errorf("a slow body to another route was answered %d", status)
	}
}
