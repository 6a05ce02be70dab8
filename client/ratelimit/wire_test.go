package ratelimit

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// randomString mixes what JSON must escape, non-ASCII and plain text.
func randomString(rng *rand.Rand) string {
	parts := []string{"a", "Z9", `"`, `\`, "\n", "\t", "\x01", "é", "漢", "/", "\u2028", "-_.", "10.0.0.1"}
	var b strings.Builder
	for range rng.IntN(6) {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	return b.String()
}

// randomDecision is a decision as ratelimitd could answer it, and what the
// client reads from it.
func randomDecision(rng *rand.Rand) (fakeratelimitd.Decision, Decision) {
	ms := func() int64 {
		if rng.IntN(5) == 0 {
			return -1
		}
		return rng.Int64N(1 << 40)
	}
	w := fakeratelimitd.Decision{Limit: randomString(rng), BucketID: randomString(rng), Allowed: rng.IntN(2) == 0,
		Remaining: rng.Int64N(1 << 50), Debt: rng.Int64N(100), RetryAfterMs: ms(), ResetAfterMs: ms(),
		Burst: rng.Int64N(1 << 40), Count: rng.Int64N(1 << 40), Period: []string{"1s", "3h0m0s", "1m30s", "1µs", "24h0m0s"}[rng.IntN(5)],
		Unit: []string{"requests", "tokens", "bytes"}[rng.IntN(3)], Source: []string{"default", "override", "unlimited"}[rng.IntN(3)],
		Shadow: rng.IntN(2) == 0}
	d := Decision{Limit: w.Limit, BucketID: w.BucketID, Allowed: w.Allowed, Remaining: w.Remaining, Debt: w.Debt,
		Burst: w.Burst, Count: w.Count, Unit: w.Unit, Source: w.Source, Shadow: w.Shadow}
	d.Period, _ = time.ParseDuration(w.Period)
	d.RetryAfter, d.ResetAfter = msDuration(w.RetryAfterMs), msDuration(w.ResetAfterMs)
	if !w.Allowed {
		reason := []string{"limited", "blocked", "cost_exceeds_burst"}[rng.IntN(3)]
		w.Reason, d.Reason = &reason, reason
	}
	if rng.IntN(3) == 0 {
		held := rng.Int64N(1000)
		w.Held, d.Held, d.Concurrent = &held, held, true
	}
	if rng.IntN(3) == 0 {
		capped := rng.IntN(2) == 0
		w.Capped, d.Capped = &capped, capped
	}
	return w, d
}

func msDuration(ms int64) time.Duration {
	if ms == -1 {
		return Never
	}
	return time.Duration(ms) * time.Millisecond
}

// TestDecodeAnswer writes random answers with encoding/json, in the shapes
// of every op (and members the client does not know, which a later
// version of ratelimitd may add), and checks that the hand-written reader
// reads each field as encoding/json wrote it.
func TestDecodeAnswer(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		n := 1 + rng.IntN(5)
		var results []any
		var want []call
		batch := make([]*call, n)
		for i := range n {
			batch[i] = &call{}
			var w call
			switch rng.IntN(5) {
			case 0: // a decision, maybe an acquire's
				res := fakeratelimitd.Result{Decisions: []fakeratelimitd.Decision{}, Allowed: rng.IntN(2) == 0, RetryAfterMs: rng.Int64N(1 << 30), ResetAfterMs: rng.Int64N(1 << 30), Degraded: rng.IntN(2) == 0}
				w.res = Result{Allowed: res.Allowed, RetryAfter: msDuration(res.RetryAfterMs), ResetAfter: msDuration(res.ResetAfterMs), Degraded: res.Degraded}
				for range rng.IntN(4) {
					fd, d := randomDecision(rng)
					res.Decisions = append(res.Decisions, fd)
					w.res.Decisions = append(w.res.Decisions, d)
					batch[i].buckets = append(batch[i].buckets, Bucket{ID: fd.BucketID})
				}
				if w.res.Decisions == nil {
					w.res.Decisions = []Decision{}
				}
				if rng.IntN(2) == 0 {
					var l *fakeratelimitd.Lease
					if res.Allowed {
						l = &fakeratelimitd.Lease{ID: "lse_" + fmt.Sprint(round, i), ExpiresAt: time.Unix(1_800_000_000, rng.Int64N(1e9)).UTC()}
						w.lease = wireLease{ID: l.ID, ExpiresAt: l.ExpiresAt}
					}
					res.Lease = &l
				}
				results = append(results, res)
			case 1:
				released := rng.IntN(2) == 0
				w.released = released
				results = append(results, map[string]any{"released": released, "degraded": false, "later": []any{1.5, nil, "x"}})
			case 2:
				l := fakeratelimitd.Lease{ID: "lse_r", ExpiresAt: time.Unix(1_900_000_000, 5).UTC()}
				w.lease = wireLease{ID: l.ID, ExpiresAt: l.ExpiresAt}
				results = append(results, map[string]any{"lease": l, "degraded": false})
			default:
				p := fakeratelimitd.ProblemBody{Type: "urn:ratelimitd:problem:validation", Title: randomString(rng), Status: 422, Detail: randomString(rng),
					Errors: []fakeratelimitd.FieldError{{Field: "buckets[0].limit", Message: randomString(rng)}}}
				if rng.IntN(3) == 0 {
					p.Status = 503
				}
				problem := &Problem{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail,
					Errors: []FieldError{{Field: p.Errors[0].Field, Message: p.Errors[0].Message}}}
				w.err = problem
				if p.Status == 503 {
					w.err = unavailable(problem)
				}
				results = append(results, fakeratelimitd.Problem{Problem: p})
			}
			want = append(want, w)
		}
		body := mustJSON(t, map[string]any{"results": results, "extra": map[string]any{"nested": []any{true, -1e3}}})
		if err := decodeAnswer(body, batch, &scratch{names: map[string]string{}, periods: map[string]time.Duration{}}); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		for i, cl := range batch {
			w := want[i]
			if fmt.Sprint(cl.res) != fmt.Sprint(w.res) || cl.lease != w.lease || cl.released != w.released ||
				fmt.Sprint(cl.err) != fmt.Sprint(w.err) || (cl.err == nil) != (w.err == nil) {
				t.Fatalf("result %d of %s:\ngot  %+v %+v %v %v\nwant %+v %+v %v %v", i, body,
					cl.res, cl.lease, cl.released, cl.err, w.res, w.lease, w.released, w.err)
			}
		}
	}
}

// TestDecodeGarbage refuses answers that are not the route's.
func TestDecodeGarbage(t *testing.T) {
	for _, body := range []string{
		``, `[]`, `{"results":{}}`, `{"results":[]}`, `{"results":[{},{}]}`, `{"results":[{"allowed":1}]}`,
		`{"results":[{"allowed":true}]} x`, `{"results":[{"retry_after_ms":1.5}]}`, `{"results":[{"retry_after_ms":-2}]}`,
		`{"results":[{"decisions":[{"remaining":99999999999999999999}]}]}`, `{"results":[{"decisions":[{"period":"soon"}]}]}`,
		`{"results":[{"lease":{"id":"x","expires_at":"yesterday"}}]}`, `{"results":[{"problem":{"status":200}}]}`,
		`{"results":[{"decisions":[{"limit":"a` + "\xff" + `"}]}]}`, `{"results":[{"allowed":true,}]}`, `{"results":[{"allowed":true]}`,
	} {
		batch := []*call{{buckets: []Bucket{{}}}}
		if err := decodeAnswer([]byte(body), batch, &scratch{names: map[string]string{}, periods: map[string]time.Duration{}}); err == nil {
			t.Errorf("%q was read as an answer", body)
		}
	}
}

// FuzzDecodeAnswer: no input makes the reader panic, and what it takes is
// JSON.
func FuzzDecodeAnswer(f *testing.F) {
	f.Add([]byte(`{"results":[{"allowed":true,"retry_after_ms":0,"reset_after_ms":10,"degraded":false,"decisions":[{"limit":"L","bucket_id":"1","allowed":true,"reason":null,"remaining":9,"debt":0,"retry_after_ms":0,"reset_after_ms":10,"burst":10,"count":10,"period":"1s","unit":"requests","source":"default","shadow":false}]}]}`))
	f.Add([]byte(`{"results":[{"problem":{"type":"t","title":"T","status":422,"detail":"d","errors":[{"field":"f","message":"m"}]}}]}`))
	f.Add([]byte(`{"results":[{"lease":{"id":"lse_1","expires_at":"2026-11-25T21:00:30Z"},"degraded":false}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		batch := []*call{{buckets: []Bucket{{ID: "1"}}}}
		if decodeAnswer(body, batch, &scratch{names: map[string]string{}, periods: map[string]time.Duration{}}) == nil && !json.Valid(body) {
			t.Errorf("%q is not JSON, but was read as an answer", body)
		}
	})
}

// TestAppendCall writes calls of every op and reads them back with
// encoding/json.
func TestAppendCall(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		cl := &call{op: op(rng.IntN(len(opNames)))}
		var want fakeratelimitd.Request
		want.Op = opNames[cl.op]
		switch cl.op {
		case opRelease, opRenew:
			cl.leaseID = randomString(rng)
			want.LeaseID = cl.leaseID
		case opSettle:
			for range 1 + rng.IntN(3) {
				s := Settlement{Limit: randomString(rng), ID: randomString(rng), Reserved: rng.Int64N(1 << 60), Actual: rng.Int64N(1 << 60)}
				cl.settlements = append(cl.settlements, s)
				want.Buckets = append(want.Buckets, fakeratelimitd.Bucket{Limit: s.Limit, BucketID: s.ID, Reserved: &s.Reserved, Actual: &s.Actual})
			}
		default:
			for range 1 + rng.IntN(3) {
				b := Bucket{Limit: randomString(rng), ID: randomString(rng), Cost: rng.Int64N(3) - 1}
				cl.buckets = append(cl.buckets, b)
				fb := fakeratelimitd.Bucket{Limit: b.Limit, BucketID: b.ID}
				if b.Cost != 1 {
					fb.Cost = &b.Cost
				}
				want.Buckets = append(want.Buckets, fb)
			}
		}
		if cl.op == opAcquire || cl.op == opRenew {
			cl.ttl = time.Duration(rng.Int64N(int64(time.Minute)))
			if ms := int64((cl.ttl + time.Millisecond - 1) / time.Millisecond); ms > 0 {
				want.TTLMs = &ms
			}
		}
		body := appendCall(nil, cl)
		var got fakeratelimitd.Request
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if string(mustJSON(t, got)) != string(mustJSON(t, want)) {
			t.Fatalf("%s read as %s, want %s", body, mustJSON(t, got), mustJSON(t, want))
		}
	}
}
