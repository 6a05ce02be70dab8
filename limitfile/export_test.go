package limitfile

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

func TestExportDefaults(t *testing.T) {
	shadow := lim("alpha", 100, limiter.String, 20, 20, time.Second)
	shadow.Shadow, shadow.Description = true, "yes"
	described := lim("A9", 101, limiter.Domain, 5, 10, 90*time.Minute)
	described.Description = "Two lines:\nthe second one"
	st := newFakeStore(shadow, described,
		lim("A10", 102, limiter.FQDNSet, 1, 1, 168*time.Hour),
		lim("NewOrdersPerAccount", 3, limiter.RegID, 300, 300, 3*time.Hour))
	got, err := Export(t.Context(), st, Defaults)
	if err != nil {
		t.Fatal(err)
	}
	// Byte order of names; periods in Go's canonical form; enum always,
	// shadow only when true, description only when not empty, and in
	// double quotes when it has line breaks.
	want := `A10:
  burst: 1
  count: 1
  period: 168h0m0s
  id_format: fqdn_set
  enum: 102
A9:
  burst: 5
  count: 10
  period: 1h30m0s
  id_format: domain
  enum: 101
  description: "Two lines:\nthe second one"
NewOrdersPerAccount:
  burst: 300
  count: 300
  period: 3h0m0s
  id_format: reg_id
  enum: 3
alpha:
  burst: 20
  count: 20
  period: 1s
  id_format: string
  enum: 100
  shadow: true
  description: "yes"
`
	if string(got) != want {
		t.Errorf("Export:\n%s\nwant:\n%s", got, want)
	}
}

func TestExportOverrides(t *testing.T) {
	st := newFakeStore(catalogue()...)
	for _, o := range []limiter.Override{
		{Limit: "NewOrdersPerAccount", BucketID: "9", Params: params(10, 10, time.Hour), Enabled: true},
		{Limit: "NewOrdersPerAccount", BucketID: "10", Params: params(10, 10, time.Hour), Enabled: true, Comment: "ten"},
		{Limit: "NewOrdersPerAccount", BucketID: "11", Params: params(10, 10, time.Hour), Enabled: false, Comment: "disabled: left out"},
		{Limit: "NewOrdersPerAccount", BucketID: "12", Params: params(10, 10, time.Hour), Enabled: true,
			ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Comment: "expiry: not written"},
		{Limit: "NewOrdersPerAccount", BucketID: "13", Params: params(0, 1, time.Second), Enabled: true, Comment: "blocked"},
		{Limit: "NewOrdersPerAccount", BucketID: "14", Unlimited: true, Enabled: true},
		{Limit: "NewOrdersPerAccount", BucketID: "15", Params: params(10, 10, 2*time.Hour), Enabled: true},
		{Limit: "CertificatesPerFQDNSet", BucketID: "example.com,www.example.com", Params: params(30, 30, 168*time.Hour), Enabled: true},
		{Limit: "NewRegistrationsPerIPAddress", BucketID: "2001:db8::1", Unlimited: true, Enabled: true, Comment: "true"},
	} {
		st.withOverride(o)
	}
	got, err := Export(t.Context(), st, Overrides)
	if err != nil {
		t.Fatal(err)
	}
	// One entry per limit and parameters, limits by name, parameters in
	// increasing order and unlimited last, ids sorted as text.
	want := `- CertificatesPerFQDNSet:
    burst: 30
    count: 30
    period: 168h0m0s
    ids:
      - example.com,www.example.com
- NewOrdersPerAccount:
    burst: 0
    count: 1
    period: 1s
    ids:
      - id: "13"
        comment: blocked
- NewOrdersPerAccount:
    burst: 10
    count: 10
    period: 1h0m0s
    ids:
      - id: "10"
        comment: ten
      - id: "12"
        comment: "expiry: not written"
      - "9"
- NewOrdersPerAccount:
    burst: 10
    count: 10
    period: 2h0m0s
    ids:
      - "15"
- NewOrdersPerAccount:
    unlimited: true
    ids:
      - "14"
- NewRegistrationsPerIPAddress:
    unlimited: true
    ids:
      - id: "2001:db8::1"
        comment: "true"
`
	if string(got) != want {
		t.Errorf("Export:\n%s\nwant:\n%s", got, want)
	}
}

func TestExportEmpty(t *testing.T) {
	st := newFakeStore()
	for kind, want := range map[Kind]string{Defaults: "{}\n", Overrides: "[]\n"} {
		got, err := Export(t.Context(), st, kind)
		if err != nil || string(got) != want {
			t.Errorf("Export(%s) of nothing = %q, %v; want %q", kind, got, err, want)
		}
	}
}

// TestRoundTrip imports each sample file, exports, and imports the export:
// the second import must count everything unchanged and change nothing,
// and a second export must be the same bytes.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		file string
		kind Kind
	}{
		{"boulder_defaults.yaml", Defaults},
		{"ours_defaults.yaml", Defaults},
		{"boulder_overrides.yaml", Overrides},
		{"boulder_overrides_map.yaml", Overrides},
		{"ours_overrides.yaml", Overrides},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var st *fakeStore
			if tc.kind == Defaults {
				st = newFakeStore()
			} else {
				st = newFakeStore(catalogue()...)
			}
			if _, errs, err := Import(t.Context(), st, "tester", tc.kind, testdata(t, tc.file), ImportOptions{}); err != nil || errs != nil {
				t.Fatalf("Import: %v, %v", errs, err)
			}
			roundTrip(t, st, tc.kind)
		})
	}
}

// roundTrip checks that importing an export of st changes nothing.
func roundTrip(t testing.TB, st Store, kind Kind) {
	t.Helper()
	ctx := t.Context()
	limits, err := st.ListLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// What Boulder's format can describe is exported, and imports again
	// unchanged.
	var described, overrides int
	unfit := map[string]bool{}
	for _, l := range limits {
		if boulderProblem(l) == "" {
			described++
		} else {
			unfit[l.Name] = true
		}
	}
	if _, err := st.Full(ctx, func(limiter.Limit) error { return nil }, func(o limiter.Override) error {
		if !unfit[o.Limit] {
			overrides++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, err := Export(ctx, st, kind)
	if err != nil {
		t.Fatal(err)
	}
	counts, errs, err := Import(ctx, st, "tester", kind, out, ImportOptions{})
	if err != nil || errs != nil {
		t.Fatalf("Import of the export: %v, %v\n%s", errs, err, out)
	}
	n := described
	if kind == Overrides {
		n = overrides
	}
	if want := (limiter.ImportCounts{Unchanged: n}); !reflect.DeepEqual(counts, want) {
		t.Errorf("Import of the export counts %+v, want %+v\n%s", counts, want, out)
	}
	after, err := st.ListLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, limits) {
		t.Errorf("limits changed:\n got %+v\nwant %+v", after, limits)
	}
	again, err := Export(ctx, st, kind)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(out) {
		t.Errorf("second export differs:\n%s\nfirst:\n%s", again, out)
	}
}

// TestExportQuoting stores texts that YAML would read as something else,
// or not at all, unless written with care, and checks that an export of
// them imports unchanged.
func TestExportQuoting(t *testing.T) {
	texts := []string{
		"null", "~", "true", "No", "0x10", "1e3", ".inf", "012", "1:20", "2024-01-01",
		"- x", "? x", "a: b", "a #b", "#c", "&a", "*a", "!tag", "%x", "@x", "`x", "<<", "=", "[x]", "{x}", "'", "\"", "|", ">",
		" lead", "trail ", "two  spaces", "tab\there", "line\nbreak", "\nlead", "trail\n", "trail\n\n", "cr\rlf",
		"nel\u0085", "ls\u2028ps\u2029", "bom\ufeff", "ctl\x01\x7f", "émoji 🙂", strings.Repeat("long ", 200),
	}
	st := newFakeStore()
	for i, s := range texts {
		l := lim(fmt.Sprintf("L%02d", i), 100+i, limiter.String, 1, 1, time.Second)
		l.Description = s
		st.limits[l.Name] = l
		if _, err := bucketid.Canonical(limiter.String, s); err == nil {
			st.withOverride(limiter.Override{Limit: "L00", BucketID: s, Params: params(1, 1, time.Second), Enabled: true, Comment: s})
		}
		st.withOverride(limiter.Override{Limit: "L01", BucketID: fmt.Sprint(i), Unlimited: true, Enabled: true, Comment: s})
	}
	roundTrip(t, st, Defaults)
	roundTrip(t, st, Overrides)
}

// TestScalar checks that every text of up to two characters from an
// alphabet of YAML's troublemakers reads back as itself wherever an export
// writes text, and which texts are written plain.
func TestScalar(t *testing.T) {
	alpha := []string{"a", "A", " ", "\n", "\t", "\r", "#", ":", "-", ",", ".", "'", "\"", "\\", "\u0085", "\u2028",
		"\ufeff", "\x00", "\x7f", "é", "0", "~", "n", "y", "?", "&", "*", "!", "|", ">", "%", "@", "`", "[", "{", "\uffff"}
	texts := []string{"true", "True", "FALSE", "yes", "No", "on", "OFF", "null", "Null", "NULL", "a  b", "a "}
	for _, a := range alpha {
		texts = append(texts, a)
		for _, b := range alpha {
			texts = append(texts, a+b)
		}
	}
	for _, s := range texts {
		doc := "- " + scalar(s) + ":\n    ids:\n      - " + scalar(s) + "\n      - id: " + scalar(s) + "\n        comment: " + scalar(s) + "\n"
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
			t.Errorf("%q: %v\n%s", s, err, doc)
			continue
		}
		entry := n.Content[0].Content[0]
		ids := entry.Content[1].Content[1].Content
		got := []string{entry.Content[0].Value}
		for _, v := range []*yaml.Node{ids[0], ids[1].Content[1], ids[1].Content[3]} {
			x, _ := scalarText(v)
			got = append(got, x)
		}
		for _, g := range got {
			if g != s {
				t.Errorf("%q reads back as %q from\n%s", s, g, doc)
				break
			}
		}
	}
	for s, want := range map[string]string{
		"NewOrdersPerAccount":             "NewOrdersPerAccount",
		"mail.example.com":                "mail.example.com",
		"Partner programme, renegotiated": "Partner programme, renegotiated",
		"10.0.0.2":                        `"10.0.0.2"`,
		"12345":                           `"12345"`,
		"true":                            `"true"`,
		"a: b":                            `"a: b"`,
		"tab\there\n":                     `"tab\there\n"`,
		"nel\u0085ls\u2028":               `"nel\u0085ls\u2028"`,
		"ctl\x01\x7f":                     `"ctl\x01\x7F"`,
		`back\slash "q"`:                  `"back\\slash \"q\""`,
		"émoji 🙂":                         `"émoji 🙂"`,
	} {
		if got := scalar(s); !reflect.DeepEqual(got, want) {
			t.Errorf("scalar(%q) = %s, want %s", s, got, want)
		}
	}
}
