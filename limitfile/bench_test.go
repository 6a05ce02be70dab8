package limitfile

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// BenchmarkImportOverrides imports 10,000 overrides in the list format into
// the fake store, which costs next to nothing: what is measured is parsing
// and checking.
func BenchmarkImportOverrides(b *testing.B) {
	var doc strings.Builder
	doc.WriteString("- NewOrdersPerAccount:\n    burst: 10\n    count: 10\n    period: 1h\n    ids:\n")
	for i := range 10000 {
		doc.WriteString("      - id: \"" + strconv.Itoa(i+1) + "\"\n        comment: customer " + strconv.Itoa(i) + "\n")
	}
	data := []byte(doc.String())
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		st := newFakeStore(catalogue()...)
		if _, errs, err := Import(b.Context(), st, "bench", Overrides, data, ImportOptions{DryRun: true}); err != nil || errs != nil {
			b.Fatal(errs, err)
		}
	}
}

// BenchmarkExportOverrides exports 10,000 overrides.
func BenchmarkExportOverrides(b *testing.B) {
	st := newFakeStore(catalogue()...)
	for i := range 10000 {
		st.withOverride(limiterOverride("NewOrdersPerAccount", strconv.Itoa(i+1), int64(i%3)))
	}
	for b.Loop() {
		if _, err := Export(b.Context(), st, Overrides); err != nil {
			b.Fatal(err)
		}
	}
}

func limiterOverride(limit, id string, burst int64) limiter.Override {
	return limiter.Override{Limit: limit, BucketID: id, Params: params(burst, 10, time.Hour), Comment: "c" + id, Enabled: true}
}
