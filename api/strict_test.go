package api_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
)

// TestStrictInput shows that what one database stores and the other
// refuses (NUL, invalid UTF-8) and what JSON decoders read differently (a
// key given twice) are refused alike on both engines, naming the field,
// and that nothing is written.
func TestStrictInput(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			e.limit("L", "string", 5, 5, "5s")
			o := e.override(obj{"limit": "L", "bucket_id": "a", "burst": 1, "count": 1, "period": "1s"})
			id := o["id"].(string)
			e.waitLimit("L")
			good := `"id_format": "string", "count": 1, "period": "1s"`
			bodies := []struct {
				name, method, path, body string
				status                   int
				field                    string
			}{
				{"duplicate key", "PUT", "/v1/limits/M", `{"burst": 5, ` + good + `, "burst": 5000}`, 400, "burst"},
				{"duplicate nested key", "POST", "/v1/buckets/reset", `{"buckets": [{"limit": "L", "bucket_id": "d", "bucket_id": "e"}]}`, 400, "buckets[0].bucket_id"},
				{"duplicate token name key", "POST", "/v1/tokens", `{"name": "a", "scope": "admin", "name": "b"}`, 400, "name"},
				{"duplicate patch key", "PATCH", "/v1/overrides/" + id, `{"burst": 1, "burst": 2}`, 400, "burst"},
				{"invalid UTF-8 in a comment", "POST", "/v1/overrides", `{"limit": "L", "bucket_id": "b", "unlimited": true, "comment": "x` + "\xff" + `"}`, 400, "comment"},
				{"invalid UTF-8 in a token name", "POST", "/v1/tokens", `{"name": "user` + "\xfe" + `", "scope": "admin"}`, 400, "name"},
				{"invalid UTF-8 in a bucket id", "POST", "/v1/buckets/reset", `{"buckets": [{"limit": "L", "bucket_id": "user` + "\xff" + `"}]}`, 400, "buckets[0].bucket_id"},
				{"NUL in a description", "PUT", "/v1/limits/M", `{"burst": 1, ` + good + `, "description": "a\u0000b"}`, 422, "description"},
				{"NUL in a comment", "POST", "/v1/overrides", `{"limit": "L", "bucket_id": "b", "unlimited": true, "comment": "a\u0000b"}`, 422, "comment"},
				{"NUL in a patched comment", "PATCH", "/v1/overrides/" + id, `{"comment": "a\u0000b"}`, 422, "comment"},
				{"NUL in a bucket id", "POST", "/v1/overrides", `{"limit": "L", "bucket_id": "a\u0000b", "unlimited": true}`, 422, "bucket_id"},
				{"NUL in a token name", "POST", "/v1/tokens", `{"name": "a\u0000b", "scope": "admin"}`, 422, "name"},
			}
			before := e.rows()
			for _, c := range bodies {
				res := e.do(c.method, c.path, e.admin, c.body, "If-Match", `"1"`)
				p := res.expect(t, c.status).problem(t)
				wantFields(t, p, c.field)
				if c.status == 400 && strings.HasPrefix(c.name, "duplicate") && p.Errors[0].Message != "duplicate key" {
					t.Errorf("%s: %+v", c.name, p.Errors)
				}
			}
			e.unchanged(before)

			paths := []struct{ path, field string }{
				{"/v1/limits/%00", "name"},
				{"/v1/limits/a%00b", "name"},
				{"/v1/limits/a%FFb", "name"},
				{"/v1/overrides/%00", "id"},
				{"/v1/overrides/%00/history", "id"},
				{"/v1/tokens/%00", "id"},
				{"/v1/overrides?q=a%00b", "q"},
				{"/v1/overrides?bucket_id=a%00b&limit=L", "bucket_id"},
				{"/v1/overrides?q=a%FFb", "q"},
			}
			for _, c := range paths {
				p := e.do("GET", c.path, e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, c.field)
			}
			for _, path := range []string{"/v1/limits/%00", "/v1/overrides/%00", "/v1/tokens/%00"} {
				e.do("DELETE", path, e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t)
			}
			e.unchanged(before)

			// Imported files hold the same text as bodies, and are refused
			// alike, whole.
			files := []struct{ query, body string }{
				{"kind=defaults", "Custom:\n  id_format: string\n  burst: 5\n  count: 5\n  period: 1s\n  description: \"a\\0b\"\n"},
				{"kind=overrides", "- L:\n    unlimited: true\n    ids:\n      - id: x\n        comment: \"a\\0b\"\n"},
				{"kind=overrides", "- L:\n    unlimited: true\n    ids: [\"a\\0b\"]\n"},
				{"kind=defaults", "Custom:\n  id_format: string\n  burst: 5\n  burst: 6\n  count: 5\n  period: 1s\n"},
				{"kind=defaults", "Custom:\n  id_format: string\n  burst: 5\n  count: 5\n  period: 1s\n  description: \"a\xffb\"\n"},
			}
			for _, f := range files {
				res := e.importYAML(f.query, f.body)
				if res.status != http.StatusBadRequest && res.status != http.StatusUnprocessableEntity {
					t.Errorf("import %q: %d %s", f.body, res.status, res.body)
				}
			}
			e.unchanged(before)
		})
	}
}

// TestPathDecodedOnce shows that a percent-encoded path segment names what
// it decodes to, and is not decoded twice.
func TestPathDecodedOnce(t *testing.T) {
	e := newEnv(t)
	e.limit("Abc", "string", 5, 5, "5s")
	if l := e.do("GET", "/v1/limits/%41bc", e.admin, nil).expect(t, http.StatusOK).object(t); l["name"] != "Abc" {
		t.Errorf("limit %v", l)
	}
	// %2541 is "%41" once decoded, which is no limit name: decoded twice,
	// it would be the limit Abc.
	wantFields(t, e.do("GET", "/v1/limits/%2541bc", e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t), "name")
	e.do("DELETE", "/v1/limits/%41bc", e.admin, nil).expect(t, http.StatusNoContent)
}

// TestHead shows that HEAD answers wherever GET does, with GET's status
// and headers and no body. openapi.yaml describes GET only, as RFC 9110
// makes HEAD follow from it, so HEAD goes unvalidated.
func TestHead(t *testing.T) {
	e := newEnv(t, withWeb(fstest.MapFS{"index.html": {Data: []byte("<!doctype html><title>admin</title>")}}))
	head := func(path string, status int) *http.Response {
		t.Helper()
		req, err := http.NewRequest("HEAD", e.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e.admin)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != status {
			t.Errorf("HEAD %s: %d, want %d", path, res.StatusCode, status)
		}
		return res
	}
	for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml", "/admin/", "/v1/limits", "/v1/whoami"} {
		get := e.do("GET", path, e.admin, nil).expect(t, http.StatusOK)
		res := head(path, http.StatusOK)
		if ct := res.Header.Get("Content-Type"); ct != get.header.Get("Content-Type") {
			t.Errorf("HEAD %s: Content-Type %q, GET's %q", path, ct, get.header.Get("Content-Type"))
		}
	}
	head("/v1/limits/Nope", http.StatusNotFound)
	head("/v1/check", http.StatusMethodNotAllowed)
	res := e.do("POST", "/healthz", e.admin, "{}").expect(t, http.StatusMethodNotAllowed)
	if allow := res.header.Get("Allow"); !strings.Contains(allow, "GET, HEAD") {
		t.Errorf("Allow: %q", allow)
	}
}

// TestTokenNames shows that a created token's Location answers GET, that
// the service's own actors cannot be impersonated, and that live tokens
// have unique names, on both engines.
func TestTokenNames(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			res := e.do("POST", "/v1/tokens", e.admin, obj{"name": "deploy", "scope": "decide"}).expect(t, http.StatusCreated)
			created := res.object(t)
			got := e.do("GET", res.header.Get("Location"), e.admin, nil).expect(t, http.StatusOK).object(t)
			if got["id"] != created["id"] || got["name"] != "deploy" || got["token"] != nil {
				t.Errorf("GET Location: %v", got)
			}
			for _, name := range []string{"bootstrap", "cli", "ratelimitd", "CLI"} {
				p := e.do("POST", "/v1/tokens", e.admin, obj{"name": name, "scope": "admin"}).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, "name")
			}
			e.do("POST", "/v1/tokens", e.admin, obj{"name": "deploy", "scope": "admin"}).expect(t, http.StatusConflict).problem(t)
			// A revoked token's name may be given again.
			e.do("DELETE", "/v1/tokens/"+created["id"].(string), e.admin, nil).expect(t, http.StatusNoContent)
			e.do("POST", "/v1/tokens", e.admin, obj{"name": "deploy", "scope": "admin"}).expect(t, http.StatusCreated)
			e.do("GET", "/v1/tokens/nope", e.admin, nil).expect(t, http.StatusNotFound).problem(t)
		})
	}
}

// TestServerErrorsAreProblems shows that a header block too large is
// answered as a problem, not with net/http's plain text.
func TestServerErrorsAreProblems(t *testing.T) {
	e := newEnv(t)
	req, err := http.NewRequest("GET", e.url+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("a", 100<<10))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%d %q: %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
}
