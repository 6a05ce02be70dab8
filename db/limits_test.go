package db

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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
		wantError(t, err, limiter.ErrLimitNotFound)
		if err := e.db.DeleteLimit(ctx, "alice", "b"); err != nil {
			t.Fatalf("DeleteLimit: %v", err)
		}
		_, err = e.db.GetLimit(ctx, "b")
		wantError(t, err, limiter.ErrLimitNotFound)
		wantError(t, e.db.DeleteLimit(ctx, "alice", "b"), limiter.ErrLimitNotFound)
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
		wantError(t, err, limiter.ErrEnumTaken)

		change := limitOf("explicit", limiter.String)
		change.Enum = 51
		_, _, err = e.db.PutLimit(ctx, "alice", change)
		wantError(t, err, limiter.ErrEnumFixed)

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
			wantError(t, err, limiter.ErrEnumRetired)
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
		wantError(t, err, limiter.ErrNoEnumLeft)
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
		wantError(t, err, limiter.ErrIDFormatFixed)
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
		wantError(t, e.db.DeleteLimit(ctx, "alice", "L"), limiter.ErrHasOverrides)
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
