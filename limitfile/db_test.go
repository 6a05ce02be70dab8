package limitfile_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// The real database satisfies Store.
var _ limitfile.Store = (*db.DB)(nil)

// TestDB runs the whole flow against SQLite: Boulder's files in, an export
// out, and the export in again without a change.
func TestDB(t *testing.T) {
	ctx := t.Context()
	d, err := db.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "ratelimitd.db"), db.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	imp := func(kind limitfile.Kind, data []byte, dryRun bool) limiter.ImportCounts {
		t.Helper()
		counts, errs, err := limitfile.Import(ctx, d, "tester", kind, data, limitfile.ImportOptions{DryRun: dryRun})
		if err != nil || errs != nil {
			t.Fatalf("Import: %v, %v", errs, err)
		}
		return counts
	}

	// A dry run counts and writes nothing.
	if got, want := imp(limitfile.Defaults, read("boulder_defaults.yaml"), true), (limiter.ImportCounts{Created: 9}); !reflect.DeepEqual(got, want) {
		t.Errorf("dry run counts %+v, want %+v", got, want)
	}
	if ls, _ := d.ListLimits(ctx); len(ls) != 0 {
		t.Fatalf("the dry run wrote %d limits", len(ls))
	}
	if got, want := imp(limitfile.Defaults, read("boulder_defaults.yaml"), false), (limiter.ImportCounts{Created: 9}); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults counts %+v, want %+v", got, want)
	}
	if got, want := imp(limitfile.Defaults, read("ours_defaults.yaml"), false), (limiter.ImportCounts{Created: 2, Unchanged: 1}); !reflect.DeepEqual(got, want) {
		t.Errorf("our defaults counts %+v, want %+v", got, want)
	}
	l, err := d.GetLimit(ctx, "AccountsPerSite")
	if err != nil || l.Enum != limiter.FirstAssignedEnum || l.IDFormat != limiter.String {
		t.Errorf("AccountsPerSite = %+v, %v; want enum %d, id format string", l, err, limiter.FirstAssignedEnum)
	}
	if got, want := imp(limitfile.Overrides, read("boulder_overrides.yaml"), false), (limiter.ImportCounts{Created: 9}); !reflect.DeepEqual(got, want) {
		t.Errorf("overrides counts %+v, want %+v", got, want)
	}
	// The map format names two of the same buckets again, without their
	// comments, and two new ones.
	if got, want := imp(limitfile.Overrides, read("boulder_overrides_map.yaml"), false), (limiter.ImportCounts{Created: 2, Updated: 2}); !reflect.DeepEqual(got, want) {
		t.Errorf("map overrides counts %+v, want %+v", got, want)
	}
	if got, want := imp(limitfile.Overrides, read("ours_overrides.yaml"), false), (limiter.ImportCounts{Created: 5}); !reflect.DeepEqual(got, want) {
		t.Errorf("our overrides counts %+v, want %+v", got, want)
	}

	// A disabled override is left out of the export, and the import of the
	// export leaves it alone.
	found, _, err := d.ListOverrides(ctx, limiter.OverrideFilter{Limit: "NewOrdersPerAccount", BucketIDs: []string{"111"}})
	if err != nil || len(found) != 1 {
		t.Fatalf("ListOverrides: %v, %v", found, err)
	}
	if _, err := d.UpdateOverride(ctx, "tester", found[0].ID, func(o *limiter.Override, _ limiter.Limit) error {
		o.Enabled = false
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	for _, kind := range []limitfile.Kind{limitfile.Defaults, limitfile.Overrides} {
		out, err := limitfile.Export(ctx, d, kind)
		if err != nil {
			t.Fatal(err)
		}
		before := dump(t, d)
		want := limiter.ImportCounts{Unchanged: 11}
		if kind == limitfile.Overrides {
			want = limiter.ImportCounts{Unchanged: 9 + 2 + 5 - 1}
		}
		if got := imp(kind, out, false); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: import of the export counts %+v, want %+v\n%s", kind, got, want, out)
		}
		if after := dump(t, d); !reflect.DeepEqual(after, before) {
			t.Errorf("%s: import of the export changed the database", kind)
		}
		again, err := limitfile.Export(ctx, d, kind)
		if err != nil || string(again) != string(out) {
			t.Errorf("%s: second export differs (%v):\n%s\nfirst:\n%s", kind, err, again, out)
		}
	}

	// A bad document writes nothing, though its good entries come first.
	bad := []byte("- NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, ids: [99]}\n- NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, ids: [x]}\n")
	before := dump(t, d)
	_, errs, err := limitfile.Import(ctx, d, "tester", limitfile.Overrides, bad, limitfile.ImportOptions{})
	if err != nil || len(errs) != 1 || errs[0].Line != 2 {
		t.Errorf("bad import: %v, %v; want one error on line 2", errs, err)
	}
	if after := dump(t, d); !reflect.DeepEqual(after, before) {
		t.Errorf("a bad import changed the database")
	}
}

// state is what a test compares of a database: every limit and override
// with its version and update time, so that a write shows.
type state struct {
	limits    []limiter.Limit
	overrides map[string]limiter.Override
}

func dump(t *testing.T, d *db.DB) state {
	t.Helper()
	s := state{overrides: map[string]limiter.Override{}}
	var err error
	if s.limits, err = d.ListLimits(t.Context()); err != nil {
		t.Fatal(err)
	}
	for token := ""; ; {
		page, next, err := d.ListOverrides(t.Context(), limiter.OverrideFilter{PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			s.overrides[o.ID] = o
		}
		if next == "" {
			return s
		}
		token = next
	}
}
