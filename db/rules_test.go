package db

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

func ruleOf(domain, limit string, kv ...string) limiter.Rule {
	r := limiter.Rule{Domain: domain, Limit: limit}
	for i := 0; i < len(kv); i += 2 {
		r.Descriptor = append(r.Descriptor, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return r
}

func wantFieldError(t *testing.T, err error, field string) {
	t.Helper()
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != field {
		t.Fatalf("error = %v, want a validation error naming %s", err, field)
	}
}

func TestRuleCRUD(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("PerIP", limiter.IPAddress))
		e.putLimit(t, limitOf("PerText", limiter.String))
		r, err := e.db.CreateRule(ctx, "alice", ruleOf("edge", "PerIP", "remote_address", ""))
		if err != nil {
			t.Fatal(err)
		}
		if r.ID == "" || !r.CreatedAt.Equal(e.clock.Now().Truncate(time.Microsecond)) {
			t.Errorf("created %+v", r)
		}
		got, err := e.db.GetRule(ctx, r.ID)
		if err != nil || got.Limit != "PerIP" || !slices.Equal(got.Descriptor, r.Descriptor) || !got.CreatedAt.Equal(r.CreatedAt) {
			t.Fatalf("GetRule = %+v, %v; want %+v", got, err, r)
		}
		_, err = e.db.CreateRule(ctx, "alice", ruleOf("edge", "PerText", "remote_address", ""))
		wantError(t, err, limiter.ErrRuleExists)
		// The same pattern in another domain, or with a value, is another rule.
		if _, err := e.db.CreateRule(ctx, "alice", ruleOf("other", "PerIP", "remote_address", "")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.CreateRule(ctx, "alice", ruleOf("edge", "PerText", "remote_address", "10.*")); err != nil {
			t.Fatal(err)
		}
		_, err = e.db.CreateRule(ctx, "alice", ruleOf("edge", "Missing", "k", ""))
		wantError(t, err, limiter.ErrUnknownLimit)
		// Two free entries need the string format.
		_, err = e.db.CreateRule(ctx, "alice", ruleOf("edge", "PerIP", "a", "", "b", ""))
		wantFieldError(t, err, "limit")

		all, err := e.db.ListRules(ctx, "")
		if err != nil || len(all) != 3 {
			t.Fatalf("ListRules = %v, %v", all, err)
		}
		edge, err := e.db.ListRules(ctx, "edge")
		if err != nil || len(edge) != 2 || edge[0].ID != r.ID {
			t.Fatalf("ListRules(edge) = %v, %v", edge, err)
		}

		wantError(t, e.db.DeleteLimit(ctx, "alice", "PerIP"), limiter.ErrHasRules)
		e.clock.Advance(time.Second)
		up, err := e.db.SetRuleLimit(ctx, "alice", r.ID, "PerText")
		if err != nil || up.Limit != "PerText" || !up.UpdatedAt.After(up.CreatedAt) {
			t.Fatalf("SetRuleLimit = %+v, %v", up, err)
		}
		_, err = e.db.SetRuleLimit(ctx, "alice", r.ID, "Missing")
		wantError(t, err, limiter.ErrUnknownLimit)
		_, err = e.db.SetRuleLimit(ctx, "alice", "nope", "PerText")
		wantError(t, err, limiter.ErrRuleNotFound)

		if err := e.db.DeleteRule(ctx, "alice", r.ID); err != nil {
			t.Fatal(err)
		}
		wantError(t, e.db.DeleteRule(ctx, "alice", r.ID), limiter.ErrRuleNotFound)
		_, err = e.db.GetRule(ctx, r.ID)
		wantError(t, err, limiter.ErrRuleNotFound)
	})
}

// TestRuleModes: a rule's replaces and quota mode are stored, read back
// by every reader (the loader's changes included), and changed by an
// import of the same pattern.
func TestRuleModes(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("PerText", limiter.String))
		v := e.version(t)
		r := ruleOf("edge", "PerText", "user", "")
		r.Replaces, r.QuotaMode = []string{"Read", "Write"}, true
		created, err := e.db.CreateRule(ctx, "alice", r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.db.GetRule(ctx, created.ID)
		if err != nil || !slices.Equal(got.Replaces, r.Replaces) || !got.QuotaMode {
			t.Fatalf("GetRule = %+v, %v", got, err)
		}
		c, err := e.db.Since(ctx, v)
		if err != nil || len(c.Rules) != 1 || !slices.Equal(c.Rules[0].Replaces, r.Replaces) || !c.Rules[0].QuotaMode {
			t.Fatalf("Since = %+v, %v", c, err)
		}
		r.Replaces, r.QuotaMode = nil, false
		counts, err := e.db.ImportRules(ctx, "alice", "edge", nil, []limiter.Rule{r}, nil, false, false)
		if err != nil || counts.Updated != 1 {
			t.Fatalf("ImportRules = %+v, %v", counts, err)
		}
		all, err := e.db.ListRules(ctx, "edge")
		if err != nil || len(all) != 1 || all[0].Replaces != nil || all[0].QuotaMode {
			t.Fatalf("ListRules = %+v, %v", all, err)
		}
	})
}

// A descriptor longer than an index entry may be still has one rule per
// domain and pattern, and hostile text is stored as it came.
func TestRuleLongDescriptor(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, limitOf("PerText", limiter.String))
		var kv []string
		for i := range rules.MaxDescriptorEntries {
			kv = append(kv, strings.Repeat(string(rune('a'+i)), 256), strings.Repeat("é", 127)+"*")
		}
		r := ruleOf("d\u2028'\"", "PerText", kv...)
		if fe := rules.Validate(r); len(fe) > 0 {
			t.Fatal(fe)
		}
		got, err := e.db.CreateRule(ctx, "alice", r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := e.db.GetRule(ctx, got.ID)
		if err != nil || back.Domain != r.Domain || !slices.Equal(back.Descriptor, r.Descriptor) {
			t.Fatalf("read back %+v, %v", back, err)
		}
		_, err = e.db.CreateRule(ctx, "alice", r)
		wantError(t, err, limiter.ErrRuleExists)
	})
}

// TestRuleSequence runs random operations against the database and a small
// model of it, and checks after each that the rules, and the snapshot kept
// in step through Since, are the model's.
func TestRuleSequence(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		rng := rand.New(rand.NewPCG(1, 2))
		limits := []string{"A", "B"}
		for _, l := range limits {
			e.putLimit(t, limitOf(l, limiter.String))
		}
		b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
		version, err := e.db.Full(ctx, b.PutLimit, b.PutOverride)
		if err != nil {
			t.Fatal(err)
		}
		model := map[string]limiter.Rule{} // by id
		patterns := [][]string{{"k", ""}, {"k", "v"}, {"k", "v*"}, {"k", "", "j", ""}}
		for step := range 60 {
			ids := slices.Sorted(func(yield func(string) bool) {
				for id := range model {
					if !yield(id) {
						return
					}
				}
			})
			switch op := rng.IntN(3); {
			case op == 0 || len(ids) == 0:
				r := ruleOf([]string{"d1", "d2"}[rng.IntN(2)], limits[rng.IntN(2)], patterns[rng.IntN(len(patterns))]...)
				got, err := e.db.CreateRule(ctx, "alice", r)
				dup := false
				for _, m := range model {
					dup = dup || rules.SameDescriptor(m, r)
				}
				switch {
				case dup && errors.Is(err, limiter.ErrConflict):
				case !dup && err == nil:
					model[got.ID] = got
				default:
					t.Fatalf("step %d: create %+v (duplicate %v): %v", step, r, dup, err)
				}
			case op == 1:
				id := ids[rng.IntN(len(ids))]
				got, err := e.db.SetRuleLimit(ctx, "alice", id, limits[rng.IntN(2)])
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				model[id] = got
			default:
				id := ids[rng.IntN(len(ids))]
				if err := e.db.DeleteRule(ctx, "alice", id); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				delete(model, id)
			}
			c, err := e.db.Since(ctx, version)
			if err != nil {
				t.Fatal(err)
			}
			if b.Apply(c) {
				t.Fatal("changes of usable rows need a full load")
			}
			version = c.Version
			stored, err := e.db.ListRules(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			snap := b.Snapshot(version).Rules()
			if len(stored) != len(model) || len(snap) != len(model) {
				t.Fatalf("step %d: %d stored, %d in the snapshot, %d in the model", step, len(stored), len(snap), len(model))
			}
			for i := range stored {
				m := model[stored[i].ID]
				if m.Limit != stored[i].Limit || !rules.SameDescriptor(m, stored[i]) || m.Limit != snap[i].Limit || !rules.SameDescriptor(m, snap[i]) {
					t.Fatalf("step %d: stored %+v, snapshot %+v, model %+v", step, stored[i], snap[i], m)
				}
			}
		}
	})
}
