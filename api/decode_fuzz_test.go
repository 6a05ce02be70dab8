package api

import (
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

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
	`[]`, `null`, `{`, ``, `{"a":{"a":1,"a":2}}`,
}

// FuzzAdminDecoder holds the decoder of admin bodies (limits, overrides,
// their patches and tokens; bucket resets are package decide's) to its promises: it never
// panics; what it refuses is a 400 (never a 5xx) naming a field when it
// refuses a field; it takes only valid UTF-8; and what it takes and the
// converters pass holds no text a database would refuse (NUL, invalid
// UTF-8), so that every engine answers the same.
func FuzzAdminDecoder(f *testing.F) {
	for _, s := range adminSeeds {
		for kind := range 4 {
			f.Add(uint8(kind), []byte(s))
		}
	}
	s := &Server{validate: newValidator()}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		var fs fieldSet
		var texts func() []string
		var dst any
		switch kind % 4 {
		case 0:
			req := new(limitPutRequest)
			dst = req
			texts = func() []string {
				l := req.limit("L", &fs)
				return []string{l.Name, l.Description}
			}
		case 1:
			req := new(overrideCreateRequest)
			dst = req
			texts = func() []string {
				o := req.override(now, &fs)
				return []string{o.Limit, o.BucketID, o.Comment}
			}
		case 2:
			req := new(overridePatchRequest)
			dst = req
			texts = func() []string {
				p := req.patch(now, fs)
				fs = p.errs
				if req.Comment == nil {
					return nil
				}
				return []string{*req.Comment}
			}
		case 3:
			req := new(tokenCreateRequest)
			dst = req
			texts = func() []string { return []string{req.token(&fs).Name} }
		}
		err := s.decode(body, dst, &fs)
		if err != nil {
			p := problemFor(err)
			if p.Status != http.StatusBadRequest {
				t.Fatalf("%q: %d %s", body, p.Status, p.Detail)
			}
			var se *shapeError
			if errors.As(err, &se) && len(se.fields) == 0 {
				t.Fatalf("%q: a shape error names no field", body)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("%q: invalid UTF-8 was taken", body)
		}
		again := reflect.New(reflect.TypeOf(dst).Elem()).Interface()
		var fs2 fieldSet
		if err := s.decode(body, again, &fs2); err != nil || !reflect.DeepEqual(dst, again) {
			t.Fatalf("%q: decoded twice, differently: %+v, %+v, %v", body, dst, again, err)
		}
		strs := texts()
		if !fs.empty() {
			return
		}
		for _, str := range strs {
			if msg := limiter.CharProblem(str); msg != "" {
				t.Fatalf("%q: %q passed, but %s", body, str, msg)
			}
		}
	})
}
