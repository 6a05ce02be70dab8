package limitfile_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/limitfile"
)

// envoyDoc writes an Envoy configuration of n descriptors: pairs of a
// descriptor of any value, which becomes a limit and a rule, and one of a
// value under it, which becomes an override of that limit.
func envoyDoc(n int) []byte {
	var b strings.Builder
	b.WriteString("domain: bench\ndescriptors:\n")
	for i := range n {
		k := strconv.Itoa(i / 2)
		if i%2 == 0 {
			b.WriteString("  - key: client_" + k + "\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n")
		} else {
			b.WriteString("  - key: client_" + k + "\n    value: partner\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n")
		}
	}
	return []byte(b.String())
}

// envoyDocOfSize is envoyDoc with as many descriptors as size bytes hold.
func envoyDocOfSize(size int) []byte {
	n := size / 80
	for {
		if doc := envoyDoc(n); len(doc) >= size {
			return doc
		}
		n += n / 10
	}
}

// BenchmarkImportEnvoy imports a file of 1,000 and 6,000 descriptors (and,
// with -benchtime 1x, 10 MiB) into an empty database of each engine:
// parsing, resolution and the writes. The time per descriptor should not
// grow with the file.
func BenchmarkImportEnvoy(b *testing.B) {
	for _, engine := range []string{"sqlite", "postgres"} {
		for _, size := range []string{"1000", "6000", "10MiB"} {
			b.Run(engine+"/"+size, func(b *testing.B) {
				var doc []byte
				if size == "10MiB" {
					doc = envoyDocOfSize(10 << 20)
				} else {
					n, _ := strconv.Atoi(size)
					doc = envoyDoc(n)
				}
				b.SetBytes(int64(len(doc)))
				for b.Loop() {
					b.StopTimer()
					d := envoyDB(b, engine == "postgres")
					b.StartTimer()
					counts, errs, err := limitfile.ImportEnvoy(b.Context(), d, "bench", doc, limitfile.ImportOptions{})
					if err != nil || errs != nil || counts.Created == 0 {
						b.Fatal(counts, errs, err)
					}
				}
			})
		}
	}
}

// BenchmarkExportEnvoy writes back a domain of 1,000 and 6,000
// descriptors; the time per descriptor should not grow with the domain.
func BenchmarkExportEnvoy(b *testing.B) {
	for _, n := range []int{1000, 6000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			d := envoyDB(b, false)
			if _, errs, err := limitfile.ImportEnvoy(b.Context(), d, "bench", envoyDoc(n), limitfile.ImportOptions{}); err != nil || errs != nil {
				b.Fatal(errs, err)
			}
			for b.Loop() {
				if _, err := limitfile.ExportEnvoy(b.Context(), d, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
