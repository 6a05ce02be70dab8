package db

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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
		wantError(t, err, limiter.ErrOverrideExists)
		_, err = e.db.CreateOverride(ctx, "bob", overrideOf("Missing", "123"))
		wantError(t, err, limiter.ErrUnknownLimit)

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
		wantError(t, err, limiter.ErrOverrideNotFound)
		wantError(t, e.db.DeleteOverride(ctx, "bob", o.ID), limiter.ErrOverrideNotFound)
		_, err = e.db.UpdateOverride(ctx, "bob", o.ID, func(*limiter.Override, limiter.Limit) error { return nil })
		wantError(t, err, limiter.ErrOverrideNotFound)
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
		got, err := e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override, _ limiter.Limit) error {
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
		_, err = e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override, _ limiter.Limit) error {
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
		got, err = e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override, _ limiter.Limit) error {
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
		updated, err := e.db.UpdateOverride(ctx, "carol", o.ID, func(n *limiter.Override, _ limiter.Limit) error {
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
		wantError(t, err, limiter.ErrOverrideNotFound)
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
			if !errors.Is(err, limiter.ErrPageToken) {
				t.Errorf("token %q: error = %v, want ErrPageToken", bad, err)
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
