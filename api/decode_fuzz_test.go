package api

import (
	"net/http"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// adminSeeds are admin bodies of every kind, good and bad, for
// FuzzAdminDecoder.
var adminSeeds = []string{
	`{"id_format":"string","burst":1,"count":1,"period":"1ms","description":"x","shadow":true,"enum":7}`,
	`{"id_format":"string","burst":5,"count":1,"period":"1s","burst":5000}`,
	`{"limit":"L","bucket_id":"0042","burst":1,"count":1,"period":"1s","comment":"ü","expires_at":"2999-01-01T00:00:00Z"}`,
	`{"limit":"L","bucket_id":"a","unlimited":true,"comment":"a\u0000b"}`,
	"{\"limit\":\"L\",\"bucket_id\":\"user\xff\",\"unlimited\":true}",
	`{"burst":5,"expires_at":null,"unlimited":false,"comment":"\u2028"}`,
	`{"name":"fuzz","scope":"decide"}`,
	`{"name":"cli","scope":"admin","name":"x"}`,
	`{"buckets":[{"limit":"L","bucket_id":"d","bucket_id":"e"}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"\ud800"}]}`,
	`{"limit":"L","bucket_id":"a\u0000","unlimited":true}`,
	`{"domain":"d","descriptor":[{"key":"k","value":""},{"value":"v"},{"key":"k","key":"j"}],"limit":"L"}`,
	`[]`, `null`, `{`, ``, `{"a":{"a":1,"a":2}}`,
}

// FuzzAdminDecoder holds the reading of admin bodies (limits, overrides,
// their patches, tokens and rules; decisions are package decide's) to its
// promises: it never panics; what it refuses is a 400 or a 422 (never a
// 5xx) naming a field whenever it blames one; it takes only valid UTF-8;
// and what it takes holds no text a database would refuse (NUL, invalid
// UTF-8), so that every engine answers the same.
func FuzzAdminDecoder(f *testing.F) {
	for _, s := range adminSeeds {
		for kind := range 5 {
			f.Add(uint8(kind), []byte(s))
		}
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		b, err := input.Parse(body)
		if err != nil {
			if p := problemOf(err); p.Status != http.StatusBadRequest {
				t.Fatalf("%q: %d %s", body, p.Status, p.Detail)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("%q: invalid UTF-8 was taken", body)
		}
		var texts []string
		switch kind % 5 {
		case 0:
			l := limitFromBody(b, "L")
			texts = []string{l.Name, l.Description, l.TimeZone}
		case 1:
			o, _ := overrideFromBody(b, now)
			texts = []string{o.Limit, o.BucketID, o.Comment}
		case 2:
			if p := patchFromBody(b, now); p.comment != nil {
				texts = []string{*p.comment}
			}
		case 3:
			texts = []string{tokenFromBody(b).Name}
		case 4:
			r := ruleFromBody(b)
			texts = []string{r.Domain, r.Limit}
			for _, e := range r.Descriptor {
				texts = append(texts, e.Key, e.Value)
			}
		}
		if err := b.Err(); err != nil {
			p := problemOf(err)
			if p.Status != http.StatusBadRequest && p.Status != http.StatusUnprocessableEntity || len(p.Errors) == 0 {
				t.Fatalf("%q: %d %s %v", body, p.Status, p.Detail, p.Errors)
			}
			return
		}
		for _, str := range texts {
			if msg := limiter.CharProblem(str); msg != "" {
				t.Fatalf("%q: %q passed, but %s", body, str, msg)
			}
		}
	})
}

// problemOf maps err as handleError does.
func problemOf(err error) *problem.Problem {
	p := &problem.Problem{}
	problemFor(err, "", p)
	return p
}
