package limitfile_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// otherKinds stores a rate limit, a calendar quota and a concurrency
// limit, each with an override.
func otherKinds(t *testing.T, d *db.DB) {
	t.Helper()
	ctx := t.Context()
	for _, l := range []limiter.Limit{
		{Name: "Orders", IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Hour}},
		{Name: "Exports", IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "Europe/Paris",
			Params: limiter.Params{Burst: 1000, Count: 1000}},
		{Name: "ModelCalls", IDFormat: limiter.String, Kind: limiter.KindConcurrency,
			Params: limiter.Params{Burst: 10, Count: 10, Period: 30 * time.Second}},
	} {
		if _, _, err := d.PutLimit(ctx, "tester", l); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []limiter.Override{
		{Limit: "Orders", BucketID: "a", Params: limiter.Params{Burst: 50, Count: 50, Period: time.Hour}, Enabled: true},
		{Limit: "Exports", BucketID: "a", Params: limiter.Params{Burst: 5000, Count: 5000}, Enabled: true},
		{Limit: "ModelCalls", BucketID: "a", Params: limiter.Params{Burst: 20, Count: 20, Period: time.Minute}, Enabled: true},
	} {
		if _, err := d.CreateOverride(ctx, "tester", o); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBoulderRateLimitsOnly: Boulder's formats know rate limits only. An
// export leaves the other kinds and their overrides out, naming them in
// a comment, and imports again unchanged; an import that names one of
// them is refused with the entry's line, and writes nothing.
func TestBoulderRateLimitsOnly(t *testing.T) {
	d := envoyDB(t, false)
	otherKinds(t, d)
	ctx := t.Context()
	for _, tc := range []struct {
		kind    limitfile.Kind
		comment string
	}{
		{limitfile.Defaults, "# Left out, as Boulder's format describes rate limits only:\n" +
			"#   limit Exports is a calendar quota (day), which Boulder's format cannot describe\n" +
			"#   limit ModelCalls is a concurrency limit, which Boulder's format cannot describe\n" +
			"Orders:\n"},
		{limitfile.Overrides, "# The overrides of these limits are left out, as Boulder's format describes rate limits only:\n" +
			"#   limit Exports is a calendar quota (day), which Boulder's format cannot describe\n" +
			"#   limit ModelCalls is a concurrency limit, which Boulder's format cannot describe\n" +
			"- Orders:\n"},
	} {
		out, err := limitfile.Export(ctx, d, tc.kind)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(out), tc.comment) || strings.Count(string(out), "Exports") != 1 || strings.Count(string(out), "ModelCalls") != 1 {
			t.Errorf("%s export:\n%s", tc.kind, out)
		}
		counts, errs, err := limitfile.Import(ctx, d, "tester", tc.kind, out, limitfile.ImportOptions{})
		if err != nil || errs != nil || !reflect.DeepEqual(counts, limiter.ImportCounts{Unchanged: 1}) {
			t.Errorf("%s: the export imports as %+v, %v, %v", tc.kind, counts, errs, err)
		}
	}

	before := dump(t, d)
	for _, tc := range []struct {
		kind limitfile.Kind
		doc  string
		want []limitfile.EntryError
	}{
		{limitfile.Defaults, "Orders: {burst: 6, count: 6, period: 1h}\nExports:\n  burst: 1\n  count: 1\n  period: 24h\nModelCalls: {burst: 1, count: 1, period: 1s}\n",
			[]limitfile.EntryError{
				{Line: 2, Entry: "Exports", Message: "limit Exports is a calendar quota (day), which Boulder's format cannot describe; change it with PUT /v1/limits/Exports"},
				{Line: 6, Entry: "ModelCalls", Message: "limit ModelCalls is a concurrency limit, which Boulder's format cannot describe; change it with PUT /v1/limits/ModelCalls"},
			}},
		{limitfile.Overrides, "- Orders: {burst: 1, count: 1, period: 1s, ids: [b]}\n- Exports: {burst: 1, count: 1, period: 24h, ids: [b]}\n",
			[]limitfile.EntryError{
				{Line: 2, Entry: "Exports", Message: "limit Exports is a calendar quota (day), which Boulder's format cannot describe; set its overrides with POST /v1/overrides"},
			}},
		{limitfile.Overrides, "ModelCalls:b: {burst: 1, count: 1, period: 1s}\n",
			[]limitfile.EntryError{
				{Line: 1, Entry: "ModelCalls:b", Message: "limit ModelCalls is a concurrency limit, which Boulder's format cannot describe; set its overrides with POST /v1/overrides"},
			}},
	} {
		_, errs, err := limitfile.Import(ctx, d, "tester", tc.kind, []byte(tc.doc), limitfile.ImportOptions{})
		if err != nil || !reflect.DeepEqual(errs, tc.want) {
			t.Errorf("%s %q:\n got %+v, %v\nwant %+v", tc.kind, tc.doc, errs, err, tc.want)
		}
	}
	if after := dump(t, d); !reflect.DeepEqual(before, after) {
		t.Errorf("refused imports wrote:\n%+v\n%+v", before, after)
	}
}

// TestEnvoyQuotaRoundTrip: a rule of a calendar quota is written with the
// calendar as its unit, which envoyproxy/ratelimit reads as its own fixed
// window, and with the quota's calendar and zone in ratelimitd's
// metadata, which make the import a quota again: the same database is
// unchanged, and another gets the same quota and overrides.
func TestEnvoyQuotaRoundTrip(t *testing.T) {
	d := envoyDB(t, false)
	otherKinds(t, d)
	ctx := t.Context()
	if _, err := d.CreateRule(ctx, "tester", limiter.Rule{Domain: "api", Descriptor: []limiter.DescriptorEntry{{Key: "user"}}, Limit: "Exports"}); err != nil {
		t.Fatal(err)
	}
	blocked := limiter.Override{Limit: "Exports", BucketID: "b", Enabled: true, Comment: "abuse"}
	if _, err := d.CreateOverride(ctx, "tester", blocked); err != nil {
		t.Fatal(err)
	}
	out, err := limitfile.ExportEnvoy(ctx, d, "api")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  - key: user\n    rate_limit:\n      name: Exports\n      unit: day\n      requests_per_unit: 1000\n    metadata:\n      ratelimitd:\n" +
			"        description: \"\"\n        calendar: day\n        time_zone: \"Europe/Paris\"\n",
		"  - key: user\n    value: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 5000\n    metadata:\n      ratelimitd:\n" +
			"        comment: \"\"\n        calendar: day\n        time_zone: \"Europe/Paris\"\n",
		"  - key: user\n    value: b\n    rate_limit:\n      unit: day\n      requests_per_unit: 0\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the export lacks\n%s\nin\n%s", want, out)
		}
	}
	before := dump(t, d)
	counts, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", out, limitfile.ImportOptions{})
	if err != nil || errs != nil || counts.Created+counts.Updated != 0 {
		t.Errorf("the export imports into its database as %+v, %v, %v", counts, errs, err)
	}
	if after := dump(t, d); !reflect.DeepEqual(before, after) {
		t.Errorf("the import changed the database:\n%+v\n%+v", before, after)
	}

	fresh := envoyDB(t, false)
	if _, errs, err := limitfile.ImportEnvoy(ctx, fresh, "tester", out, limitfile.ImportOptions{}); err != nil || errs != nil {
		t.Fatalf("the export imports into another database: %v, %v", errs, err)
	}
	l, err := fresh.GetLimit(ctx, "Exports")
	if err != nil || !l.Quota() || l.Calendar != limiter.CalendarDay || l.TimeZone != "Europe/Paris" ||
		l.Params != (limiter.Params{Burst: 1000, Count: 1000}) {
		t.Errorf("the quota imported as %+v, %v", l, err)
	}
	snap := snapshotOf(t, fresh)
	for id, want := range map[string]limiter.Params{"a": {Burst: 5000, Count: 5000}, "b": {}, "c": {Burst: 1000, Count: 1000}} {
		if _, r := decide(t, snap, "api", "user", id); r.Params != want {
			t.Errorf("user %s: %+v, want %+v", id, r.Params, want)
		}
	}
}

// TestEnvoyUnitIsARate: without ratelimitd's metadata a unit of the
// peer's is a rate, never a calendar quota; and a descriptor cannot name
// a concurrency limit.
func TestEnvoyUnitIsARate(t *testing.T) {
	d := envoyDB(t, false)
	otherKinds(t, d)
	ctx := t.Context()
	doc := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: Daily, unit: day, requests_per_unit: 100}\n"
	if _, errs, err := limitfile.ImportEnvoy(ctx, d, "tester", []byte(doc), limitfile.ImportOptions{}); err != nil || errs != nil {
		t.Fatalf("%v, %v", errs, err)
	}
	if l, err := d.GetLimit(ctx, "Daily"); err != nil || l.Quota() || l.Period != 24*time.Hour || l.KindOf() != limiter.KindRate {
		t.Errorf("unit: day imported as %+v, %v", l, err)
	}
	// A file of the peer's naming a quota or a concurrency limit would
	// make it a rate limit: its kind cannot change.
	before := dump(t, d)
	for _, name := range []string{"Exports", "ModelCalls"} {
		doc := "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {name: " + name + ", unit: day, requests_per_unit: 100}\n"
		if _, _, err := limitfile.ImportEnvoy(ctx, d, "tester", []byte(doc), limitfile.ImportOptions{}); !errors.Is(err, limiter.ErrKindFixed) {
			t.Errorf("%s: %v, want ErrKindFixed", name, err)
		}
	}
	if after := dump(t, d); !reflect.DeepEqual(before, after) {
		t.Errorf("refused imports wrote:\n%+v\n%+v", before, after)
	}
}
