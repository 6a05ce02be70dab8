package db

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/migrations"
)

// The contract suite: every test runs against both engines, each time on
// a database of its own.

// quiet is the logger of tests: migrations are not news there.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// env is one test's database.
type env struct {
	engine string
	url    string
	db     *DB
	clock  *testenv.Clock
}

// epoch is the test clock's first reading; its nanoseconds show that
// stored times are cut to microseconds.
func epoch() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC) }

func databaseURL(t testing.TB, engine string) string {
	if engine == "postgres" {
		return testenv.Postgres(t)
	}
	return "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
}

func openMigrated(t testing.TB, url string, now func() time.Time) *DB {
	t.Helper()
	d, err := Open(context.Background(), url, Options{Now: now, Logger: quiet()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return d
}

func newEnv(t testing.TB, engine string) *env {
	c := testenv.NewClock(epoch())
	url := databaseURL(t, engine)
	return &env{engine: engine, url: url, db: openMigrated(t, url, c.Now), clock: c}
}

// run runs test on each engine, in parallel.
func run(t *testing.T, test func(t *testing.T, e *env)) {
	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, engine))
		})
	}
}

func ctxT(t *testing.T) context.Context { return t.Context() }

func limitOf(name string, f limiter.IDFormat) limiter.Limit {
	return limiter.Limit{
		Name: name, IDFormat: f,
		Params:      limiter.Params{Burst: 10, Count: 5, Period: time.Hour},
		Description: "test limit " + name,
		Unit:        limiter.DefaultUnit,
	}
}

func (e *env) putLimit(t *testing.T, l limiter.Limit) limiter.Limit {
	t.Helper()
	got, _, err := e.db.PutLimit(ctxT(t), "alice", l)
	if err != nil {
		t.Fatalf("PutLimit(%s): %v", l.Name, err)
	}
	return got
}

func overrideOf(limit, bucket string) limiter.Override {
	return limiter.Override{
		Limit: limit, BucketID: bucket,
		Params:  limiter.Params{Burst: 100, Count: 50, Period: time.Minute},
		Comment: "ticket " + bucket, Enabled: true,
	}
}

func (e *env) createOverride(t *testing.T, o limiter.Override) limiter.Override {
	t.Helper()
	got, err := e.db.CreateOverride(ctxT(t), "bob", o)
	if err != nil {
		t.Fatalf("CreateOverride(%s, %s): %v", o.Limit, o.BucketID, err)
	}
	return got
}

// rowCounts counts the rows of every table.
func (e *env) rowCounts(t *testing.T) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, table := range []string{"limits", "enums", "overrides", "audit", "tokens"} {
		var n int
		if err := e.db.reader.QueryRowContext(ctxT(t), "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("counting %s: %v", table, err)
		}
		counts[table] = n
	}
	return counts
}

// version returns the database's current change version.
func (e *env) version(t *testing.T) int64 {
	t.Helper()
	c, err := e.db.Since(ctxT(t), 0)
	if err != nil {
		t.Fatalf("Since(0): %v", err)
	}
	return c.Version
}

// wantError checks that err wraps kind and that its message, which API
// clients see, is the one expected and holds no SQL or driver text.
func wantError(t *testing.T, err, kind error, msg string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want %v", err, kind)
	}
	if msg != "" && err.Error() != msg {
		t.Errorf("message = %q, want %q", err.Error(), msg)
	}
	lower := strings.ToLower(err.Error())
	for _, leak := range []string{"sqlstate", "constraint", "insert", "update ", "select", "sqlite", "pgx", "violat"} {
		if strings.Contains(lower, leak) {
			t.Errorf("message %q leaks %q", err.Error(), leak)
		}
	}
}

func TestLimitCRUD(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		l, created, err := e.db.PutLimit(ctx, "alice", limitOf("NewOrdersPerAccount", limiter.RegID))
		if err != nil || !created {
			t.Fatalf("PutLimit = %v, %v; want created", created, err)
		}
		want := limitOf("NewOrdersPerAccount", limiter.RegID)
		want.Enum = 3 // its number in Let's Encrypt's catalogue
		want.Generation = 1
		want.CreatedAt = epoch().Truncate(time.Microsecond)
		want.UpdatedAt = want.CreatedAt
		if l != want {
			t.Fatalf("PutLimit returned %+v, want %+v", l, want)
		}
		if got, err := e.db.GetLimit(ctx, l.Name); err != nil || got != want {
			t.Fatalf("GetLimit = %+v, %v; want %+v", got, err, want)
		}

		e.clock.Advance(time.Minute)
		change := want
		change.Burst, change.Description, change.Shadow, change.Unit = 20, "changed", true, "tokens"
		change.Enum = 0
		got, created, err := e.db.PutLimit(ctx, "alice", change)
		if err != nil || created {
			t.Fatalf("update: created %v, err %v", created, err)
		}
		if got.Burst != 20 || got.Description != "changed" || !got.Shadow || got.Unit != "tokens" || got.Enum != want.Enum ||
			!got.CreatedAt.Equal(want.CreatedAt) || !got.UpdatedAt.Equal(e.clock.Now().Truncate(time.Microsecond)) {
			t.Fatalf("update returned %+v", got)
		}

		// An update that changes nothing writes nothing.
		v := e.version(t)
		e.clock.Advance(time.Minute)
		again, created, err := e.db.PutLimit(ctx, "alice", change)
		if err != nil || created || again != got {
			t.Fatalf("unchanged update = %+v, %v, %v; want %+v", again, created, err, got)
		}
		if e.version(t) != v {
			t.Error("an unchanged update wrote an audit entry")
		}

		// Names are case-sensitive and listed in byte order.
		e.putLimit(t, limitOf("b", limiter.String))
		e.putLimit(t, limitOf("a", limiter.String))
		e.putLimit(t, limitOf("B", limiter.String))
		list, err := e.db.ListLimits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, l := range list {
			names = append(names, l.Name)
		}
		if want := []string{"B", "NewOrdersPerAccount", "a", "b"}; !slices.Equal(names, want) {
			t.Errorf("ListLimits names = %v, want %v", names, want)
		}

		_, err = e.db.GetLimit(ctx, "missing")
		wantError(t, err, limiter.ErrNotFound, `limit "missing" not found`)
		if err := e.db.DeleteLimit(ctx, "alice", "b"); err != nil {
			t.Fatalf("DeleteLimit: %v", err)
		}
		_, err = e.db.GetLimit(ctx, "b")
		wantError(t, err, limiter.ErrNotFound, "")
		wantError(t, e.db.DeleteLimit(ctx, "alice", "b"), limiter.ErrNotFound, `limit "b" not found`)
	})
}

func TestEnumAssignment(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		if l := e.putLimit(t, limitOf("first", limiter.String)); l.Enum != 100 {
			t.Errorf("first assigned enum = %d, want 100", l.Enum)
		}
		explicit := limitOf("explicit", limiter.String)
		explicit.Enum = 50
		if l := e.putLimit(t, explicit); l.Enum != 50 {
			t.Errorf("explicit enum = %d, want 50", l.Enum)
		}
		high := limitOf("high", limiter.String)
		high.Enum = 102
		e.putLimit(t, high)
		// The lowest number never given, not the one after the highest.
		if l := e.putLimit(t, limitOf("second", limiter.String)); l.Enum != 101 {
			t.Errorf("second assigned enum = %d, want 101", l.Enum)
		}
		if l := e.putLimit(t, limitOf("third", limiter.String)); l.Enum != 103 {
			t.Errorf("third assigned enum = %d, want 103", l.Enum)
		}

		taken := limitOf("taken", limiter.String)
		taken.Enum = 50
		_, _, err := e.db.PutLimit(ctx, "alice", taken)
		wantError(t, err, limiter.ErrConflict, `enum 50 is taken by limit "explicit"`)

		change := limitOf("explicit", limiter.String)
		change.Enum = 51
		_, _, err = e.db.PutLimit(ctx, "alice", change)
		wantError(t, err, limiter.ErrConflict, `limit "explicit" has enum 50: an enum cannot change`)

		// Enum 0 on update keeps the enum; so does giving the same one.
		change.Enum, change.Burst = 0, 99
		if l := e.putLimit(t, change); l.Enum != 50 || l.Burst != 99 {
			t.Errorf("update with enum 0 = %+v", l)
		}
		change.Enum, change.Burst = 50, 98
		if l := e.putLimit(t, change); l.Enum != 50 || l.Burst != 98 {
			t.Errorf("update with the same enum = %+v", l)
		}

		// A name of Let's Encrypt's catalogue gets its number there.
		if l := e.putLimit(t, limitOf("NewOrdersPerAccount", limiter.RegID)); l.Enum != 3 {
			t.Errorf("NewOrdersPerAccount got enum %d, want 3", l.Enum)
		}
	})
}

// wantEnumError fails unless err is a 422 naming enum whose message holds msg.
func wantEnumError(t *testing.T, err error, msg string) {
	t.Helper()
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != "enum" || !strings.Contains(ve.Fields[0].Message, msg) {
		t.Errorf("err = %v, want a validation error of enum saying %q", err, msg)
	}
}

func TestEnumsAreGivenOnce(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		old := e.putLimit(t, limitOf("OldA", limiter.String))
		explicit := limitOf("Explicit", limiter.String)
		explicit.Enum = 42
		e.putLimit(t, explicit)
		for _, name := range []string{"OldA", "Explicit"} {
			if err := e.db.DeleteLimit(ctx, "alice", name); err != nil {
				t.Fatal(err)
			}
		}
		// Neither the assigned nor the explicit enum is given again, under
		// the old name or another.
		if l := e.putLimit(t, limitOf("NewB", limiter.String)); l.Enum == old.Enum || l.Enum != 101 {
			t.Errorf("NewB got enum %d after OldA's %d was deleted; want 101", l.Enum, old.Enum)
		}
		if l := e.putLimit(t, limitOf("OldA", limiter.String)); l.Enum != 102 {
			t.Errorf("OldA again got enum %d, want 102", l.Enum)
		}
		before := e.rowCounts(t)
		for _, name := range []string{"Explicit", "Other"} {
			again := limitOf(name, limiter.String)
			again.Enum = 42
			_, _, err := e.db.PutLimit(ctx, "alice", again)
			wantEnumError(t, err, "42 was the enum of limit Explicit, which was deleted")
		}
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("refused creations wrote: rows %v -> %v", before, after)
		}
	})
}

func TestEnumsRunOut(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		top := limitOf("A", limiter.String)
		top.Enum = limiter.MaxEnum
		e.putLimit(t, top)
		// The number after the largest enum is never given, nor computed
		// in 32 bits.
		if l := e.putLimit(t, limitOf("B", limiter.String)); l.Enum != limiter.FirstAssignedEnum {
			t.Errorf("B got enum %d, want %d", l.Enum, limiter.FirstAssignedEnum)
		}
		// Two billion limits are out of a test's reach: a lower bound
		// stands for MaxEnum.
		e.db.maxEnum = limiter.FirstAssignedEnum + 1
		if l := e.putLimit(t, limitOf("C", limiter.String)); l.Enum != limiter.FirstAssignedEnum+1 {
			t.Errorf("C got enum %d, want %d", l.Enum, limiter.FirstAssignedEnum+1)
		}
		if err := e.db.DeleteLimit(ctx, "alice", "C"); err != nil {
			t.Fatal(err)
		}
		before := e.rowCounts(t)
		_, _, err := e.db.PutLimit(ctx, "alice", limitOf("D", limiter.String))
		wantEnumError(t, err, "no enum is left")
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("a refused creation wrote: rows %v -> %v", before, after)
		}
		// An explicit enum below the bound still works.
		explicit := limitOf("E", limiter.String)
		explicit.Enum = 10
		e.putLimit(t, explicit)
	})
}

func TestCatalogueEnums(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		before := e.rowCounts(t)
		squat := limitOf("MyLimit", limiter.RegID)
		squat.Enum = 3
		_, _, err := e.db.PutLimit(ctx, "alice", squat)
		wantEnumError(t, err, "3 is reserved for NewOrdersPerAccount")
		wrong := limitOf("NewOrdersPerAccount", limiter.RegID)
		wrong.Enum = 4
		_, _, err = e.db.PutLimit(ctx, "alice", wrong)
		wantEnumError(t, err, "NewOrdersPerAccount has enum 3")
		_, err = e.db.Import(ctx, "importer", []limiter.Limit{squat}, nil, false)
		wantEnumError(t, err, "3 is reserved for NewOrdersPerAccount")
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("refused creations wrote: rows %v -> %v", before, after)
		}

		// A catalogue name deleted and created again gets its number
		// again, in a new generation.
		first := e.putLimit(t, limitOf("NewOrdersPerAccount", limiter.RegID))
		v := e.version(t)
		if err := e.db.DeleteLimit(ctx, "alice", "NewOrdersPerAccount"); err != nil {
			t.Fatal(err)
		}
		second := e.putLimit(t, limitOf("NewOrdersPerAccount", limiter.RegID))
		if first.Enum != 3 || first.Generation != 1 || second.Enum != 3 || second.Generation != 2 {
			t.Errorf("created %d.%d, then %d.%d; want 3.1, then 3.2", first.Enum, first.Generation, second.Enum, second.Generation)
		}
		if got, err := e.db.GetLimit(ctx, "NewOrdersPerAccount"); err != nil || got != second {
			t.Errorf("GetLimit = %+v, %v; want %+v", got, err, second)
		}
		// A replica that loaded the first comes to the second.
		c, err := e.db.Since(ctx, v)
		if err != nil || len(c.Limits) != 1 || c.Limits[0] != second || len(c.DeletedLimits) != 0 {
			t.Errorf("Since = %+v, %v; want the second generation", c, err)
		}
	})
}

func TestIDFormatChangeRefusedWhileOverridesExist(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		l := e.putLimit(t, limitOf("L", limiter.RegID))
		o := e.createOverride(t, overrideOf("L", "123"))

		l.IDFormat = limiter.String
		_, _, err := e.db.PutLimit(ctx, "alice", l)
		wantError(t, err, limiter.ErrConflict, `limit "L" has overrides: its id_format cannot change while they exist`)
		if got, _ := e.db.GetLimit(ctx, "L"); got.IDFormat != limiter.RegID {
			t.Errorf("id_format changed to %s", got.IDFormat)
		}

		// Other fields may change meanwhile.
		l.IDFormat, l.Burst = limiter.RegID, 77
		e.putLimit(t, l)

		if err := e.db.DeleteOverride(ctx, "bob", o.ID); err != nil {
			t.Fatal(err)
		}
		l.IDFormat = limiter.String
		if got := e.putLimit(t, l); got.IDFormat != limiter.String {
			t.Errorf("id_format = %s after its overrides went", got.IDFormat)
		}
	})
}

func TestDeleteReferencedLimit(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		o := e.createOverride(t, overrideOf("L", "1"))
		wantError(t, e.db.DeleteLimit(ctx, "alice", "L"), limiter.ErrConflict, `limit "L" still has overrides: delete them first`)
		if _, err := e.db.GetLimit(ctx, "L"); err != nil {
			t.Fatalf("the limit went: %v", err)
		}
		if err := e.db.DeleteOverride(ctx, "bob", o.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.db.DeleteLimit(ctx, "alice", "L"); err != nil {
			t.Fatalf("DeleteLimit after its overrides went: %v", err)
		}
		counts, err := e.db.OverrideCounts(ctx)
		if err != nil || len(counts) != 0 {
			t.Errorf("OverrideCounts = %v, %v", counts, err)
		}
	})
}

func TestOverrideCRUD(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		in := overrideOf("L", "123")
		in.ExpiresAt = epoch().Add(24*time.Hour + time.Nanosecond)
		o := e.createOverride(t, in)
		if !validID(o.ID) {
			t.Errorf("ID %q is not a 26-character id", o.ID)
		}
		now := epoch().Truncate(time.Microsecond)
		if o.Version != 1 || o.UpdatedBy != "bob" || !o.CreatedAt.Equal(now) || !o.UpdatedAt.Equal(now) ||
			!o.ExpiresAt.Equal(in.ExpiresAt.Truncate(time.Microsecond)) {
			t.Errorf("CreateOverride returned %+v", o)
		}
		got, err := e.db.GetOverride(ctx, o.ID)
		if err != nil || got != o {
			t.Fatalf("GetOverride = %+v, %v; want %+v", got, err, o)
		}

		_, err = e.db.CreateOverride(ctx, "bob", overrideOf("L", "123"))
		wantError(t, err, limiter.ErrConflict, `an override of limit "L" for bucket "123" already exists`)
		_, err = e.db.CreateOverride(ctx, "bob", overrideOf("Missing", "123"))
		wantError(t, err, limiter.ErrNotFound, `limit "Missing" not found`)

		// The same bucket id under another limit is another override.
		e.putLimit(t, limitOf("M", limiter.RegID))
		e.createOverride(t, overrideOf("M", "123"))
		counts, err := e.db.OverrideCounts(ctx)
		if err != nil || counts["L"] != 1 || counts["M"] != 1 {
			t.Errorf("OverrideCounts = %v, %v", counts, err)
		}

		unlimited := overrideOf("L", "456")
		unlimited.Unlimited = true
		u := e.createOverride(t, unlimited)
		if u.Params != (limiter.Params{}) {
			t.Errorf("unlimited override kept params %+v", u.Params)
		}
		if got, _ := e.db.GetOverride(ctx, u.ID); got != u {
			t.Errorf("unlimited override reads back as %+v, want %+v", got, u)
		}
		blocked := overrideOf("L", "789")
		blocked.Burst = 0
		if b := e.createOverride(t, blocked); b.Burst != 0 || b.Count != 50 {
			t.Errorf("blocking override = %+v", b)
		}

		if err := e.db.DeleteOverride(ctx, "bob", o.ID); err != nil {
			t.Fatal(err)
		}
		_, err = e.db.GetOverride(ctx, o.ID)
		wantError(t, err, limiter.ErrNotFound, fmt.Sprintf("override %q not found", o.ID))
		wantError(t, e.db.DeleteOverride(ctx, "bob", o.ID), limiter.ErrNotFound, "")
		_, err = e.db.UpdateOverride(ctx, "bob", o.ID, func(*limiter.Override) error { return nil })
		wantError(t, err, limiter.ErrNotFound, "")
		// The bucket is free again.
		e.createOverride(t, overrideOf("L", "123"))
	})
}

func TestUpdateOverride(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		e.putLimit(t, limitOf("Other", limiter.RegID))
		o := e.createOverride(t, overrideOf("L", "1"))

		e.clock.Advance(time.Hour)
		expires := epoch().Add(48 * time.Hour)
		got, err := e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override) error {
			n.Burst, n.Comment, n.Enabled, n.ExpiresAt = 7, "raised", false, expires
			// None of these may change.
			n.ID, n.Limit, n.BucketID, n.CreatedAt = "X", "Other", "2", epoch().Add(time.Hour)
			n.Version, n.UpdatedBy = 99, "mallory"
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateOverride: %v", err)
		}
		want := o
		want.Burst, want.Comment, want.Enabled, want.ExpiresAt = 7, "raised", false, expires.Truncate(time.Microsecond)
		want.Version, want.UpdatedBy, want.UpdatedAt = 2, "carol", e.clock.Now().Truncate(time.Microsecond)
		if got != want {
			t.Fatalf("UpdateOverride = %+v, want %+v", got, want)
		}
		if read, _ := e.db.GetOverride(ctx, o.ID); read != want {
			t.Fatalf("read back %+v, want %+v", read, want)
		}

		// An error from change is returned unchanged and nothing is written.
		before := e.rowCounts(t)
		v := e.version(t)
		ve := &limiter.ValidationError{}
		ve.Add("burst", "must be at least 0")
		_, err = e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override) error {
			n.Burst = -1
			return ve
		})
		if err != ve {
			t.Fatalf("error = %v, want the ValidationError itself", err)
		}
		if read, _ := e.db.GetOverride(ctx, o.ID); read != want {
			t.Errorf("after a failed change the override is %+v", read)
		}
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) || e.version(t) != v {
			t.Errorf("a failed change wrote: rows %v -> %v", before, after)
		}

		// Clearing the expiry and making the override unlimited.
		got, err = e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override) error {
			n.ExpiresAt, n.Unlimited = time.Time{}, true
			return nil
		})
		if err != nil || !got.ExpiresAt.IsZero() || !got.Unlimited || got.Params != (limiter.Params{}) || got.Version != 3 {
			t.Errorf("UpdateOverride = %+v, %v", got, err)
		}
	})
}

func TestOverrideHistory(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		o := e.createOverride(t, overrideOf("L", "1"))
		e.clock.Advance(time.Minute)
		updated, err := e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override) error {
			n.Count, n.Period = 9, 90*time.Minute
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute)
		if err := e.db.DeleteOverride(ctx, "dave", o.ID); err != nil {
			t.Fatal(err)
		}

		h, err := e.db.OverrideHistory(ctx, o.ID)
		if err != nil {
			t.Fatalf("OverrideHistory: %v", err)
		}
		if len(h) != 3 {
			t.Fatalf("%d entries, want 3: %+v", len(h), h)
		}
		check := func(i int, actor, action string, at time.Time, before, after *limiter.Override) {
			t.Helper()
			got := h[i]
			if got.Actor != actor || got.Action != action || !got.At.Equal(at.Truncate(time.Microsecond)) {
				t.Errorf("entry %d = %s %s at %v, want %s %s at %v", i, got.Actor, got.Action, got.At, actor, action, at)
			}
			if (got.Before == nil) != (before == nil) || before != nil && *got.Before != *before {
				t.Errorf("entry %d before = %+v, want %+v", i, got.Before, before)
			}
			if (got.After == nil) != (after == nil) || after != nil && *got.After != *after {
				t.Errorf("entry %d after = %+v, want %+v", i, got.After, after)
			}
		}
		check(0, "bob", limiter.ActionCreate, epoch(), nil, &o)
		check(1, "carol", limiter.ActionUpdate, epoch().Add(time.Minute), &o, &updated)
		check(2, "dave", limiter.ActionDelete, epoch().Add(2*time.Minute), &updated, nil)

		_, err = e.db.OverrideHistory(ctx, "01ARZ3NDEKTSV4RRFFQ69G5FAV")
		wantError(t, err, limiter.ErrNotFound, "")
	})
}

func TestListOverridesPagination(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		var ids []string
		for i := range 25 {
			ids = append(ids, e.createOverride(t, overrideOf("L", fmt.Sprint(i+1))).ID)
		}
		slices.Reverse(ids) // newest first

		var got []string
		token := ""
		for page := 0; ; page++ {
			list, next, err := e.db.ListOverrides(ctx, limiter.OverrideFilter{PageSize: 10, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if want := []int{10, 10, 5}[page]; len(list) != want {
				t.Fatalf("page %d has %d overrides, want %d", page, len(list), want)
			}
			for _, o := range list {
				got = append(got, o.ID)
			}
			if next == "" {
				break
			}
			token = next
		}
		if !slices.Equal(got, ids) {
			t.Errorf("pages = %v, want %v", got, ids)
		}

		// A page that ends exactly at the last override has no next page.
		list, next, err := e.db.ListOverrides(ctx, limiter.OverrideFilter{PageSize: 25})
		if err != nil || len(list) != 25 || next != "" {
			t.Errorf("page of 25 = %d, %q, %v", len(list), next, err)
		}
		// PageSize 0 means 50.
		if list, _, err := e.db.ListOverrides(ctx, limiter.OverrideFilter{}); err != nil || len(list) != 25 {
			t.Errorf("default page = %d, %v", len(list), err)
		}

		for _, bad := range []string{"!!", "AAAA", pageToken("not an id at all, no")} {
			_, _, err := e.db.ListOverrides(ctx, limiter.OverrideFilter{PageToken: bad})
			var ve *limiter.ValidationError
			if !errors.As(err, &ve) || ve.Fields[0].Field != "page_token" {
				t.Errorf("token %q: error = %v, want a ValidationError on page_token", bad, err)
			}
		}
	})
}

func TestListOverridesStableUnderConcurrentInserts(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		// A real clock, so that concurrent ids are ordered by time as they
		// are in production.
		d := openMigrated(t, e.url, nil)
		existing := map[string]bool{}
		for i := range 60 {
			o, err := d.CreateOverride(ctx, "bob", overrideOf("L", fmt.Sprint(i+1)))
			if err != nil {
				t.Fatal(err)
			}
			existing[o.ID] = true
		}

		stop := make(chan struct{})
		inserted := make(chan error, 1)
		go func() {
			for i := 1000; ; i++ {
				select {
				case <-stop:
					inserted <- nil
					return
				default:
				}
				if _, err := d.CreateOverride(ctx, "bob", overrideOf("L", fmt.Sprint(i))); err != nil {
					inserted <- err
					return
				}
			}
		}()

		seen := map[string]bool{}
		token := ""
		for {
			list, next, err := d.ListOverrides(ctx, limiter.OverrideFilter{PageSize: 7, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range list {
				if seen[o.ID] {
					t.Errorf("override %s listed twice", o.ID)
				}
				seen[o.ID] = true
			}
			if next == "" {
				break
			}
			token = next
		}
		close(stop)
		if err := <-inserted; err != nil {
			t.Fatal(err)
		}
		for id := range existing {
			if !seen[id] {
				t.Errorf("pre-existing override %s skipped", id)
			}
		}
	})
}

func TestListOverridesFilters(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.String))
		e.putLimit(t, limitOf("M", limiter.String))
		mk := func(limit, bucket, comment string, enabled bool) string {
			o := overrideOf(limit, bucket)
			o.Comment, o.Enabled = comment, enabled
			return e.createOverride(t, o).ID
		}
		a := mk("L", "alpha", "Raised for ACME", true)
		b := mk("L", "beta", "100% off", true)
		c := mk("L", "gam_ma", "plain", false)
		d := mk("M", "alpha", "other limit", true)
		x := mk("M", "x100yoff", "a_b", false)

		f := func(fl limiter.OverrideFilter) []string {
			t.Helper()
			list, _, err := e.db.ListOverrides(ctx, fl)
			if err != nil {
				t.Fatalf("ListOverrides(%+v): %v", fl, err)
			}
			ids := []string{}
			for _, o := range list {
				ids = append(ids, o.ID)
			}
			return ids
		}
		yes, no := true, false
		for _, tc := range []struct {
			name   string
			filter limiter.OverrideFilter
			want   []string
		}{
			{"all", limiter.OverrideFilter{}, []string{x, d, c, b, a}},
			{"limit", limiter.OverrideFilter{Limit: "L"}, []string{c, b, a}},
			{"bucket ids", limiter.OverrideFilter{BucketIDs: []string{"alpha", "gam_ma", "nope"}}, []string{d, c, a}},
			{"limit and bucket", limiter.OverrideFilter{Limit: "M", BucketIDs: []string{"alpha"}}, []string{d}},
			{"enabled", limiter.OverrideFilter{Enabled: &yes}, []string{d, b, a}},
			{"disabled", limiter.OverrideFilter{Enabled: &no}, []string{x, c}},
			{"query bucket, any case", limiter.OverrideFilter{Query: "ALP"}, []string{d, a}},
			{"query comment, any case", limiter.OverrideFilter{Query: "acme"}, []string{a}},
			{"query percent is literal", limiter.OverrideFilter{Query: "0% o"}, []string{b}},
			{"query underscore is literal", limiter.OverrideFilter{Query: "_"}, []string{x, c}},
			{"query backslash", limiter.OverrideFilter{Query: `\`}, []string{}},
			{"everything", limiter.OverrideFilter{Limit: "L", Enabled: &yes, Query: "a", BucketIDs: []string{"beta", "alpha"}}, []string{b, a}},
		} {
			if got := f(tc.filter); !slices.Equal(got, tc.want) {
				t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
			}
		}
	})
}

func TestImport(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		existing := e.putLimit(t, limitOf("Existing", limiter.RegID))
		e.putLimit(t, limitOf("Same", limiter.RegID))
		kept := e.createOverride(t, overrideOf("Existing", "1"))
		changed := e.createOverride(t, overrideOf("Existing", "2"))
		// Disabled with an expiry: an import keeps both.
		changed, err := e.db.UpdateOverride(ctx, "bob", changed.ID, func(o *limiter.Override) error {
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
		if err != nil || counts != want {
			t.Fatalf("dry run = %+v, %v; want %+v", counts, err, want)
		}
		if after := e.rowCounts(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("dry run wrote: %v -> %v", before, after)
		}

		counts, err = e.db.Import(ctx, "importer", limits, overrides, false)
		if err != nil || counts != want {
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
		if want := (limiter.ImportCounts{Unchanged: 7}); err != nil || counts != want {
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
			msg       string
		}{
			{"enum taken", append(good, clash), goodOverrides, limiter.ErrConflict, `enum 17 is taken by limit "Taken"`},
			{"unknown limit", good, append(goodOverrides, overrideOf("Nope", "3")), limiter.ErrNotFound,
				`override of limit "Nope" for bucket "3": limit "Nope" not found`},
			{"same bucket twice", good, append(goodOverrides, overrideOf("L", "1")), limiter.ErrConflict,
				`the import holds two overrides of limit "L" for bucket "1"`},
		} {
			for _, dry := range []bool{false, true} {
				_, err := e.db.Import(ctx, "importer", tc.limits, tc.overrides, dry)
				wantError(t, err, tc.kind, tc.msg)
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

// TestFirstTokenOnce: processes starting together on an empty database
// each try to create the first token; exactly one does.
func TestFirstTokenOnce(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		const processes = 6
		handles := make([]*DB, processes)
		for i := range handles {
			handles[i] = openMigrated(t, e.url, nil)
		}
		var wg sync.WaitGroup
		var created atomic.Int32
		for i, d := range handles {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, hash := auth.NewSecret()
				_, ok, err := d.CreateFirstToken(ctx, "ratelimitd", auth.Token{Name: fmt.Sprintf("first-%d", i), Scope: auth.Admin, Hash: hash})
				if err != nil {
					t.Error(err)
				}
				if ok {
					created.Add(1)
				}
			}()
		}
		wg.Wait()
		tokens, err := e.db.ListTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if created.Load() != 1 || len(tokens) != 1 {
			t.Fatalf("%d processes said they created the first token; the database holds %d", created.Load(), len(tokens))
		}
		if err := e.db.RevokeToken(ctx, "ops", tokens[0].ID); err != nil {
			t.Fatal(err)
		}
		_, hash := auth.NewSecret()
		if _, ok, err := e.db.CreateFirstToken(ctx, "ratelimitd", auth.Token{Name: "late", Scope: auth.Admin, Hash: hash}); err != nil || ok {
			t.Errorf("with a revoked token in the database, CreateFirstToken = %v, %v; want no token created", ok, err)
		}
	})
}

func TestTokens(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		_, hash := auth.NewSecret()
		a, err := e.db.CreateToken(ctx, "bootstrap", auth.Token{Name: "ops", Scope: auth.Admin, Hash: hash})
		if err != nil {
			t.Fatal(err)
		}
		if !validID(a.ID) || !a.CreatedAt.Equal(epoch().Truncate(time.Microsecond)) || !a.RevokedAt.IsZero() || a.Hash != hash {
			t.Errorf("CreateToken = %+v", a)
		}
		e.clock.Advance(time.Second)
		_, hash2 := auth.NewSecret()
		b, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "decider", Scope: auth.Decide, Hash: hash2})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.db.CreateToken(ctx, "ops", auth.Token{Name: "copy", Scope: auth.Decide, Hash: hash2})
		wantError(t, err, limiter.ErrConflict, "")

		e.clock.Advance(time.Second)
		if err := e.db.RevokeToken(ctx, "ops", a.ID); err != nil {
			t.Fatal(err)
		}
		wantError(t, e.db.RevokeToken(ctx, "ops", a.ID), limiter.ErrNotFound, fmt.Sprintf("token %q not found or already revoked", a.ID))
		wantError(t, e.db.RevokeToken(ctx, "ops", "nope"), limiter.ErrNotFound, "")

		list, err := e.db.ListTokens(ctx)
		if err != nil || len(list) != 2 {
			t.Fatalf("ListTokens = %+v, %v", list, err)
		}
		a.RevokedAt = e.clock.Now().Truncate(time.Microsecond)
		if list[0] != a || list[1] != b {
			t.Errorf("ListTokens = %+v, want %+v then %+v", list, a, b)
		}

		// Token changes are audited, without the hashes.
		var n int
		err = e.db.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit WHERE entity = 'token'`).Scan(&n)
		if err != nil || n != 3 {
			t.Errorf("%d token audit entries, %v; want 3", n, err)
		}
		var leaks int
		err = e.db.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit WHERE CAST(after AS TEXT) LIKE $1 OR CAST(before AS TEXT) LIKE $1`,
			"%"+hash[:16]+"%").Scan(&leaks)
		if err != nil || leaks != 0 {
			t.Errorf("%d audit entries hold a token hash, %v", leaks, err)
		}
	})
}

// snapshotOf builds a snapshot the way the loader does.
func snapshotOf(t *testing.T, e *env) (*limiter.Builder, int64) {
	t.Helper()
	b := limiter.NewBuilder()
	v, err := e.db.Full(ctxT(t), b.PutLimit, b.PutOverride)
	if err != nil {
		t.Fatalf("Full: %v", err)
	}
	return b, v
}

func TestFull(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		var limits []limiter.Limit
		var overrides []limiter.Override
		v, err := e.db.Full(ctx, func(l limiter.Limit) error { limits = append(limits, l); return nil },
			func(o limiter.Override) error { overrides = append(overrides, o); return nil })
		if err != nil || v != 0 || len(limits)+len(overrides) != 0 {
			t.Fatalf("Full of an empty database = %d, %v, %v, %v", v, limits, overrides, err)
		}

		l := e.putLimit(t, limitOf("L", limiter.RegID))
		on := e.createOverride(t, overrideOf("L", "1"))
		off := overrideOf("L", "2")
		off.Enabled = false
		e.createOverride(t, off)
		_, hash := auth.NewSecret()
		if _, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "t", Scope: auth.Admin, Hash: hash}); err != nil {
			t.Fatal(err)
		}

		v, err = e.db.Full(ctx, func(l limiter.Limit) error { limits = append(limits, l); return nil },
			func(o limiter.Override) error { overrides = append(overrides, o); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if v != e.version(t) || v < 4 {
			t.Errorf("Full version = %d, current %d", v, e.version(t))
		}
		if len(limits) != 1 || limits[0] != l || len(overrides) != 1 || overrides[0] != on {
			t.Errorf("Full = %+v, %+v", limits, overrides)
		}

		stop := errors.New("stop")
		_, err = e.db.Full(ctx, func(limiter.Limit) error { return nil }, func(limiter.Override) error { return stop })
		if err != stop {
			t.Errorf("a callback's error came back as %v", err)
		}
	})
}

func TestSince(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		v := e.version(t)
		// next checks that exactly want changed after v, and moves v on.
		next := func(step string, want limiter.Changes) {
			t.Helper()
			c, err := e.db.Since(ctx, v)
			if err != nil {
				t.Fatalf("%s: Since: %v", step, err)
			}
			if c.Version <= v {
				t.Errorf("%s: version %d did not increase from %d", step, c.Version, v)
			}
			want.Version = c.Version
			if fmt.Sprintf("%+v", c) != fmt.Sprintf("%+v", want) {
				t.Errorf("%s: Since =\n%+v\nwant\n%+v", step, c, want)
			}
			v = c.Version
		}

		l := e.putLimit(t, limitOf("L", limiter.RegID))
		next("create limit", limiter.Changes{Limits: []limiter.Limit{l}})
		e.clock.Advance(time.Second)
		l.Burst, l.Enum = 42, 0
		l = e.putLimit(t, l)
		next("update limit", limiter.Changes{Limits: []limiter.Limit{l}})

		o := e.createOverride(t, overrideOf("L", "1"))
		next("create override", limiter.Changes{Overrides: []limiter.Override{o}})
		o, err := e.db.UpdateOverride(ctx, "bob", o.ID, func(n *limiter.Override) error { n.Enabled = false; return nil })
		if err != nil {
			t.Fatal(err)
		}
		next("disable override", limiter.Changes{Overrides: []limiter.Override{o}})
		if err := e.db.DeleteOverride(ctx, "bob", o.ID); err != nil {
			t.Fatal(err)
		}
		next("delete override", limiter.Changes{DeletedOverrides: []limiter.Override{{ID: o.ID, Limit: "L", BucketID: "1"}}})

		_, hash := auth.NewSecret()
		tok, err := e.db.CreateToken(ctx, "ops", auth.Token{Name: "t", Scope: auth.Admin, Hash: hash})
		if err != nil {
			t.Fatal(err)
		}
		next("create token", limiter.Changes{Tokens: true})
		if err := e.db.RevokeToken(ctx, "ops", tok.ID); err != nil {
			t.Fatal(err)
		}
		next("revoke token", limiter.Changes{Tokens: true})

		if err := e.db.DeleteLimit(ctx, "alice", "L"); err != nil {
			t.Fatal(err)
		}
		next("delete limit", limiter.Changes{DeletedLimits: []string{"L"}})

		// Nothing new: the same version, no changes.
		if c, err := e.db.Since(ctx, v); err != nil || c.Version != v || !c.Empty() {
			t.Errorf("Since with nothing new = %+v, %v", c, err)
		}
	})
}

func TestSinceRecreatedOverride(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		old := e.createOverride(t, overrideOf("L", "5"))
		b, v := snapshotOf(t, e)

		// Deleted, created again with other parameters, changed, all
		// between two reads of the loader.
		if err := e.db.DeleteOverride(ctx, "bob", old.ID); err != nil {
			t.Fatal(err)
		}
		again := overrideOf("L", "5")
		again.Burst = 3
		again = e.createOverride(t, again)
		again, err := e.db.UpdateOverride(ctx, "bob", again.ID, func(n *limiter.Override) error { n.Burst = 4; return nil })
		if err != nil {
			t.Fatal(err)
		}
		c, err := e.db.Since(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Overrides) != 1 || c.Overrides[0] != again || len(c.DeletedOverrides) != 1 || c.DeletedOverrides[0].ID != old.ID {
			t.Fatalf("Since = %+v", c)
		}
		if err := b.Apply(c); err != nil {
			t.Fatal(err)
		}
		r, err := b.Snapshot(c.Version, epoch()).Resolve("L", "5", epoch())
		if err != nil || r.Source != limiter.SourceOverride || r.Params.Burst != 4 {
			t.Errorf("after applying: %+v, %v", r, err)
		}

		// A deleted and recreated limit comes out as the current limit.
		e.clock.Advance(time.Second)
		if err := e.db.DeleteOverride(ctx, "bob", again.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.db.DeleteLimit(ctx, "alice", "L"); err != nil {
			t.Fatal(err)
		}
		l := e.putLimit(t, limitOf("L", limiter.String))
		c, err = e.db.Since(ctx, c.Version)
		if err != nil || len(c.Limits) != 1 || c.Limits[0] != l || len(c.DeletedLimits) != 0 || len(c.DeletedOverrides) != 1 {
			t.Errorf("Since after recreating the limit = %+v, %v", c, err)
		}
		if err := b.Apply(c); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSinceNeverSkipsConcurrentWrites follows the change log the way the
// loader does while several writers commit: a change whose sequence number
// committed after a higher one would be skipped for good.
func TestSinceNeverSkipsConcurrentWrites(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("L", limiter.RegID))
		const writers, each = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					if _, err := e.db.CreateOverride(ctx, "bob", overrideOf("L", fmt.Sprint(w*1000+i+1))); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()

		seen := map[string]bool{}
		var v int64
		follow := func() {
			c, err := e.db.Since(ctx, v)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range c.Overrides {
				seen[o.ID] = true
			}
			v = c.Version
		}
		for finished := false; !finished; {
			select {
			case <-done:
				finished = true
			default:
			}
			follow()
		}
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		follow()
		if len(seen) != writers*each {
			t.Errorf("followed %d overrides, want %d", len(seen), writers*each)
		}
	})
}

// watcher runs Watch and counts calls of changed.
type watcher struct {
	calls chan struct{}
	err   chan error
}

func startWatch(ctx context.Context, t *testing.T, d *DB) *watcher {
	w := &watcher{calls: make(chan struct{}, 100), err: make(chan error, 1)}
	go func() {
		w.err <- d.Watch(ctx, func() { w.calls <- struct{}{} })
	}()
	w.wait(t, "the first call", 10*time.Second)
	return w
}

func (w *watcher) wait(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.calls:
	case err := <-w.err:
		t.Fatalf("waiting for %s: Watch returned %v", what, err)
	case <-time.After(timeout):
		t.Fatalf("no call of changed for %s within %v", what, timeout)
	}
}

func TestWatch(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(ctxT(t))
		w := startWatch(ctx, t, e.db)

		writer := e.db
		if e.engine == "postgres" {
			// Another process's change, through another DB.
			writer = openMigrated(t, e.url, nil)
		}
		if _, _, err := writer.PutLimit(ctx, "alice", limitOf("L", limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "a committed change", time.Second)

		// A write that fails or changes nothing commits nothing; a dry run
		// neither. The next call must come from the next real write.
		_, _, _ = writer.PutLimit(ctx, "alice", limitOf("L", limiter.RegID))
		_, _ = writer.Import(ctx, "alice", []limiter.Limit{limitOf("M", limiter.RegID)}, nil, true)
		if _, err := writer.CreateOverride(ctx, "bob", overrideOf("L", "1")); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "the second change", time.Second)
		select {
		case <-w.calls:
			t.Error("changed called more often than changes were committed")
		case <-time.After(100 * time.Millisecond):
		}

		// Another process's change to the same database: on SQLite the
		// command line's, found by the watch's poll of the change log.
		other := openMigrated(t, e.url, nil)
		if _, _, err := other.PutLimit(ctx, "cli", limitOf("N", limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "another process's change", 3*time.Second)

		cancel()
		if err := <-w.err; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch after cancel = %v, want context.Canceled", err)
		}
	})
}

// TestWatchSurvivesHealthChecks makes Watch check its idle connection
// every millisecond: the checks must neither end the watch nor lose a
// notification.
func TestWatchSurvivesHealthChecks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "postgres")
	e.db.be.(*postgres).healthInterval = time.Millisecond
	w := startWatch(ctxT(t), t, e.db)
	for i := range 3 {
		if _, _, err := e.db.PutLimit(ctxT(t), "alice", limitOf(fmt.Sprint("L", i), limiter.RegID)); err != nil {
			t.Fatal(err)
		}
		w.wait(t, "a change", time.Second)
	}
}

func TestWatchEndsAtClose(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		d := openMigrated(t, e.url, nil)
		w := startWatch(ctxT(t), t, d)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-w.err:
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Watch after Close = %v, want ErrUnavailable", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Watch did not end at Close")
		}
		if err := d.Watch(ctxT(t), func() {}); !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Watch on a closed DB = %v", err)
		}
	})
}

func TestMigrate(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		// The latest migration is the last file's number.
		files, err := fs.Glob(migrations.SQLite(), "*.sql")
		if err != nil || len(files) == 0 {
			t.Fatal(files, err)
		}
		want, err := strconv.ParseInt(strings.SplitN(files[len(files)-1], "_", 2)[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		cur, latest, err := e.db.MigrationVersion(ctx)
		if err != nil || cur != latest || latest != want {
			t.Fatalf("MigrationVersion = %d, %d, %v; want %d, %d", cur, latest, err, want, want)
		}
		e.putLimit(t, limitOf("L", limiter.RegID))
		if err := e.db.Migrate(ctx); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		if _, err := e.db.GetLimit(ctx, "L"); err != nil {
			t.Errorf("after a second Migrate: %v", err)
		}
		if e.db.Engine() != e.engine {
			t.Errorf("Engine = %q, want %q", e.db.Engine(), e.engine)
		}
		if err := e.db.Ping(ctx); err != nil {
			t.Errorf("Ping: %v", err)
		}
	})
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	var dbs []*DB
	for range 3 {
		d, err := Open(ctxT(t), url, Options{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		dbs = append(dbs, d)
	}
	errs := make(chan error, len(dbs))
	for _, d := range dbs {
		go func() { errs <- d.Migrate(ctxT(t)) }()
	}
	for range dbs {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	if cur, latest, err := dbs[0].MigrationVersion(ctxT(t)); err != nil || cur != latest {
		t.Errorf("MigrationVersion = %d, %d, %v", cur, latest, err)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	for _, url := range []string{"", "mysql://x", "sqlite:", "sqlite::memory:", "file:x.db"} {
		if d, err := Open(ctx, url, Options{}); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) succeeded", url)
		}
	}
	_, err := Open(ctx, "mysql://x", Options{})
	if err == nil || !strings.Contains(err.Error(), `"sqlite:PATH"`) || !strings.Contains(err.Error(), `"postgres://...`) {
		t.Errorf("error does not name the accepted forms: %v", err)
	}
	// Nothing listens on port 1.
	_, err = Open(ctx, "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=5", Options{})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Open of an unreachable server = %v, want ErrUnavailable", err)
	}
	_, err = Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "missing", "dir", "x.db"), Options{})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Open of a file that cannot be created = %v, want ErrUnavailable", err)
	}
}

func TestUnavailableAndCanceled(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		d := openMigrated(t, e.url, nil)
		canceled, cancel := context.WithCancel(ctxT(t))
		cancel()
		_, err := d.GetLimit(canceled, "L")
		if !errors.Is(err, context.Canceled) || errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("GetLimit with a canceled context = %v", err)
		}
		_, _, err = d.PutLimit(canceled, "alice", limitOf("L", limiter.RegID))
		if !errors.Is(err, context.Canceled) || errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("PutLimit with a canceled context = %v", err)
		}

		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"GetLimit": func() error { _, err := d.GetLimit(ctxT(t), "L"); return err }(),
			"PutLimit": func() error { _, _, err := d.PutLimit(ctxT(t), "a", limitOf("L", limiter.RegID)); return err }(),
			"Ping":     d.Ping(ctxT(t)),
		} {
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("%s after Close = %v, want ErrUnavailable", name, err)
			}
		}
	})
}

func TestUnavailableWhenConnectionsAreKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "postgres")
	ctx := ctxT(t)
	e.putLimit(t, limitOf("L", limiter.RegID))
	w := startWatch(ctx, t, e.db)

	// Terminate every other session of the database, as a restart of the
	// server would.
	admin := openMigrated(t, e.url, nil)
	if _, err := admin.writer.ExecContext(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.err:
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Watch on a killed connection = %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not notice its connection was killed")
	}
	// The pool may fail the first use of a dead connection and then
	// reconnect; a lost connection is never anything but unavailable.
	for range 3 {
		if _, err := e.db.GetLimit(ctx, "L"); err != nil && !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("GetLimit on a killed connection = %v, want success or ErrUnavailable", err)
		}
	}
}

// TestMigrateRetiresEnums upgrades a database written before enums were
// recorded: the enums of its limits and of the limits it deleted are
// given, and its limits keep their bucket keys (generation 1).
func TestMigrateRetiresEnums(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			ctx := ctxT(t)
			url := databaseURL(t, engine)
			d, err := Open(ctx, url, Options{Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			p, err := d.provider()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, 4); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{
				`INSERT INTO limits (name, enum, id_format, burst, count, period, created_at, updated_at)
					VALUES ('Kept', 100, 'string', 1, 1, 1000, '2030-01-01 00:00:00', '2030-01-01 00:00:00')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Gone', 'create', 'Gone', '{"name":"Gone","enum":101}')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Kept', 'create', 'Kept', '{"name":"Kept","enum":100}')`,
				`INSERT INTO audit (at, actor, entity, entity_id, action, limit_name, after)
					VALUES ('2030-01-01 00:00:00', 'a', 'limit', 'Huge', 'create', 'Huge', '{"name":"Huge","enum":2147483648}')`,
			} {
				if _, err := d.writer.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if l, err := d.GetLimit(ctx, "Kept"); err != nil || l.Enum != 100 || l.Generation != 1 {
				t.Errorf("Kept = %+v, %v; want enum 100, generation 1", l, err)
			}
			l, _, err := d.PutLimit(ctx, "alice", limitOf("New", limiter.String))
			if err != nil || l.Enum != 102 {
				t.Errorf("New = %+v, %v; want enum 102, after 100 (Kept) and 101 (deleted)", l, err)
			}
		})
	}
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
		wantError(t, err, limiter.ErrConflict, `override of limit "L" for bucket "192.0.2.0/24": the limit's id_format is now domain, which refuses the id; import again`)
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
