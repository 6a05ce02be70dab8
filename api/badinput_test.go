package api_test

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// badCase is a request body that must be refused.
type badCase struct {
	name   string
	body   any
	status int
	// fields must all be named by the problem; none for a body that does
	// not parse.
	fields []string
}

// commonBad are the bodies every JSON write endpoint refuses the same way.
func commonBad() []badCase {
	return []badCase{
		{"empty", "", 400, nil},
		{"truncated", `{"a": `, 400, nil},
		{"not json", `limit=1`, 400, nil},
		{"two values", `{} {}`, 400, nil},
		{"trailing comma", `{"a": 1,}`, 400, nil},
		{"single quotes", `{'a': 1}`, 400, nil},
		{"null", `null`, 400, []string{"body"}},
		{"array", `[{}]`, 400, []string{"body"}},
		{"string", `"x"`, 400, []string{"body"}},
		{"unknown fields", `{"nope": 1, "Nope2": {"x": [1]}}`, 400, []string{"nope", "Nope2"}},
		{"over the limit", `{"x": "` + strings.Repeat("a", 1<<20) + `"}`, 413, nil},
	}
}

// writeEndpoint is a JSON write endpoint with its specific bad bodies.
type writeEndpoint struct {
	method, path string
	bad          []badCase
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.limit("PerName", "domain", 5, 5, "5s")
	o := e.override(obj{"limit": "PerAccount", "bucket_id": "1", "burst": 1, "count": 1, "period": "1s"})
	e.waitLimit("PerName")
	huge := `1e400`
	big := `9223372036854775808`
	endpoints := []writeEndpoint{
		{"POST", "/v1/tokens", []badCase{
			{"wrong types", `{"name": 5, "scope": ["admin"]}`, 400, []string{"name", "scope"}},
			{"missing", `{}`, 422, []string{"name", "scope"}},
			{"empty strings", `{"name": "", "scope": ""}`, 422, []string{"name", "scope"}},
			{"unknown scope", `{"name": "a", "scope": "root"}`, 422, []string{"scope"}},
			{"long name", `{"name": "` + strings.Repeat("é", 40) + `", "scope": "admin"}`, 422, []string{"name"}},
			{"control character", `{"name": "a\u0007b", "scope": "admin"}`, 422, []string{"name"}},
			{"null field", `{"name": null, "scope": "admin"}`, 400, []string{"name"}},
		}},
		{"PUT", "/v1/limits/NewLimit", []badCase{
			{"wrong types", `{"id_format": 1, "burst": "5", "count": 1.5, "period": 5, "shadow": "yes", "enum": false}`, 400,
				[]string{"id_format", "burst", "count", "period", "shadow", "enum"}},
			{"huge numbers", `{"id_format": "string", "burst": ` + huge + `, "count": ` + big + `, "period": "1s"}`, 400, []string{"burst", "count"}},
			{"negative numbers", `{"id_format": "string", "burst": -1, "count": -5, "period": "-1s", "enum": -3}`, 422,
				[]string{"burst", "count", "period", "enum"}},
			{"zeros", `{"id_format": "string", "burst": 0, "count": 0, "period": "0s", "enum": 0}`, 422,
				[]string{"burst", "count", "period", "enum"}},
			{"missing", `{}`, 422, []string{"id_format", "burst", "count", "period"}},
			{"empty strings", `{"id_format": "", "burst": 1, "count": 1, "period": ""}`, 422, []string{"id_format", "period"}},
			{"bad values", `{"id_format": "email", "burst": 1, "count": 1, "period": "soon", "description": "` + strings.Repeat("x", 1001) + `"}`, 422,
				[]string{"id_format", "period", "description"}},
			{"too fast", `{"id_format": "string", "burst": 1, "count": 1000000000, "period": "1s"}`, 422, []string{"period", "count"}},
			{"too long", `{"id_format": "string", "burst": 9000000000000000, "count": 1, "period": "1h"}`, 422, []string{"burst"}},
			{"enum too big", `{"id_format": "string", "burst": 1, "count": 1, "period": "1s", "enum": 2147483648}`, 422, []string{"enum"}},
			{"other name", `{"name": "Other", "id_format": "string", "burst": 1, "count": 1, "period": "1s"}`, 422, []string{"name"}},
		}},
		{"PUT", "/v1/limits/Zo%C3%AB", []badCase{
			{"unicode name", `{"id_format": "string", "burst": 1, "count": 1, "period": "1s"}`, 422, []string{"name"}},
		}},
		{"PUT", "/v1/limits/" + strings.Repeat("a", 65), []badCase{
			{"long name", `{"id_format": "string", "burst": 1, "count": 1, "period": "1s"}`, 422, []string{"name"}},
		}},
		{"POST", "/v1/overrides", []badCase{
			{"wrong types", `{"limit": 1, "bucket_id": 2, "burst": "3", "unlimited": "no", "enabled": 1, "expires_at": 5, "comment": []}`, 400,
				[]string{"limit", "bucket_id", "burst", "unlimited", "enabled", "expires_at", "comment"}},
			{"huge numbers", `{"limit": "PerAccount", "bucket_id": "2", "burst": ` + huge + `, "count": ` + big + `, "period": "1s"}`, 400,
				[]string{"burst", "count"}},
			{"negative numbers", `{"limit": "PerAccount", "bucket_id": "-2", "burst": -1, "count": -1, "period": "-1s"}`, 422,
				[]string{"bucket_id", "burst", "count", "period"}},
			// Which parameters an override needs depends on its limit.
			{"missing", `{}`, 422, []string{"limit", "bucket_id"}},
			{"missing parameters", `{"limit": "PerAccount", "bucket_id": "2"}`, 422, []string{"burst", "count", "period"}},
			{"parameters of unlimited", `{"limit": "PerAccount", "bucket_id": "2", "unlimited": true, "burst": 1}`, 422, []string{"burst"}},
			{"empty strings", `{"limit": "", "bucket_id": "", "period": "", "unlimited": false, "burst": 1, "count": 1}`, 422,
				[]string{"limit", "bucket_id", "period"}},
			{"unknown limit", `{"limit": "Nope", "bucket_id": "2", "unlimited": true}`, 422, []string{"limit"}},
			{"bad bucket id", `{"limit": "PerName", "bucket_id": "ünï..code", "unlimited": true}`, 422, []string{"bucket_id"}},
			{"past expiry", `{"limit": "PerAccount", "bucket_id": "2", "unlimited": true, "expires_at": "2001-01-01T00:00:00Z"}`, 422,
				[]string{"expires_at"}},
			{"bad expiry", `{"limit": "PerAccount", "bucket_id": "2", "unlimited": true, "expires_at": "tomorrow"}`, 422, []string{"expires_at"}},
			{"long comment", `{"limit": "PerAccount", "bucket_id": "2", "unlimited": true, "comment": "` + strings.Repeat("☃", 400) + `"}`, 422,
				[]string{"comment"}},
			{"duplicate", `{"limit": "PerAccount", "bucket_id": "0001", "unlimited": true}`, 409, nil},
		}},
		{"PATCH", "/v1/overrides/" + o["id"].(string), []badCase{
			{"wrong types", `{"burst": "3", "count": true, "period": 5, "unlimited": 0, "enabled": "no", "comment": 1, "expires_at": []}`, 400,
				[]string{"burst", "count", "period", "unlimited", "enabled", "comment", "expires_at"}},
			{"huge numbers", `{"burst": ` + huge + `, "count": ` + big + `}`, 400, []string{"burst", "count"}},
			{"negative numbers", `{"burst": -1, "count": -1, "period": "-1s"}`, 422, []string{"burst", "count", "period"}},
			{"nothing", `{}`, 422, []string{"body"}},
			{"null parameter", `{"burst": null}`, 400, []string{"burst"}},
			{"empty strings", `{"period": "", "expires_at": ""}`, 422, []string{"period", "expires_at"}},
			{"parameters of unlimited", `{"unlimited": true, "count": 5}`, 422, []string{"count"}},
			{"past expiry", `{"expires_at": "1999-12-31T23:59:59+01:00"}`, 422, []string{"expires_at"}},
			{"too fast", `{"count": 10000000, "period": "1s"}`, 422, []string{"count", "period"}},
		}},
	}
	for _, op := range []string{"check", "spend", "refund"} {
		endpoints = append(endpoints, writeEndpoint{"POST", "/v1/" + op, []badCase{
			{"wrong types", `{"buckets": [{"limit": 1, "bucket_id": true, "cost": "1"}, 5]}`, 400,
				[]string{"buckets[0].limit", "buckets[0].bucket_id", "buckets[0].cost", "buckets[1]"}},
			{"buckets not an array", `{"buckets": {"limit": "PerAccount"}}`, 400, []string{"buckets"}},
			{"huge cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": ` + huge + `}]}`, 400, []string{"buckets[0].cost"}},
			{"fractional cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": 1.5}]}`, 400, []string{"buckets[0].cost"}},
			{"null cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": null}]}`, 400, []string{"buckets[0].cost"}},
			{"negative cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": -1}]}`, 422, []string{"buckets[0].cost"}},
			{"missing", `{}`, 422, []string{"buckets"}},
			{"empty strings", `{"buckets": [{"limit": "", "bucket_id": "1"}, {"limit": "PerAccount", "bucket_id": ""}]}`, 422,
				[]string{"buckets[0].limit", "buckets[1].bucket_id"}},
			{"unicode", `{"buckets": [{"limit": "Pér", "bucket_id": "1"}, {"limit": "PerName", "bucket_id": "☃☃"}]}`, 422,
				[]string{"buckets[0].limit", "buckets[1].bucket_id"}},
			{"duplicate", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1"}, {"limit": "PerAccount", "bucket_id": "01"}]}`, 422,
				[]string{"buckets[1]"}},
		}})
	}
	maxCost := strconv.FormatInt(limiter.MaxCost, 10)
	endpoints = append(endpoints, writeEndpoint{"POST", "/v1/settle", []badCase{
		{"wrong types", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": "1", "actual": null}]}`, 400,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"fractions", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": 1.5, "actual": 2e3}]}`, 400,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": 1, "actual": 1}]}`, 400, []string{"buckets[0].cost"}},
		{"duplicate actual", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "actual": 1, "actual": 2}]}`, 400, []string{"buckets[0].actual"}},
		{"huge", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": ` + huge + `, "actual": ` + huge + `}]}`, 400,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"negative", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": -1, "actual": -5}]}`, 422,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"beyond int64", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": 99999999999999999999, "actual": -99999999999999999999}]}`, 422,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"beyond any limit", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": ` + maxCost + `1, "actual": 9223372036854775807}]}`, 422,
			[]string{"buckets[0].reserved", "buckets[0].actual"}},
		{"missing actual", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "reserved": 5}]}`, 422, []string{"buckets[0].actual"}},
		{"unknown limit and bad id", `{"buckets": [{"limit": "PerAccount", "bucket_id": "77", "actual": 9}, {"limit": "Nope", "bucket_id": "1", "actual": 1},
			{"limit": "PerAccount", "bucket_id": "x", "actual": 1}]}`, 422, []string{"buckets[1].limit", "buckets[2].bucket_id"}},
		{"duplicate", `{"buckets": [{"limit": "PerAccount", "bucket_id": "77", "actual": 0}, {"limit": "PerAccount", "bucket_id": "077", "actual": 9}]}`, 422,
			[]string{"buckets[1]"}},
	}})
	endpoints = append(endpoints, writeEndpoint{"POST", "/v1/buckets/reset", []badCase{
		{"wrong types", `{"buckets": [{"limit": 1, "bucket_id": true}]}`, 400, []string{"buckets[0].limit", "buckets[0].bucket_id"}},
		{"cost", `{"buckets": [{"limit": "PerAccount", "bucket_id": "1", "cost": 1}]}`, 400, []string{"buckets[0].cost"}},
		{"missing", `{"buckets": []}`, 422, []string{"buckets"}},
		{"empty strings", `{"buckets": [{"limit": "", "bucket_id": "1"}, {"limit": "PerAccount", "bucket_id": ""}]}`, 422,
			[]string{"buckets[0].limit", "buckets[1].bucket_id"}},
	}})

	// A bucket to show that no refused decision spends.
	e.decided("spend", e.admin, bucket("PerAccount", "77", 2))
	before := e.rows()
	for _, ep := range endpoints {
		cases := append(commonBad(), ep.bad...)
		for _, c := range cases {
			t.Run(ep.method+" "+ep.path+"/"+c.name, func(t *testing.T) {
				res := e.do(ep.method, ep.path, e.admin, c.body)
				p := res.expect(t, c.status).problem(t)
				if len(c.fields) > 0 {
					wantFields(t, p, c.fields...)
				}
			})
		}
		t.Run(ep.method+" "+ep.path+"/media type", func(t *testing.T) {
			for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin1", "", "application/json/x"} {
				res := e.do(ep.method, ep.path, e.admin, `{}`, "Content-Type", ct)
				res.expect(t, http.StatusUnsupportedMediaType).problem(t)
			}
		})
	}
	e.unchanged(before)
	if r, _ := e.decided("check", e.admin, bucket("PerAccount", "77", 0)); r.Decisions[0].Remaining != 3 {
		t.Errorf("a refused decision spent: %+v", r.Decisions[0])
	}
}

// TestNonCanonicalInput shows that ids and periods in any notation are
// accepted and answered canonical.
func TestNonCanonicalInput(t *testing.T) {
	e := newEnv(t)
	l := e.limit("PerName", "domain", 5, 5, "300s")
	if l["period"] != "5m0s" {
		t.Errorf("period %v", l["period"])
	}
	e.limit("PerRange", "ipv6_range", 5, 5, "5s")
	e.limit("PerSet", "fqdn_set", 5, 5, "5s")
	cases := []struct{ limit, id, canonical string }{
		{"PerName", "BÜCHER.Example.", "xn--bcher-kva.example"},
		{"PerRange", "2001:DB8:0:0:1::1", "2001:db8::/48"},
		{"PerSet", "b.example,A.example,b.example", "a.example,b.example"},
	}
	e.waitLimit("PerSet")
	for _, c := range cases {
		o := e.override(obj{"limit": c.limit, "bucket_id": c.id, "unlimited": true, "comment": "Grüße ☃"})
		if o["bucket_id"] != c.canonical || o["comment"] != "Grüße ☃" {
			t.Errorf("override of %s: %v", c.id, o)
		}
		r, _ := e.decided("check", e.admin, bucket(c.limit, c.id, 1))
		if r.Decisions[0].BucketID != c.canonical {
			t.Errorf("decision of %s: %+v", c.id, r.Decisions[0])
		}
	}
	// Decisions for an override's other notation find it.
	e.waitSource("PerName", "xn--bcher-kva.example", limiter.SourceUnlimited)
	r, _ := e.decided("spend", e.admin, bucket("PerName", "bücher.example", 1000))
	if r.Decisions[0].Source != "unlimited" {
		t.Errorf("decision %+v", r.Decisions[0])
	}
	tok := e.do("POST", "/v1/tokens", e.admin, obj{"name": "Zoë ☃", "scope": "decide"}).expect(t, http.StatusCreated).object(t)
	if tok["name"] != "Zoë ☃" {
		t.Errorf("token %v", tok)
	}
}

// TestFieldErrorsInBodyOrder: an admin body's field errors come in the
// order its fields appear, whichever check found each (the reading, the
// converter or the domain), with the fields it lacks last.
func TestFieldErrorsInBodyOrder(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	o := e.override(obj{"limit": "PerAccount", "bucket_id": "1", "burst": 1, "count": 1, "period": "1s"})
	cases := []struct {
		method, path, body string
		fields             []string
	}{
		{"PUT", "/v1/limits/L", `{"unit": "", "period": "soon", "burst": 0, "id_format": "email"}`,
			[]string{"unit", "period", "burst", "id_format", "count"}},
		{"PUT", "/v1/limits/L", `{"id_format": "string", "description": "a\u0000", "count": 0, "enum": 0, "burst": 1, "period": "1s"}`,
			[]string{"description", "count", "enum"}},
		{"POST", "/v1/overrides", `{"expires_at": "yesterday", "comment": "\u0000", "burst": -1, "limit": "9x", "count": 1, "period": "1s"}`,
			[]string{"expires_at", "comment", "burst", "limit", "bucket_id"}},
		{"PATCH", "/v1/overrides/" + o["id"].(string), `{"period": "x", "comment": "\u0000", "count": 0}`,
			[]string{"period", "comment", "count"}},
		{"POST", "/v1/rules", `{"limit": "", "descriptor": [{"key": "k", "value": ""}, {"value": "v"}], "domain": ""}`,
			[]string{"limit", "descriptor[0].value", "descriptor[1].key", "domain"}},
		{"POST", "/v1/rules", `{"replaces": [{"name": "9x"}, {"name": "A"}, {"name": "A"}, {}], "domain": "d", "descriptor": [{"key": "k"}], "limit": "L"}`,
			[]string{"replaces[0].name", "replaces[2].name", "replaces[3].name"}},
		{"POST", "/v1/tokens", `{"scope": "root", "name": ""}`, []string{"scope", "name"}},
	}
	for _, c := range cases {
		res := e.do(c.method, c.path, e.admin, c.body)
		p := res.expect(t, http.StatusUnprocessableEntity).problem(t)
		var got []string
		for _, f := range p.Errors {
			got = append(got, f.Field)
		}
		if !slices.Equal(got, c.fields) {
			t.Errorf("%s %s %s: fields %q, want %q (%+v)", c.method, c.path, c.body, got, c.fields, p.Errors)
		}
	}
}

// TestStoreErrorsWorded: the database's errors reach clients in the API's
// words, naming what the route names, never in the database's own text.
func TestStoreErrorsWorded(t *testing.T) {
	e := newEnv(t)
	e.limit("PerAccount", "reg_id", 5, 5, "5s")
	e.override(obj{"limit": "PerAccount", "bucket_id": "1", "unlimited": true})
	e.do("PUT", "/v1/limits/Gone", e.admin, obj{"enum": 4242, "id_format": "string", "burst": 1, "count": 1, "period": "1s"}).expect(t, http.StatusCreated)
	e.do("DELETE", "/v1/limits/Gone", e.admin, nil).expect(t, http.StatusNoContent)
	e.do("POST", "/v1/tokens", e.admin, obj{"name": "twice", "scope": "decide"}).expect(t, http.StatusCreated)
	cases := []struct {
		method, path string
		body         any
		status       int
		detail       string
		field        string
	}{
		{"GET", "/v1/limits/Nope", nil, 404, `limit "Nope" not found`, ""},
		{"DELETE", "/v1/overrides/01ARZ3NDEKTSV4RRFFQ69G5FAV", nil, 404, `override "01ARZ3NDEKTSV4RRFFQ69G5FAV" not found`, ""},
		{"DELETE", "/v1/tokens/nope", nil, 404, `token "nope" not found or already revoked`, ""},
		{"DELETE", "/v1/limits/PerAccount", nil, 409, "the limit still has overrides: delete them first", ""},
		{"PUT", "/v1/limits/PerAccount", obj{"id_format": "string", "burst": 5, "count": 5, "period": "5s"}, 409,
			"the limit has overrides: its id_format cannot change while they exist", ""},
		{"POST", "/v1/overrides", obj{"limit": "PerAccount", "bucket_id": "01", "unlimited": true}, 409,
			"an override of the limit for the bucket already exists", ""},
		{"POST", "/v1/tokens", obj{"name": "twice", "scope": "decide"}, 409, "a live token has the name; revoke it or choose another name", ""},
		{"PUT", "/v1/limits/Again", obj{"enum": 4242, "id_format": "string", "burst": 1, "count": 1, "period": "1s"}, 422, "", "enum"},
		{"POST", "/v1/rules", obj{"domain": "d", "descriptor": []obj{{"key": "k"}}, "limit": "Nope"}, 422, "", "limit"},
		{"GET", "/v1/overrides?page_token=AAAA", nil, 422, "", "page_token"},
	}
	for _, c := range cases {
		p := e.do(c.method, c.path, e.admin, c.body).expect(t, c.status).problem(t)
		if c.detail != "" && p.Detail != c.detail {
			t.Errorf("%s %s: detail %q, want %q", c.method, c.path, p.Detail, c.detail)
		}
		if c.field != "" {
			wantFields(t, p, c.field)
		}
	}
}
