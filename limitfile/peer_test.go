package limitfile_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// The tests below replay what envoyproxy/ratelimit accepts and decides,
// feature by feature, with small files of our own in testdata/envoy/peer.

func importPeer(t *testing.T, d envoyStore, name string, dryRun bool) limiter.ImportCounts {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "envoy", "peer", name))
	if err != nil {
		t.Fatal(err)
	}
	counts, errs, err := limitfile.ImportEnvoy(t.Context(), d, "tester", data, limitfile.ImportOptions{DryRun: dryRun})
	if err != nil || errs != nil {
		t.Fatalf("%s: %v, %v", name, errs, err)
	}
	return counts
}

// envoyStore is the database the tests import into.
type envoyStore = limitfile.EnvoyStore

func TestPeerDocumentMarkers(t *testing.T) {
	d := envoyDB(t, false)
	importPeer(t, d, "documents.yaml", false)
	if limit, _ := decide(t, snapshotOf(t, d), "docs", "client", "a"); limit == "" {
		t.Error("the document between the markers was not imported")
	}
}

func TestPeerWildcards(t *testing.T) {
	d := envoyDB(t, false)
	importPeer(t, d, "wildcards.yaml", false)
	s := snapshotOf(t, d)
	for _, tc := range []struct {
		value  string
		count  int64
		bucket string
	}{
		{"bar-b", 2, "bar-b"},
		{"barb", 2, "barb"},
		{"bar-bx", 100, "bar-bx"},
		{"foo-bar-baz", 3, "foo-bar-baz"},
		{"foo-baz", 100, "foo-baz"},
		// share_threshold: every value under files/ in one bucket.
		{"files/a.pdf", 10, "*"},
		{"files/b.csv", 10, "*"},
	} {
		limit, r := decide(t, s, "wild", "name", tc.value)
		if limit == "" || r.Params.Count != tc.count || r.BucketID != tc.bucket {
			t.Errorf("name=%s: %s %+v; want count %d, bucket %q", tc.value, limit, r, tc.count, tc.bucket)
		}
	}
}

func TestPeerBlockedAndUnlimitedAlone(t *testing.T) {
	d := envoyDB(t, false)
	importPeer(t, d, "alone.yaml", false)
	s := snapshotOf(t, d)
	for _, v := range []string{"a", "b"} {
		if _, r := decide(t, s, "alone", "banned", v); r.Source != limiter.SourceOverride || r.Params.Burst != 0 || r.Params.Period != time.Hour {
			t.Errorf("banned=%s: %+v", v, r)
		}
	}
	if _, r := decide(t, s, "alone", "internal", "health"); r.Source != limiter.SourceUnlimited {
		t.Errorf("internal=health: %+v", r)
	}
}

func TestPeerMetricSettingsAccepted(t *testing.T) {
	d := envoyDB(t, false)
	counts := importPeer(t, d, "metrics.yaml", false)
	notes := strings.Join(counts.Notes, "\n")
	for _, want := range []string{"detailed_metric is accepted", "value_to_metric is accepted", `metadata "team" is accepted and not kept`} {
		if !strings.Contains(notes, want) {
			t.Errorf("no %q in the notes:\n%s", want, notes)
		}
	}
}

func TestPeerReloadRemovesRules(t *testing.T) {
	d := envoyDB(t, false)
	importPeer(t, d, "reload_before.yaml", false)
	for _, dryRun := range []bool{true, false} {
		counts := importPeer(t, d, "reload_after.yaml", dryRun)
		if len(counts.Removed) != 1 || counts.Removed[0].Descriptor[0].Key != "route" || counts.Unchanged != 2 {
			t.Errorf("dry run %v: %+v", dryRun, counts)
		}
	}
	rules, err := d.ListRules(t.Context(), "reload")
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 || rules[0].Descriptor[0].Key != "user" {
		t.Errorf("rules after the reload: %+v", rules)
	}
}

// TestPeerRoundTrip: a domain written back and imported again changes
// nothing, not even what Envoy's format has no word for.
func TestPeerRoundTrip(t *testing.T) {
	d := envoyDB(t, false)
	ctx := t.Context()
	l := limiter.Limit{Name: "PerClient", IDFormat: limiter.IPAddress, Description: "our own words",
		Params: limiter.Params{Burst: 20, Count: 10, Period: time.Second}}
	if _, _, err := d.PutLimit(ctx, "tester", l); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateRule(ctx, "tester", limiter.Rule{Domain: "edge", Descriptor: []limiter.DescriptorEntry{{Key: "remote_address"}}, Limit: "PerClient"}); err != nil {
		t.Fatal(err)
	}
	o := limiter.Override{Limit: "PerClient", BucketID: "192.0.2.1", Comment: "a partner", Enabled: true,
		Params: limiter.Params{Burst: 50, Count: 25, Period: time.Second}}
	if _, err := d.CreateOverride(ctx, "tester", o); err != nil {
		t.Fatal(err)
	}
	before, _ := d.ListLimits(ctx)
	out, err := limitfile.ExportEnvoy(ctx, d, "edge")
	if err != nil {
		t.Fatal(err)
	}
	for _, dryRun := range []bool{true, false} {
		counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", out, limitfile.ImportOptions{DryRun: dryRun})
		if err != nil || errs != nil || counts.Created+counts.Updated != 0 || len(counts.Removed) != 0 {
			t.Errorf("dry run %v: the export imports as %+v, %v, %v:\n%s", dryRun, counts, errs, err, out)
		}
	}
	after, _ := d.ListLimits(ctx)
	if !reflect.DeepEqual(before, after) {
		t.Errorf("limits changed:\n%+v\n%+v", before, after)
	}
}

// ruleFor returns the rule a request descriptor of domain matches.
func ruleFor(t *testing.T, s *limiter.Snapshot, domain string, kv ...string) limiter.Rule {
	t.Helper()
	var entries []limiter.DescriptorEntry
	for i := 0; i < len(kv); i += 2 {
		entries = append(entries, limiter.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	r, ok := s.Match(domain, entries)
	if !ok {
		t.Fatalf("no rule of %s matches %v", domain, kv)
	}
	return r
}

// TestPeerReplaces: rate_limit.replaces goes on the rule; a descriptor
// named like the limit it would override is replaced with it, one without
// a name is not; a name no limit can have is left out with a note.
func TestPeerReplaces(t *testing.T) {
	d := envoyDB(t, false)
	counts := importPeer(t, d, "replaces.yaml", false)
	s := snapshotOf(t, d)
	if r := ruleFor(t, s, "replace", "endpoint", "report", "user", "bob"); !reflect.DeepEqual(r.Replaces, []string{"ReadPerUser"}) {
		t.Errorf("the replacing rule: %+v", r)
	}
	if r := ruleFor(t, s, "replace", "endpoint", "health"); !reflect.DeepEqual(r.Replaces, []string{"ReadPerUser"}) {
		t.Errorf("the unlimited replacing rule: %+v", r)
	}
	if r := ruleFor(t, s, "replace", "category", "read", "user", "bob"); r.Limit != "ReadPerUser" || r.Replaces != nil {
		t.Errorf("the replaced rule: %+v", r)
	}
	if limit, res := decide(t, s, "replace", "category", "read", "user", "intern"); limit != "ReadPerUser" || res.Source != limiter.SourceOverride || res.Params.Count != 1 {
		t.Errorf("intern: %s %+v, want an override of ReadPerUser", limit, res)
	}
	if limit, res := decide(t, s, "replace", "category", "read", "user", "vip"); limit == "ReadPerUser" || res.Params.Count != 100 {
		t.Errorf("vip: %s %+v, want a limit of its own", limit, res)
	}
	if notes := strings.Join(counts.Notes, "\n"); !strings.Contains(notes, `replaces "no limit's name" names no limit`) {
		t.Errorf("notes: %s", notes)
	}
}

// TestPeerQuotaMode: quota_mode goes on the rule, and a value-specific
// quota descriptor is an override of the quota rule it falls under.
func TestPeerQuotaMode(t *testing.T) {
	d := envoyDB(t, false)
	importPeer(t, d, "quota.yaml", false)
	s := snapshotOf(t, d)
	for _, tc := range []struct {
		value string
		quota bool
		count int64
	}{{"a", true, 100}, {"b", true, 20}, {"c", false, 30}, {"z", true, 10}} {
		r := ruleFor(t, s, "quota", "backend", tc.value)
		_, res := decide(t, s, "quota", "backend", tc.value)
		if r.QuotaMode != tc.quota || res.Params.Count != tc.count {
			t.Errorf("backend=%s: rule %+v, %+v; want quota %v, count %d", tc.value, r, res.Params, tc.quota, tc.count)
		}
	}
}

// TestPeerModesRoundTrip: replaces and quota_mode are exported, and the
// export imports without a change.
func TestPeerModesRoundTrip(t *testing.T) {
	d := envoyDB(t, false)
	ctx := t.Context()
	for file, domain := range map[string]string{"replaces.yaml": "replace", "quota.yaml": "quota"} {
		importPeer(t, d, file, false)
		before, _ := d.ListRules(ctx, domain)
		out, err := limitfile.ExportEnvoy(ctx, d, domain)
		if err != nil {
			t.Fatal(err)
		}
		counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", out, limitfile.ImportOptions{})
		if err != nil || errs != nil || counts.Created+counts.Updated != 0 || len(counts.Removed) != 0 {
			t.Errorf("%s: the export imports as %+v, %v, %v:\n%s", domain, counts, errs, err, out)
		}
		after, _ := d.ListRules(ctx, domain)
		if !reflect.DeepEqual(before, after) {
			t.Errorf("%s: rules changed:\n%+v\n%+v", domain, before, after)
		}
	}
}
