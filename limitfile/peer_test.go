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
	counts, errs, err := limitfile.ImportEnvoy(t.Context(), d, "tester", data, dryRun)
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
		if len(counts.Removed) != 1 || !strings.Contains(counts.Removed[0], `"route"`) || counts.Unchanged != 2 {
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
		counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", out, dryRun)
		if err != nil || errs != nil || counts.Created+counts.Updated != 0 || len(counts.Removed) != 0 {
			t.Errorf("dry run %v: the export imports as %+v, %v, %v:\n%s", dryRun, counts, errs, err, out)
		}
	}
	after, _ := d.ListLimits(ctx)
	if !reflect.DeepEqual(before, after) {
		t.Errorf("limits changed:\n%+v\n%+v", before, after)
	}
}
