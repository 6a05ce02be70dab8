package rules

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

// parsers are the ones the loader hands the snapshots it builds.
func parsers() limiter.Parsers {
	return limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: Validate, IndexRules: Index}
}

func ruleSnapshot(t *testing.T, rules ...limiter.Rule) *limiter.Snapshot {
	t.Helper()
	b := limiter.NewBuilder(parsers())
	for _, l := range []limiter.Limit{
		{Name: "PerIP", Enum: 1, IDFormat: limiter.IPAddress, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "PerText", Enum: 2, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "Exact", Enum: 3, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "Prefix", Enum: 4, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "LongPrefix", Enum: 5, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
	} {
		if err := b.PutLimit(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rules {
		if err := b.PutRule(r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Snapshot(1)
}

func entries(kv ...string) []limiter.DescriptorEntry {
	var out []limiter.DescriptorEntry
	for i := 0; i < len(kv); i += 2 {
		out = append(out, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestMatchPrecedence(t *testing.T) {
	s := ruleSnapshot(t,
		limiter.Rule{ID: "free", Domain: "d", Descriptor: entries("path", "", "user", ""), Limit: "PerText"},
		limiter.Rule{ID: "exact", Domain: "d", Descriptor: entries("path", "/api", "user", ""), Limit: "Exact"},
		limiter.Rule{ID: "prefix", Domain: "d", Descriptor: entries("path", "/a*", "user", ""), Limit: "Prefix"},
		limiter.Rule{ID: "longprefix", Domain: "d", Descriptor: entries("path", "/ap*", "user", ""), Limit: "LongPrefix"},
		// Exact in the second entry loses to exact in the first.
		limiter.Rule{ID: "exact2", Domain: "d", Descriptor: entries("path", "", "user", "bob"), Limit: "PerText"},
		limiter.Rule{ID: "ip", Domain: "d", Descriptor: entries("remote_address", ""), Limit: "PerIP"},
		limiter.Rule{ID: "fixed", Domain: "e", Descriptor: entries("k", "v"), Limit: "PerText"},
	)
	for _, tc := range []struct {
		domain, limit, bucket string
		in                    []limiter.DescriptorEntry
	}{
		{"d", "Exact", "bob", entries("path", "/api", "user", "bob")},
		{"d", "LongPrefix", "%2Fapx/bob", entries("path", "/apx", "user", "bob")},
		{"d", "Prefix", "%2Fab/bob", entries("path", "/ab", "user", "bob")},
		// exact2: exact in the second entry beats the all-free rule.
		{"d", "PerText", "/other", entries("path", "/other", "user", "bob")},
		{"d", "PerText", "%2Fother/carol", entries("path", "/other", "user", "carol")},
		{"d", "PerText", "x%25y/a%2Fb", entries("path", "x%y", "user", "a/b")},
		{"d", "PerIP", "10.0.0.1", entries("remote_address", "10.0.0.1")},
		{"e", "PerText", "*", entries("k", "v")},
		// Keys in order and the same number of entries, or no match.
		{"d", "", "", entries("user", "bob", "path", "/api")},
		{"d", "", "", entries("path", "/api")},
		{"d", "", "", entries("path", "/api", "user", "bob", "x", "y")},
		{"e", "", "", entries("k", "w")},
		{"nodomain", "", "", entries("k", "v")},
	} {
		r, ok := s.Match(tc.domain, tc.in)
		limit, bucket := r.Limit, ""
		if ok {
			bucket = BucketID(r, tc.in)
		}
		if limit != tc.limit || bucket != tc.bucket || ok != (tc.limit != "") {
			t.Errorf("Match(%q, %v) = %q, %q, %v; want %q, %q", tc.domain, tc.in, limit, bucket, ok, tc.limit, tc.bucket)
		}
	}
}

// A more specific first entry wins even when its branch must backtrack to
// a less specific second entry.
func TestMatchBacktracks(t *testing.T) {
	s := ruleSnapshot(t,
		limiter.Rule{ID: "a", Domain: "d", Descriptor: entries("a", "x", "b", "only"), Limit: "Exact"},
		limiter.Rule{ID: "b", Domain: "d", Descriptor: entries("a", "x*", "b", ""), Limit: "Prefix"},
		limiter.Rule{ID: "c", Domain: "d", Descriptor: entries("a", "", "b", "y"), Limit: "PerText"},
	)
	if r, _ := s.Match("d", entries("a", "x", "b", "y")); r.Limit != "Prefix" {
		t.Errorf("got %q, want Prefix", r.Limit)
	}
	if r, _ := s.Match("d", entries("a", "z", "b", "y")); r.Limit != "PerText" {
		t.Errorf("got %q, want PerText", r.Limit)
	}
}

func TestRuleChangesReachSnapshot(t *testing.T) {
	s := ruleSnapshot(t, limiter.Rule{ID: "r1", Domain: "d", Descriptor: entries("k", ""), Limit: "PerText"})
	b := s.Builder()
	if b.Apply(limiter.Changes{Version: 2, DeletedRules: []string{"r1"},
		Rules: []limiter.Rule{{ID: "r2", Domain: "d", Descriptor: entries("k", "v*"), Limit: "Prefix"}}}) {
		t.Fatal("changes of usable rows need a full load")
	}
	next := b.Snapshot(2)
	if r, _ := next.Match("d", entries("k", "vw")); r.Limit != "Prefix" {
		t.Errorf("after the change got %q, want Prefix", r.Limit)
	}
	if _, ok := next.Match("d", entries("k", "w")); ok {
		t.Error("a deleted rule still matches")
	}
	// The earlier snapshot is untouched.
	if r, _ := s.Match("d", entries("k", "w")); r.Limit != "PerText" {
		t.Errorf("the earlier snapshot changed: got %q", r.Limit)
	}
	if len(next.Rules()) != 1 || len(s.Rules()) != 1 || next.Rules()[0].ID != "r2" {
		t.Errorf("Rules() = %v and %v", s.Rules(), next.Rules())
	}
}

func TestPutRuleRefuses(t *testing.T) {
	b := limiter.NewBuilder(parsers())
	if err := b.PutRule(limiter.Rule{ID: "x", Domain: "d", Descriptor: entries("k", ""), Limit: "Missing"}); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("unknown limit: got %v", err)
	}
	var ve *limiter.ValidationError
	if err := b.PutRule(limiter.Rule{ID: "x", Domain: "", Limit: "Missing"}); !errors.As(err, &ve) {
		t.Errorf("invalid rule: got %v", err)
	}
}

func TestRuleValidate(t *testing.T) {
	long := strings.Repeat("a", 257)
	r := limiter.Rule{Domain: "bad\x00", Descriptor: []limiter.DescriptorEntry{{Key: ""}, {Key: "k", Value: "\xff"}, {Key: long}}, Limit: "9x"}
	got := map[string]bool{}
	for _, fe := range Validate(r) {
		got[fe.Field] = true
	}
	for _, f := range []string{"domain", "descriptor[0].key", "descriptor[1].value", "descriptor[2].key", "limit"} {
		if !got[f] {
			t.Errorf("no error for %s in %v", f, Validate(r))
		}
	}
	if fe := Validate(limiter.Rule{Domain: "d", Limit: "L"}); len(fe) != 1 || fe[0].Field != "descriptor" {
		t.Errorf("no entries: %v", fe)
	}
	ip := limiter.Limit{IDFormat: limiter.IPAddress}
	if msg := CheckLimit(limiter.Rule{Descriptor: entries("a", "", "b", "")}, ip); msg == "" {
		t.Error("two free entries accepted for an ip_address limit")
	}
	if msg := CheckLimit(limiter.Rule{Descriptor: entries("a", "x")}, ip); msg == "" {
		t.Error("no free entry accepted for an ip_address limit")
	}
	if msg := CheckLimit(limiter.Rule{Descriptor: entries("a", "x", "b", "")}, ip); msg != "" {
		t.Errorf("one free entry refused: %s", msg)
	}
	leases := limiter.Limit{IDFormat: limiter.String, Kind: limiter.KindConcurrency}
	if msg := CheckLimit(limiter.Rule{Descriptor: entries("a", "")}, leases); msg == "" {
		t.Error("a concurrency limit accepted for a rule")
	}
	quota := limiter.Limit{IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "UTC"}
	if msg := CheckLimit(limiter.Rule{Descriptor: entries("a", "")}, quota); msg != "" {
		t.Errorf("a calendar quota refused for a rule: %s", msg)
	}
}

// TestMatchWildcards holds the wildcard as envoyproxy/ratelimit defines it:
// each '*', anywhere in the value and any number of times, stands for any
// run of characters, the empty one included. Among wildcards the longer
// literal prefix wins, then the one with more literal characters.
func TestMatchWildcards(t *testing.T) {
	s := ruleSnapshot(t,
		limiter.Rule{ID: "free", Domain: "d", Descriptor: entries("v", ""), Limit: "PerText"},
		limiter.Rule{ID: "middle", Domain: "d", Descriptor: entries("v", "bar*b"), Limit: "Exact"},
		limiter.Rule{ID: "multi", Domain: "d", Descriptor: entries("v", "foo*bar*baz"), Limit: "Prefix"},
		limiter.Rule{ID: "prefix", Domain: "d", Descriptor: entries("v", "foo*"), Limit: "LongPrefix"},
		limiter.Rule{ID: "lead", Domain: "d", Descriptor: entries("v", "*.png"), Limit: "PerIP"},
	)
	for _, tc := range []struct{ value, limit string }{
		{"barb", "Exact"},
		{"bar-b", "Exact"},
		{"barbb", "Exact"},
		{"bar-bx", "PerText"},
		{"foobarbaz", "Prefix"},
		{"foo-bar-x-baz", "Prefix"},
		{"foo-baz-bar", "LongPrefix"},
		{"foo", "LongPrefix"},
		{"a.png", "PerIP"},
		{".png", "PerIP"},
		{"a.pngx", "PerText"},
		{"bar*b", "Exact"},
	} {
		r, ok := s.Match("d", entries("v", tc.value))
		if !ok || r.Limit != tc.limit {
			t.Errorf("Match(v=%q) = %q, %v; want %q", tc.value, r.Limit, ok, tc.limit)
		}
		// The value the wildcard matched forms the bucket id.
		if ok && BucketID(r, entries("v", tc.value)) != tc.value && r.Limit != "PerText" {
			t.Errorf("v=%q: bucket %q", tc.value, BucketID(r, entries("v", tc.value)))
		}
	}
}

// BenchmarkMatchPrefixes matches a batch of 100 descriptors against a
// domain of one prefix rule and of 3,000: with the rules in a trie, the
// cost should not grow with their number.
func BenchmarkMatchPrefixes(b *testing.B) {
	for _, n := range []int{1, 3000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			bl := limiter.NewBuilder(parsers())
			if err := bl.PutLimit(limiter.Limit{Name: "P", Enum: 1, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}}); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				r := limiter.Rule{ID: strconv.Itoa(i), Domain: "d", Descriptor: entries("path", "/api/v"+strconv.Itoa(i)+"/*"), Limit: "P"}
				if err := bl.PutRule(r); err != nil {
					b.Fatal(err)
				}
			}
			s := bl.Snapshot(1)
			batch := make([][]limiter.DescriptorEntry, 100)
			for i := range batch {
				// Values under the last rule's prefix.
				batch[i] = entries("path", "/api/v"+strconv.Itoa(n-1)+"/items/"+strconv.Itoa(i))
			}
			b.ResetTimer()
			for b.Loop() {
				for _, e := range batch {
					if _, ok := s.Match("d", e); !ok {
						b.Fatal("no match")
					}
				}
			}
		})
	}
}
