package decide

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// decisionSeeds are bodies for the decoder fuzzer: the common form, and
// everything near it that the fast decoder must leave to the generic one.
var decisionSeeds = []string{
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":1}]}`,
	` { "buckets" : [ { "cost" : 0 , "bucket_id" : "b" , "limit" : "L" } , {"limit":"M","bucket_id":"ü"} ] } `,
	`{"buckets":[{"limit":"L","bucket_id":"\u0031"}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":01}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":1.0}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":-0}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":9223372036854775808}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":null}]}`,
	`{"buckets":[{"limit":"L","limit":"M","bucket_id":"1"}]}`,
	`{"buckets":[{"Limit":"L","bucket_id":"1"}]}`,
	`{"buckets":[]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1"}],"buckets":[]}`,
	"{\"buckets\":[{\"limit\":\"L\",\"bucket_id\":\"\xff\"}]}",
	`{"buckets":[{"limit":"L","bucket_id":"1"}]} x`,
	`{"buckets":[{"limit":"L","bucket_id":"1"},]}`,
	`{"buckets":[{"limit":"L","bucket_id":"d","cost":5,"cost":0}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","cost":99999999999999999999}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"a\u0000b"}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","reserved":1000,"actual":30000}]}`,
	`{"buckets":[{"actual":0,"limit":"L","bucket_id":"1"}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","reserved":1}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","actual":1,"cost":1}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","actual":3153600000000000}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","actual":3153600000000001}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","actual":2,"reserved":-1}]}`,
	`{"buckets":[{"limit":"L","bucket_id":"1","actual":2,"actual":3}]}`,
}

// FuzzDecisionDecoder holds the fast decoder to the strict one: every body
// it takes, the strict one takes too, without any field error, and reads
// into the same requests. Neither may panic.
func FuzzDecisionDecoder(f *testing.F) {
	for _, s := range decisionSeeds {
		for _, fm := range []form{bare, costed, settled} {
			f.Add([]byte(s), uint8(fm))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		fm := form(n % 3)
		strict, errs, err := decodeStrict(body, nil, fm, nil)
		fast, ok := decodeFast(body, nil, fm, new(scratch))
		if !ok {
			return
		}
		if err != nil || !errs.Empty() {
			t.Fatalf("the fast decoder took %q, the strict one says %v %v", body, err, errs.Err())
		}
		if !reflect.DeepEqual(fast, strict) {
			t.Fatalf("%q: fast %+v, strict %+v", body, fast, strict)
		}
	})
}

// FuzzDecisionJSON holds appendJSON to encoding/json.
func FuzzDecisionJSON(f *testing.F) {
	f.Add("NewOrdersPerAccount", "12345678", "3h0m0s", int64(3), true)
	f.Add("L", "\"\\\x00\x1f\x7f<>&\u2028\u2029\xff\xfe☃", "", int64(-1), false)
	f.Fuzz(func(t *testing.T, limit, id, period string, n int64, allowed bool) {
		reason := limiter.ReasonLimited
		r := result{Allowed: allowed, RetryAfterMS: n, ResetAfterMS: -n, Decisions: []decision{
			{Limit: limit, BucketID: id, Allowed: allowed, Reason: &reason, Remaining: n, Debt: n, Period: period, Unit: id,
				Source: limiter.Source(id), Capped: &allowed},
			{Limit: id, BucketID: limit, Burst: n, Count: n, RetryAfterMS: n, Shadow: true, Held: &n},
		}}
		// An acquire's answer has a lease, or null; others have none.
		l := &lease{ID: id, ExpiresAt: time.UnixMicro(n % (1 << 47)).UTC()}
		if !allowed {
			l = nil
		}
		if n%2 == 0 {
			r.Lease = &l
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(&r); err != nil {
			t.Fatal(err)
		}
		if got := append(r.appendJSON(nil), '\n'); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("appendJSON:\n%s\nencoding/json:\n%s", got, want.Bytes())
		}
		empty := result{}
		want.Reset()
		_ = enc.Encode(&empty)
		if got := append(empty.appendJSON(nil), '\n'); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("appendJSON of nothing: %s, want %s", got, want.Bytes())
		}
	})
}

// TestSurrogateEscapes shows that escaped surrogate pairs are read, and
// that half of one is refused rather than read as U+FFFD.
func TestSurrogateEscapes(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"buckets":[{"limit":"L","bucket_id":"\ud83d\ude00"}]}`:       true,
		`{"buckets":[{"limit":"L","bucket_id":"\\ud800 \u00e9"}]}`:     true,
		`{"buckets":[{"limit":"L","bucket_id":"\ud800"}]}`:             false,
		`{"buckets":[{"limit":"L","bucket_id":"\ud800\u0041"}]}`:       false,
		`{"buckets":[{"limit":"L","bucket_id":"\ude00\ud83d"}]}`:       false,
		`{"buckets":[{"limit":"L","bucket_id":"x"}],"\udfff":1}`:       false,
		`{"buckets":[{"limit":"L","bucket_id":"\ud83d\ude00\ud83d"}]}`: false,
	} {
		reqs, _, err := decodeStrict([]byte(body), nil, costed, nil)
		if (err == nil) != ok {
			t.Errorf("%s: %v", body, err)
		}
		if ok && (len(reqs) != 1 || strings.ContainsRune(reqs[0].BucketID, '\ufffd')) {
			t.Errorf("%s: %+v", body, reqs)
		}
	}
}

// TestHugeBatchReadsOnlyTheMost: a batch far beyond limiter.MaxBatch is
// read no further than that, so that its answer, the count's error and
// those of the first buckets, stays small whatever the body's size.
func TestHugeBatchReadsOnlyTheMost(t *testing.T) {
	body := `{"buckets":[` + strings.Repeat(`{},`, 50000) + `{}]}`
	reqs, errs, err := decodeStrict([]byte(body), nil, costed, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ve *limiter.ValidationError
	if !errors.As(errs.Err(), &ve) || len(reqs) != limiter.MaxBatch || len(ve.Fields) != 1+2*limiter.MaxBatch {
		t.Fatalf("%d requests, errors %v", len(reqs), errs.Err())
	}
	if f := ve.Fields[0]; f.Field != "buckets" || f.Message != "must hold at most 100 items" {
		t.Errorf("first error %+v", f)
	}
}

// manySeeds are bodies of /v1/decisions for the bulk decoder's fuzzer:
// the common form, its members in other orders, and what is near it.
var manySeeds = []string{
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1","cost":1}]}]}`,
	`{"requests":[{"buckets":[{"bucket_id":"1","limit":"L"}],"op":"check"},{"op":"settle","buckets":[{"limit":"L","bucket_id":"1","reserved":1,"actual":2}]}]}`,
	`{"requests":[{"op":"refund","buckets":[{"limit":"L","bucket_id":"1"}]},{"op":"acquire","buckets":[{"limit":"C","bucket_id":"1"}],"ttl_ms":5}]}`,
	`{"requests":[{"op":"release","lease_id":"lse_aaaaaaaaaaaaaaaaaaaaaaaaaa"},{"op":"renew","lease_id":"x","ttl_ms":0}]}`,
	`{"requests":[{"op":"spend","op":"check","buckets":[{"limit":"L","bucket_id":"1"}]}]}`,
	`{"requests":[{"op":"frob","op":"spend","buckets":[{"limit":"L","bucket_id":"1"}]}]}`,
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1"}],"buckets":[]}]}`,
	`{"requests":[{"op":"settle","buckets":[{"limit":"L","bucket_id":"1","cost":2}]}]}`,
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1","actual":2}]}]}`,
	`{"requests":[{"op":"spend","buckets":[]}]}`,
	`{"requests":[]}`,
	`{"requests":[{"op":"spend","requests":[{"op":"spend"}]}]}`,
	`{"requests":[{"op":{"op":"spend"},"buckets":[{"limit":"L","bucket_id":"1"}]}]}`,
	`{"requests":[5,null,"spend",[]]}`,
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1","cost":1e400}]}]}`,
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"a\u0000b","cost":99999999999999999999999}]}]}`,
	"{\"requests\":[{\"op\":\"spend\",\"buckets\":[{\"limit\":\"L\",\"bucket_id\":\"\xff\"}]}]}",
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1"}]}],"requests":[]}`,
	`{"requests":[{"op":"spend","buckets":[{"limit":"L","bucket_id":"1"}]}],"x":1}`,
	` { "requests" : [ { "op" : "check" , "buckets" : [ { "limit" : "L" , "bucket_id" : "1" , "cost" : 0 } ] } ] } `,
}

// FuzzManyDecoder holds the bulk decoder's fast path to its strict one:
// every body the fast path takes, the strict one takes too, refusing no
// request, and reads into the same requests. Neither may panic.
func FuzzManyDecoder(f *testing.F) {
	for _, s := range manySeeds {
		f.Add([]byte(s))
	}
	h := New(Config{Limiter: limiter.New(limiter.Config{})})
	f.Fuzz(func(t *testing.T, body []byte) {
		strict := &scratch{body: body}
		err := h.decodeManyStrict(strict)
		fast := &scratch{body: body}
		if !decodeManyFast(body, fast) {
			return
		}
		if err != nil || len(strict.refused) > 0 {
			t.Fatalf("the fast decoder took %q, the strict one says %v %v", body, err, strict.refused)
		}
		if !reflect.DeepEqual(fast.calls, strict.calls) || !reflect.DeepEqual(fast.ends, strict.ends) ||
			!reflect.DeepEqual(fast.reqs, strict.reqs) || !reflect.DeepEqual(fast.slots, strict.slots) {
			t.Fatalf("%q: fast %+v %v %+v, strict %+v %v %+v", body, fast.calls, fast.ends, fast.reqs, strict.calls, strict.ends, strict.reqs)
		}
	})
}
