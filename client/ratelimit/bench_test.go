package ratelimit

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// answerOf is an answer of n one-bucket spends, as ratelimitd writes it,
// and the batch it answers.
func answerOf(b *testing.B, n int) ([]byte, []*call) {
	results := make([]fakeratelimitd.Result, n)
	batch := make([]*call, n)
	for i := range n {
		id := strconv.Itoa(1000 + i)
		results[i] = fakeratelimitd.Result{Allowed: true, ResetAfterMs: 1, Decisions: []fakeratelimitd.Decision{{
			Limit: "bench_allowed_one", BucketID: id, Allowed: true, Remaining: 999999999, ResetAfterMs: 1,
			Burst: 1000000000, Count: 1000000, Period: "1s", Unit: "requests", Source: "default"}}}
		batch[i] = &call{op: opSpend, buckets: []Bucket{{Limit: "bench_allowed_one", ID: id, Cost: 1}}}
	}
	body, err := json.Marshal(map[string]any{"results": results})
	if err != nil {
		b.Fatal(err)
	}
	return body, batch
}

// BenchmarkDecode reads an answer of 20 spends, about the mean request of
// make bench's client row, per decision.
func BenchmarkDecode(b *testing.B) {
	body, batch := answerOf(b, 20)
	sc := &scratch{names: map[string]string{}, periods: map[string]time.Duration{}}
	b.SetBytes(int64(len(body)) / 20)
	for b.Loop() {
		if err := decodeAnswer(body, batch, sc); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*20), "ns/decision")
}

// BenchmarkDecodeEncodingJSON reads the same answer with encoding/json,
// into structs of the same fields: what the hand-written reader saves.
func BenchmarkDecodeEncodingJSON(b *testing.B) {
	body, _ := answerOf(b, 20)
	b.SetBytes(int64(len(body)) / 20)
	for b.Loop() {
		var answer struct {
			Results []fakeratelimitd.Result `json:"results"`
		}
		if err := json.Unmarshal(body, &answer); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*20), "ns/decision")
}

// BenchmarkAppendCall writes a one-bucket spend.
func BenchmarkAppendCall(b *testing.B) {
	cl := &call{op: opSpend, buckets: []Bucket{{Limit: "bench_allowed_one", ID: "1234", Cost: 1}}}
	buf := make([]byte, 0, 256)
	for b.Loop() {
		buf = appendCall(buf[:0], cl)
	}
}
