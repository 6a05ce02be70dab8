package limitfile_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// The real database satisfies EnvoyStore.
var _ limitfile.EnvoyStore = (*db.DB)(nil)

func envoyDB(t testing.TB, postgres bool) *db.DB {
	t.Helper()
	url := "sqlite:" + filepath.Join(t.TempDir(), "ratelimitd.db")
	if postgres {
		url = testenv.Postgres(t)
	}
	d, err := db.Open(t.Context(), url, db.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d
}

func envoyFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "envoy", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// snapshotOf loads what the database holds, as a replica would.
func snapshotOf(t *testing.T, d *db.DB) *limiter.Snapshot {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	v, err := d.Full(t.Context(), b.PutLimit, b.PutOverride)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := d.ListRules(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if err := b.PutRule(r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Snapshot(v)
}

// decide says what a request descriptor of domain gets: its limit, bucket
// and parameters, or "" when no rule matches.
func decide(t *testing.T, s *limiter.Snapshot, domain string, kv ...string) (limit string, r limiter.Resolution) {
	t.Helper()
	var entries []limiter.DescriptorEntry
	for i := 0; i < len(kv); i += 2 {
		entries = append(entries, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	rule, ok := s.Match(domain, entries)
	if !ok {
		return "", limiter.Resolution{}
	}
	res, err := s.Resolve(rule.Limit, rules.BucketID(rule, entries), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return rule.Limit, res
}

// TestImportEnvoy imports files in the shapes of envoyproxy/ratelimit's
// own examples, on both engines, and checks the decisions they lead to.
func TestImportEnvoy(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			d := envoyDB(t, engine == "postgres")
			ctx := t.Context()
			imp := func(name string, dryRun bool) limiter.ImportCounts {
				t.Helper()
				counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", envoyFile(t, name), limitfile.ImportOptions{DryRun: dryRun})
				if err != nil || errs != nil {
					t.Fatalf("%s: %v, %v", name, errs, err)
				}
				return counts
			}
			if got := imp("blocked.yaml", true); !reflect.DeepEqual(got, limiter.ImportCounts{Created: 4}) {
				t.Errorf("dry run: %+v", got)
			}
			if ls, _ := d.ListLimits(ctx); len(ls) != 0 {
				t.Fatalf("the dry run wrote %d limits", len(ls))
			}
			for _, tc := range []struct {
				file string
				want limiter.ImportCounts
			}{
				{"flat.yaml", limiter.ImportCounts{Created: 4}},
				{"nested.yaml", limiter.ImportCounts{Created: 4}},
				{"blocked.yaml", limiter.ImportCounts{Created: 4}},
				{"levels.yaml", limiter.ImportCounts{Created: 2}},
				{"unlimited.yaml", limiter.ImportCounts{Created: 6}},
				{"shadow.yaml", limiter.ImportCounts{Created: 4}},
				{"wildcard.yaml", limiter.ImportCounts{Created: 2}},
			} {
				if got := imp(tc.file, false); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: %+v, want %+v", tc.file, got, tc.want)
				}
				// The same file again changes nothing.
				if got := imp(tc.file, false); got.Created+got.Updated != 0 {
					t.Errorf("%s again: %+v", tc.file, got)
				}
			}

			s := snapshotOf(t, d)
			limit, r := decide(t, s, "reports", "table", "invoices")
			if limit != "reports.table.invoices" || r.Params != (limiter.Params{Burst: 200, Count: 200, Period: time.Second}) || r.BucketID != "*" {
				t.Errorf("reports invoices: %s %+v", limit, r)
			}
			if limit, _ := decide(t, s, "reports", "table", "other"); limit != "" {
				t.Errorf("an unlisted value matched %s", limit)
			}
			// Nested: the promotion limit for the pair, the general one alone.
			if limit, r := decide(t, s, "notify", "kind", "promo", "address", "a@example.com"); limit != "notify.kind.promo.address" || r.Params.Count != 4 || r.Params.Period != 24*time.Hour || r.BucketID != "a@example.com" {
				t.Errorf("promo: %s %+v", limit, r)
			}
			if limit, r := decide(t, s, "notify", "address", "a@example.com"); limit != "notify.address" || r.Params.Count != 60 {
				t.Errorf("address: %s %+v", limit, r)
			}
			// Value-specific descriptors became overrides of the key-only
			// descriptor's limit: a block and a larger rate.
			if _, r := decide(t, s, "gateway_ip", "client_ip", "198.51.100.7"); r.Source != limiter.SourceOverride || r.Params.Burst != 0 {
				t.Errorf("banned: %+v", r)
			}
			if _, r := decide(t, s, "gateway_ip", "client_ip", "198.51.100.8"); r.Source != limiter.SourceOverride || r.Params.Burst != 100 {
				t.Errorf("friend: %+v", r)
			}
			if _, r := decide(t, s, "gateway_ip", "client_ip", "198.51.100.9"); r.Source != limiter.SourceDefault || r.Params.Burst != 20 {
				t.Errorf("anyone: %+v", r)
			}
			if limit, _ := decide(t, s, "levels", "tenant", "acme"); limit != "" {
				t.Errorf("one entry of two matched %s", limit)
			}
			if limit, _ := decide(t, s, "levels", "tenant", "acme", "route", "/x"); limit == "" {
				t.Error("two entries did not match")
			}
			// Unlimited: an override where a less specific descriptor would
			// limit, a rule of its own where none would, so that Envoy is
			// answered as unlimited.
			if _, r := decide(t, s, "backends", "partner", "trusted"); r.Source != limiter.SourceUnlimited {
				t.Errorf("trusted partner: %+v", r)
			}
			if _, r := decide(t, s, "backends", "directory", "x"); r.Source != limiter.SourceUnlimited {
				t.Errorf("unlimited directory: %+v", r)
			}
			if _, r := decide(t, s, "trial", "app", "a", "account", "acct-1"); !r.Limit.Shadow {
				t.Errorf("shadow_mode lost: %+v", r.Limit)
			}
			if limit, _ := decide(t, s, "paths", "path", "/v2/users"); limit == "" {
				t.Error("the wildcard did not match")
			}

			// An export imports again without a change.
			for _, domain := range []string{"reports", "notify", "gateway_ip", "levels", "backends", "trial", "paths"} {
				out, err := limitfile.ExportEnvoy(ctx, d, domain)
				if err != nil {
					t.Fatal(err)
				}
				counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", out, limitfile.ImportOptions{})
				if err != nil || errs != nil || counts.Created+counts.Updated != 0 {
					t.Errorf("%s: the export imports as %+v, %v, %v:\n%s", domain, counts, errs, err, out)
				}
			}
			out, err := limitfile.ExportEnvoy(ctx, d, "gateway_ip")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`value: "198.51.100.7"`, "requests_per_unit: 0", "name: gateway_ip.client_ip"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("no %q in the export:\n%s", want, out)
				}
			}
		})
	}
}

func TestImportEnvoyErrors(t *testing.T) {
	d := envoyDB(t, false)
	for _, tc := range []struct {
		name, doc string
		line      int
		want      string
	}{
		{"replaces not a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: X\n", 7, "rate_limit.replaces: must be a list of {name}"},
		{"replaces without name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - limit: X\n", 8, `rate_limit.replaces[0]: unknown key "limit"`},
		{"replaces with an empty name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name:\n", 8, "rate_limit.replaces[0].name: should not have an empty replaces entry"},
		{"replaces with a name of nothing", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: X\n        - name: \"\"\n", 9, "rate_limit.replaces[1].name: should not have an empty replaces entry"},
		{"replaces of no name at all", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{}]\n", 7, "should not have an empty replaces entry"},
		{"replaces naming itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: Self\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: Other\n        - name: Self\n", 10, "rate_limit.replaces[1].name: replaces should not contain name of same descriptor"},
		{"quota_mode not a bool", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: yes please\n", 4, "quota_mode: must be true or false"},
		{"not a map", "- a\n", 1, "is a map with domain and descriptors"},
		{"no domain", "descriptors: []\n", 1, "domain: is required"},
		{"unknown key", "domain: d\nextra: 1\n", 2, `unknown key "extra"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", 4, "rate_limit.unit: must be one of second"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, "requests_per_unit: must be between 0 and 4294967295"},
		{"too fast", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 4000000000\n", 6, "not a rate ratelimitd can hold"},
		{"control character", "domain: d\ndescriptors:\n  - key: \"k\\0\"\n", 3, "key: must not hold control characters"},
		{"empty value", "domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n", 4, "value: must not be empty"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", 5, "the same descriptor as on line 3"},
		{"alias", "domain: &d d\ndescriptors:\n  - key: *d\n", 3, "aliases are not supported"},
		{"bad name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: 9lives, unit: second, requests_per_unit: 1}\n", 4, "rate_limit.name: must start with a letter"},
		{"deep", "domain: d\ndescriptors:\n" + deep(17), 0, "descriptors nest at most 16 deep"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", 5, "share_threshold: is only for a value with a wildcard"},
		{"own keys", "domain: d\ndescriptors:\n  - key: k\n    metadata: {ratelimitd: {burst: 0, id_format: nope}}\n", 4, "burst: must be at least 1"},
		{"second document", "domain: d\n---\ndomain: e\n", 2, "this is a second one"},
		{"quota of another unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata: {ratelimitd: {calendar: day}}\n", 4, "rate_limit.unit: must be day, the calendar of metadata.ratelimitd"},
		{"quota with a multiplier", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unit_multiplier: 2, requests_per_unit: 1}\n    metadata: {ratelimitd: {calendar: day}}\n", 4, "without unit_multiplier"},
		{"unknown calendar", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n    metadata: {ratelimitd: {calendar: fortnight}}\n", 5, "calendar: must be hour, day, week, month or year"},
		{"zone without calendar", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n    metadata: {ratelimitd: {time_zone: UTC}}\n", 5, "time_zone: is only for a calendar quota"},
		{"host zone", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n    metadata: {ratelimitd: {calendar: day, time_zone: Local}}\n", 5, "time_zone: must be an IANA zone name"},
		{"zone path", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n    metadata: {ratelimitd: {calendar: day, time_zone: ../../etc/passwd}}\n", 5, "time_zone: must be an IANA zone name"},
		{"quota too big", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n    metadata: {ratelimitd: {calendar: hour}}\n", 4, "requests_per_unit: is more than a calendar quota can hold"},
		{"quota burst", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n    metadata: {ratelimitd: {calendar: day, burst: 9}}\n", 3, "burst must equal count for a calendar quota"},
	} {
		_, errs, err := limitfile.ImportEnvoy(t.Context(), d, "tester", []byte(tc.doc), limitfile.ImportOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		found := false
		for _, e := range errs {
			found = found || strings.Contains(e.Message, tc.want) && (tc.line == 0 || e.Line == tc.line)
		}
		if !found {
			t.Errorf("%s: %v; want line %d: %q", tc.name, errs, tc.line, tc.want)
		}
	}
	if ls, _ := d.ListLimits(t.Context()); len(ls) != 0 {
		t.Errorf("refused files wrote %d limits", len(ls))
	}
	if rs, _ := d.ListRules(t.Context(), ""); len(rs) != 0 {
		t.Errorf("refused files wrote %d rules", len(rs))
	}
}

// deep nests n descriptors.
func deep(n int) string {
	var b strings.Builder
	for i := range n {
		ind := strings.Repeat("    ", i)
		b.WriteString(ind + "  - key: k\n")
		if i < n-1 {
			b.WriteString(ind + "    descriptors:\n")
		} else {
			b.WriteString(ind + "    rate_limit: {unit: second, requests_per_unit: 1}\n")
		}
	}
	return b.String()
}

// TestImportEnvoyMerge: a merge adds a file's descriptors to its domain's
// rules and keeps the others, as envoyproxy/ratelimit adds up two files
// of one domain (its merge_domain_key1 and _key2 configurations); a file
// that repeats a top-level descriptor the domain has, a rule's or an
// override's, is refused with its line, as the peer refuses it, and so is
// a rate_limit.name of the domain's limits; nothing is then written. A
// dry run counts; an import without merge replaces, on both engines.
func TestImportEnvoyMerge(t *testing.T) {
	for _, postgres := range []bool{false, true} {
		d := envoyDB(t, postgres)
		ctx := t.Context()
		imp := func(doc string, opts limitfile.ImportOptions) (limiter.ImportCounts, []limitfile.EntryError) {
			t.Helper()
			counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", []byte(doc), opts)
			if err != nil {
				t.Fatal(err)
			}
			return counts, errs
		}
		merge := limitfile.ImportOptions{Merge: true}
		first := "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n" +
			"  - key: user\n    rate_limit: {name: PerUser, unit: minute, requests_per_unit: 5}\n  - key: user\n    value: vip\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"
		second := "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"
		if _, errs := imp(first, limitfile.ImportOptions{}); errs != nil {
			t.Fatal(errs)
		}
		if counts, errs := imp(second, limitfile.ImportOptions{Merge: true, DryRun: true}); errs != nil || counts.Created != 2 || len(counts.Removed) != 0 {
			t.Fatalf("dry run: %+v %v", counts, errs)
		}
		if counts, errs := imp(second, merge); errs != nil || counts.Created != 2 || len(counts.Removed) != 0 {
			t.Fatalf("merge: %+v %v", counts, errs)
		}
		s := snapshotOf(t, d)
		for _, kv := range [][]string{{"key1", "value1"}, {"key2", "value2"}, {"user", "vip"}} {
			if limit, _ := decide(t, s, "test-domain", kv...); limit == "" {
				t.Errorf("after the merge %v matches no rule", kv)
			}
		}
		rulesBefore, _ := d.ListRules(ctx, "test-domain")
		for _, tc := range []struct {
			name, doc string
			line      int
			want      string
		}{
			{"a rule's descriptor", "domain: test-domain\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n" +
				"  - key: key1\n    value: value1\n    descriptors:\n      - key: sub\n        rate_limit: {unit: second, requests_per_unit: 1}\n", 5,
				`domain "test-domain" has this descriptor already`},
			{"an override's descriptor", "domain: test-domain\ndescriptors:\n  - key: user\n    value: vip\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 3,
				"has this descriptor already"},
			{"a limit of the domain", "domain: test-domain\ndescriptors:\n  - key: team\n    rate_limit: {name: PerUser, unit: second, requests_per_unit: 1}\n", 3,
				`rate_limit.name "PerUser" is the limit of a rule of the domain already`},
		} {
			_, errs := imp(tc.doc, merge)
			found := false
			for _, e := range errs {
				found = found || e.Line == tc.line && strings.Contains(e.Message, tc.want)
			}
			if !found {
				t.Errorf("%s: %v; want line %d: %q", tc.name, errs, tc.line, tc.want)
			}
		}
		if rulesAfter, _ := d.ListRules(ctx, "test-domain"); len(rulesAfter) != len(rulesBefore) {
			t.Errorf("refused merges changed the rules: %d before, %d after", len(rulesBefore), len(rulesAfter))
		}
		// Without merge, the file is the domain's rules.
		if counts, errs := imp(second, limitfile.ImportOptions{}); errs != nil || len(counts.Removed) != 2 {
			t.Fatalf("replace: %+v %v", counts, errs)
		}
	}
}
