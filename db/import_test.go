package db

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestImport(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		existing := e.putLimit(t, limitOf("Existing", limiter.RegID))
		e.putLimit(t, limitOf("Same", limiter.RegID))
		kept := e.createOverride(t, overrideOf("Existing", "1"))
		changed := e.createOverride(t, overrideOf("Existing", "2"))
		// Disabled with an expiry: an import keeps both.
		changed, err := e.db.UpdateOverride(ctx, "bob", changed.ID, func(o *limiter.Override, _ limiter.Limit) error {
			o.Enabled, o.ExpiresAt = false, epoch().Add(time.Hour)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		e.clock.Advance(time.Hour)
		update := existing
		update.Enum, update.Burst = 0, 11
		newLimit := limitOf("New", limiter.RegID)
		limits := []limiter.Limit{update, limitOf("Same", limiter.RegID), newLimit}
		raised := overrideOf("Existing", "2")
		raised.Burst, raised.Comment = 500, "raised"
		overrides := []limiter.Override{overrideOf("Existing", "1"), raised, overrideOf("New", "7"), overrideOf("Existing", "3")}
		want := limiter.ImportCounts{Created: 3, Updated: 2, Unchanged: 2}

		before := e.rowCounts(t)
		counts, err := e.db.Import(ctx, "importer", limits, overrides, true)
		if err != nil || !reflect.DeepEqual(counts, want) {
			t.Fatalf("dry run = %+v, %v; want %+v", counts, err, want)
		}
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("dry run wrote: %v -> %v", before, after)
		}

		counts, err = e.db.Import(ctx, "importer", limits, overrides, false)
		if err != nil || !reflect.DeepEqual(counts, want) {
			t.Fatalf("Import = %+v, %v; want %+v", counts, err, want)
		}
		if l, _ := e.db.GetLimit(ctx, "Existing"); l.Burst != 11 || l.Enum != existing.Enum {
			t.Errorf("updated limit = %+v", l)
		}
		if l, _ := e.db.GetLimit(ctx, "New"); l.Enum != 102 {
			t.Errorf("new limit = %+v", l)
		}
		if o, _ := e.db.GetOverride(ctx, kept.ID); o != kept {
			t.Errorf("unchanged override became %+v", o)
		}
		got, _ := e.db.GetOverride(ctx, changed.ID)
		if got.Burst != 500 || got.Comment != "raised" || got.Enabled || !got.ExpiresAt.Equal(changed.ExpiresAt) ||
			got.Version != changed.Version+1 || got.UpdatedBy != "importer" || !got.UpdatedAt.Equal(e.clock.Now().Truncate(time.Microsecond)) {
			t.Errorf("updated override = %+v (was %+v)", got, changed)
		}
		list, _, _ := e.db.ListOverrides(ctx, limiter.OverrideFilter{Limit: "New"})
		if len(list) != 1 || !list[0].Enabled || !list[0].ExpiresAt.IsZero() || list[0].Version != 1 || list[0].UpdatedBy != "importer" {
			t.Errorf("created override = %+v", list)
		}
		h, err := e.db.OverrideHistory(ctx, changed.ID)
		if err != nil || len(h) != 3 || h[2].Actor != "importer" || h[2].Before.Burst != 100 || h[2].After.Burst != 500 {
			t.Errorf("history of the imported change = %+v, %v", h, err)
		}

		// Importing the same again changes nothing.
		counts, err = e.db.Import(ctx, "importer", limits, overrides, false)
		if want := (limiter.ImportCounts{Unchanged: 7}); err != nil || !reflect.DeepEqual(counts, want) {
			t.Errorf("second import = %+v, %v; want %+v", counts, err, want)
		}
	})
}

func TestImportAllOrNothing(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		taken := limitOf("Taken", limiter.RegID)
		taken.Enum = 17
		e.putLimit(t, taken)
		before := e.rowCounts(t)

		good := []limiter.Limit{limitOf("A", limiter.RegID)}
		goodOverrides := []limiter.Override{overrideOf("L", "1"), overrideOf("A", "2")}
		clash := limitOf("Clash", limiter.RegID)
		clash.Enum = 17
		for _, tc := range []struct {
			name      string
			limits    []limiter.Limit
			overrides []limiter.Override
			kind      error
		}{
			{"enum taken", append(good, clash), goodOverrides, limiter.ErrEnumTaken},
			{"unknown limit", good, append(goodOverrides, overrideOf("Nope", "3")), limiter.ErrUnknownLimit},
			{"same bucket twice", good, append(goodOverrides, overrideOf("L", "1")), limiter.ErrOverrideExists},
		} {
			for _, dry := range []bool{false, true} {
				_, err := e.db.Import(ctx, "importer", tc.limits, tc.overrides, dry)
				wantError(t, err, tc.kind)
				if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("%s (dry run %v): rows %v -> %v", tc.name, dry, before, after)
				}
			}
		}
	})
}

func TestImportManyOverrides(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		n := 3*e.db.be.batchRows() + 17
		overrides := make([]limiter.Override, n)
		for i := range overrides {
			overrides[i] = overrideOf("Big", fmt.Sprint(i+1))
		}
		limits := []limiter.Limit{limitOf("Big", limiter.RegID)}
		v := e.version(t)
		counts, err := e.db.Import(ctx, "importer", limits, overrides, false)
		if err != nil || counts.Created != n+1 {
			t.Fatalf("Import = %+v, %v", counts, err)
		}
		c, err := e.db.Since(ctx, v)
		if err != nil || len(c.Limits) != 1 || len(c.Overrides) != n || c.Version != v+int64(n)+1 {
			t.Fatalf("Since after import: %d limits, %d overrides, version %d (from %d), %v", len(c.Limits), len(c.Overrides), c.Version, v, err)
		}
		for i := range overrides {
			overrides[i].Count = 51
		}
		counts, err = e.db.Import(ctx, "importer", nil, overrides, false)
		if err != nil || counts.Updated != n {
			t.Fatalf("re-import = %+v, %v", counts, err)
		}
		list, _, _ := e.db.ListOverrides(ctx, limiter.OverrideFilter{PageSize: 1000})
		for _, o := range list {
			if o.Count != 51 || o.Version != 2 {
				t.Fatalf("re-imported override = %+v", o)
			}
		}
	})
}

// TestImportCanonicalisesUnderTheLock imports overrides whose ids were
// checked against another id format than the limit has when the write
// runs, as an import racing a change of the format would: the ids are
// canonicalised by the format the limit has then, and an id it refuses
// writes nothing.
func TestImportCanonicalisesUnderTheLock(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.Domain))
		before := e.rowCounts(t)
		_, err := e.db.Import(ctx, "importer", nil, []limiter.Override{overrideOf("L", "WWW.Example.co.uk"), overrideOf("L", "192.0.2.0/24")}, false)
		wantError(t, err, limiter.ErrIDRefused)
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("rows %v -> %v", before, after)
		}
		if _, err := e.db.Import(ctx, "importer", nil, []limiter.Override{overrideOf("L", "WWW.Example.co.uk")}, false); err != nil {
			t.Fatal(err)
		}
		page, _, err := e.db.ListOverrides(ctx, limiter.OverrideFilter{Limit: "L"})
		if err != nil || len(page) != 1 || page[0].BucketID != "www.example.co.uk" {
			t.Errorf("stored overrides = %+v, %v; want one of www.example.co.uk", page, err)
		}
	})
}

// pauseHandler is a logger that runs onPlanned once, in the goroutine that
// logs "import planned".
type pauseHandler struct {
	once      sync.Once
	onPlanned func()
}

func (h *pauseHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *pauseHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "import planned" {
		h.once.Do(h.onPlanned)
	}
	return nil
}
func (h *pauseHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *pauseHandler) WithGroup(string) slog.Handler      { return h }

// TestImportHoldsNoWrites: a large import reads and checks everything
// before it takes the write lock, so that another admin write made
// meanwhile completes, before the import does; the import then sees that
// write (it plans again under the lock) and both are kept.
func TestImportHoldsNoWrites(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		const n = 2000
		var limits []limiter.Limit
		var rules []limiter.Rule
		var overrides []limiter.Override
		for i := range n {
			l := limitOf(fmt.Sprintf("L%d", i), limiter.String)
			l.Burst = 7
			limits = append(limits, l)
			rules = append(rules, ruleOf("big", l.Name, fmt.Sprintf("k%d", i), ""))
			overrides = append(overrides, overrideOf(l.Name, "partner"))
		}
		var mu sync.Mutex
		var order []string
		done := func(what string) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, what)
		}
		var writeErr error
		h := &pauseHandler{onPlanned: func() {
			// The same limit as the import's first, with another burst.
			_, _, writeErr = e.db.PutLimit(ctx, "bob", limitOf("L0", limiter.String))
			done("put limit")
		}}
		importer, err := Open(ctx, e.url, Options{Now: e.clock.Now, Logger: slog.New(h)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = importer.Close() })
		counts, err := importer.ImportRules(ctx, "importer", "big", limits, rules, overrides, false, false)
		done("import")
		if err != nil || writeErr != nil {
			t.Fatalf("import: %v; the write during it: %v", err, writeErr)
		}
		if want := []string{"put limit", "import"}; !slices.Equal(order, want) {
			t.Fatalf("completed in the order %v, want %v", order, want)
		}
		if counts.Created != 3*n-1 || counts.Updated != 1 {
			t.Errorf("counts %+v: the import did not see the limit written meanwhile", counts)
		}
		if l, err := e.db.GetLimit(ctx, "L0"); err != nil || l.Burst != 7 {
			t.Errorf("L0 = %+v, %v; want the import's burst", l, err)
		}
	})
}
