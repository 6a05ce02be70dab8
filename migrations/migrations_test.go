package migrations

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// TestSetsMatch keeps the two sets in step: the same files, numbered
// 00001, 00002, ... without gaps, each with an Up and a Down section.
func TestSetsMatch(t *testing.T) {
	names := func(fsys fs.FS) []string {
		t.Helper()
		files, err := fs.Glob(fsys, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := fs.ReadFile(fsys, f)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "-- +goose Up") || !strings.Contains(string(b), "-- +goose Down") {
				t.Errorf("%s lacks an Up or a Down section", f)
			}
		}
		return files
	}
	pg, lite := names(Postgres()), names(SQLite())
	if !slices.Equal(pg, lite) {
		t.Fatalf("Postgres has %v, SQLite %v", pg, lite)
	}
	if len(pg) == 0 {
		t.Fatal("no migrations")
	}
	for i, f := range pg {
		if want := fmt.Sprintf("%05d_", i+1); !strings.HasPrefix(f, want) {
			t.Errorf("migration %d is %s, want a name starting %s", i+1, f, want)
		}
	}
}
