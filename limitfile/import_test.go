package limitfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

func testdata(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func lim(name string, enum int, format limiter.IDFormat, burst, count int64, period time.Duration) limiter.Limit {
	return limiter.Limit{Name: name, Enum: enum, IDFormat: format, Params: limiter.Params{Burst: burst, Count: count, Period: period}}
}

func params(burst, count int64, period time.Duration) limiter.Params {
	return limiter.Params{Burst: burst, Count: count, Period: period}
}

// catalogue returns the limits of boulder_defaults.yaml as imported.
func catalogue() []limiter.Limit {
	return []limiter.Limit{
		lim("NewRegistrationsPerIPAddress", 1, limiter.IPAddress, 10, 10, 3*time.Hour),
		lim("NewRegistrationsPerIPv6Range", 2, limiter.IPv6Range, 500, 500, 3*time.Hour),
		lim("NewOrdersPerAccount", 3, limiter.RegID, 300, 300, 3*time.Hour),
		lim("FailedAuthorizationsPerDomainPerAccount", 4, limiter.RegIDDomain, 5, 5, time.Hour),
		lim("CertificatesPerDomain", 5, limiter.DomainOrCIDR, 50, 50, 168*time.Hour),
		lim("CertificatesPerDomainPerAccount", 6, limiter.RegIDDomain, 300, 300, 168*time.Hour),
		lim("CertificatesPerFQDNSet", 7, limiter.FQDNSet, 5, 5, 168*time.Hour),
		lim("FailedAuthorizationsForPausingPerDomainPerAccount", 8, limiter.RegIDDomain, 1200, 1200, 240*time.Hour),
		lim("LimitOverrideRequestsPerIPAddress", 9, limiter.IPAddress, 3, 3, 15*time.Minute),
	}
}

func limitMap(ls ...limiter.Limit) map[string]limiter.Limit {
	m := map[string]limiter.Limit{}
	for _, l := range ls {
		m[l.Name] = l
	}
	return m
}

// wantOverride is what a test checks of a stored override.
type wantOverride struct {
	limiter.Params
	Unlimited bool
	Comment   string
	Enabled   bool
	ExpiresAt time.Time
}

func overrideMap(os map[bucket]limiter.Override) map[bucket]wantOverride {
	m := map[bucket]wantOverride{}
	for k, o := range os {
		m[k] = wantOverride{o.Params, o.Unlimited, o.Comment, o.Enabled, o.ExpiresAt}
	}
	return m
}

func TestImportDefaults(t *testing.T) {
	custom := lim("Custom", 100, limiter.String, 1, 1, time.Second)
	custom.Description, custom.Shadow = "kept", true
	orders := lim("NewOrdersPerAccount", 3, limiter.RegID, 300, 300, 3*time.Hour)
	orders.Description, orders.Shadow = "kept", true
	ordersOdd := lim("NewOrdersPerAccount", 100, limiter.String, 1, 1, time.Second)
	login := lim("LoginAttemptsPerIP", 42, limiter.IPAddress, 5, 5, time.Minute)
	login.Shadow, login.Description = true, "Trial run: counted and reported,\nnever denies.\n"
	site := lim("AccountsPerSite", 100, limiter.String, 20, 20, time.Second)
	site.Description = "Sign-ups: per site, smoothed"

	for _, tc := range []struct {
		name   string
		stored []limiter.Limit
		doc    string
		want   []limiter.Limit
		counts limiter.ImportCounts
	}{{
		name:   "Boulder's file takes the catalogue's enums and id formats",
		doc:    string(testdata(t, "boulder_defaults.yaml")),
		want:   catalogue(),
		counts: limiter.ImportCounts{Created: 9},
	}, {
		name:   "our extensions; what a stored limit's entry leaves out is kept",
		stored: []limiter.Limit{orders},
		doc:    string(testdata(t, "ours_defaults.yaml")),
		want:   []limiter.Limit{orders, site, login},
		counts: limiter.ImportCounts{Created: 2, Unchanged: 1},
	}, {
		name:   "id format, enum, description and shadow of a stored limit are kept",
		stored: []limiter.Limit{custom},
		doc:    "Custom: {burst: 5, count: 10, period: 1m, description: ~, shadow: }",
		want:   []limiter.Limit{func() limiter.Limit { l := custom; l.Params = params(5, 10, time.Minute); return l }()},
		counts: limiter.ImportCounts{Updated: 1},
	}, {
		name:   "given explicitly, they replace the stored ones",
		stored: []limiter.Limit{custom},
		doc:    "Custom: {burst: 1, count: 1, period: 1s, id_format: domain, enum: 100, description: '', shadow: false}",
		want:   []limiter.Limit{lim("Custom", 100, limiter.Domain, 1, 1, time.Second)},
		counts: limiter.ImportCounts{Updated: 1},
	}, {
		name:   "a catalogue name stored with another enum and format re-imports as it is",
		stored: []limiter.Limit{ordersOdd},
		doc:    "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, id_format: string, enum: 100}",
		want:   []limiter.Limit{ordersOdd},
		counts: limiter.ImportCounts{Unchanged: 1},
	}, {
		name:   "a catalogue name stored with another format takes the catalogue's when given",
		stored: []limiter.Limit{ordersOdd},
		doc:    "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, id_format: reg_id}",
		want:   []limiter.Limit{lim("NewOrdersPerAccount", 100, limiter.RegID, 1, 1, time.Second)},
		counts: limiter.ImportCounts{Updated: 1},
	}, {
		name: "periods in any Go notation; new limits outside the catalogue get enums from 100",
		doc: "A: {burst: 1, count: 2, period: 1h30m, id_format: reg_id}\n" +
			"B: {burst: 3000000000, count: 3000000000, period: 87600h, id_format: domain}\n" +
			"C: {burst: 3, count: 3, period: 1.5s, id_format: string, enum: 99, description: 2024-01-01}\n",
		want: []limiter.Limit{
			lim("A", 100, limiter.RegID, 1, 2, 90*time.Minute),
			lim("B", 101, limiter.Domain, 3e9, 3e9, 87600*time.Hour),
			func() limiter.Limit {
				l := lim("C", 99, limiter.String, 3, 3, 1500*time.Millisecond)
				l.Description = "2024-01-01"
				return l
			}(),
		},
		counts: limiter.ImportCounts{Created: 3},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore(tc.stored...)
			counts, errs, err := Import(t.Context(), st, "tester", Defaults, []byte(tc.doc), ImportOptions{})
			if err != nil || errs != nil {
				t.Fatalf("Import: %v, %v", errs, err)
			}
			if !reflect.DeepEqual(counts, tc.counts) {
				t.Errorf("counts = %+v, want %+v", counts, tc.counts)
			}
			limits, _ := st.state()
			want := limitMap(tc.stored...)
			for _, l := range tc.want {
				want[l.Name] = l
			}
			if !reflect.DeepEqual(limits, want) {
				t.Errorf("stored limits:\n got %+v\nwant %+v", limits, want)
			}
		})
	}
}

func TestImportOverrides(t *testing.T) {
	enabled := func(p limiter.Params, comment string) wantOverride {
		return wantOverride{Params: p, Comment: comment, Enabled: true}
	}
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		stored []limiter.Override
		doc    string
		want   map[bucket]wantOverride
		counts limiter.ImportCounts
	}{{
		name: "Boulder's list format; ids are stored canonical",
		doc:  string(testdata(t, "boulder_overrides.yaml")),
		want: map[bucket]wantOverride{
			{"NewRegistrationsPerIPAddress", "10.0.0.2"}:                          enabled(params(40, 40, 3*time.Hour), "Office NAT"),
			{"NewRegistrationsPerIPAddress", "10.0.0.3"}:                          enabled(params(40, 40, 3*time.Hour), "Mapped IPv4, stored unmapped"),
			{"NewRegistrationsPerIPv6Range", "2001:db8:1234::/48"}:                enabled(params(1000, 1000, 3*time.Hour), "Hosting provider"),
			{"NewOrdersPerAccount", "12345"}:                                      enabled(params(3000, 3000, 3*time.Hour), "Big integrator"),
			{"NewOrdersPerAccount", "67890"}:                                      enabled(params(3000, 3000, 3*time.Hour), "Leading zeros are dropped"),
			{"CertificatesPerDomain", "example.com"}:                              enabled(params(500, 500, 168*time.Hour), "Case folded"),
			{"CertificatesPerDomain", "192.0.2.7/32"}:                             enabled(params(500, 500, 168*time.Hour), "An IPv4 address, as a /32"),
			{"CertificatesPerFQDNSet", "example.com,www.example.com"}:             enabled(params(30, 30, 168*time.Hour), "Sorted when stored"),
			{"FailedAuthorizationsPerDomainPerAccount", "12345:mail.example.com"}: enabled(params(50, 50, time.Hour), "Renewal storm"),
		},
		counts: limiter.ImportCounts{Created: 9},
	}, {
		name: "Boulder's older map format, keys split at the first colon",
		doc:  string(testdata(t, "boulder_overrides_map.yaml")),
		want: map[bucket]wantOverride{
			{"NewRegistrationsPerIPAddress", "10.0.0.2"}:                     enabled(params(40, 40, 3*time.Hour), ""),
			{"NewRegistrationsPerIPAddress", "2001:db8::1"}:                  enabled(params(40, 40, 3*time.Hour), ""),
			{"NewOrdersPerAccount", "12345"}:                                 enabled(params(3000, 3000, 3*time.Hour), ""),
			{"FailedAuthorizationsPerDomainPerAccount", "12345:example.com"}: enabled(params(50, 50, time.Hour), ""),
		},
		counts: limiter.ImportCounts{Created: 4},
	}, {
		name: "our extensions: string ids, entry comments, unlimited, blocking",
		doc:  string(testdata(t, "ours_overrides.yaml")),
		want: map[bucket]wantOverride{
			{"NewOrdersPerAccount", "111"}: enabled(params(3000, 3000, 3*time.Hour), "Partner programme"),
			{"NewOrdersPerAccount", "222"}: enabled(params(3000, 3000, 3*time.Hour), "Partner programme"),
			{"NewOrdersPerAccount", "333"}: enabled(params(3000, 3000, 3*time.Hour), "Partner programme, renegotiated"),
			{"NewOrdersPerAccount", "444"}: {Unlimited: true, Enabled: true},
			{"NewOrdersPerAccount", "555"}: enabled(params(0, 1, time.Second), "Abuse"),
		},
		counts: limiter.ImportCounts{Created: 5},
	}, {
		name: "parameters given with unlimited are dropped",
		doc:  "- NewOrdersPerAccount: {unlimited: true, burst: 5, count: 5, period: 1s, ids: [1]}",
		want: map[bucket]wantOverride{
			{"NewOrdersPerAccount", "1"}: {Unlimited: true, Enabled: true},
		},
		counts: limiter.ImportCounts{Created: 1},
	}, {
		name: "a stored override keeps being disabled and its expiry",
		stored: []limiter.Override{
			{Limit: "NewOrdersPerAccount", BucketID: "1", Params: params(1, 1, time.Second), Comment: "old", ExpiresAt: expires},
			{Limit: "NewOrdersPerAccount", BucketID: "2", Params: params(5, 5, time.Second), Comment: "same", Enabled: true},
		},
		doc: "NewOrdersPerAccount:01: {burst: 2, count: 2, period: 2s, comment: new}\n" +
			"NewOrdersPerAccount:2: {burst: 5, count: 5, period: 1s, comment: same}\n",
		want: map[bucket]wantOverride{
			{"NewOrdersPerAccount", "1"}: {Params: params(2, 2, 2*time.Second), Comment: "new", ExpiresAt: expires},
			{"NewOrdersPerAccount", "2"}: enabled(params(5, 5, time.Second), "same"),
		},
		counts: limiter.ImportCounts{Updated: 1, Unchanged: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore(catalogue()...)
			for _, o := range tc.stored {
				st.withOverride(o)
			}
			counts, errs, err := Import(t.Context(), st, "tester", Overrides, []byte(tc.doc), ImportOptions{})
			if err != nil || errs != nil {
				t.Fatalf("Import: %v, %v", errs, err)
			}
			if !reflect.DeepEqual(counts, tc.counts) {
				t.Errorf("counts = %+v, want %+v", counts, tc.counts)
			}
			limits, overrides := st.state()
			if !reflect.DeepEqual(limits, limitMap(catalogue()...)) {
				t.Errorf("limits changed: %+v", limits)
			}
			if got := overrideMap(overrides); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stored overrides:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestImportEmpty checks that documents without entries write nothing and
// are no error.
func TestImportEmpty(t *testing.T) {
	for _, kind := range []Kind{Defaults, Overrides} {
		for _, doc := range []string{"", "\n", "# only a comment\n", "~\n", "null", "---\n", "---\n...\n", "{}\n", "[]\n"} {
			if kind == Defaults && doc == "[]\n" {
				continue
			}
			st := newFakeStore()
			counts, errs, err := Import(t.Context(), st, "tester", kind, []byte(doc), ImportOptions{})
			if err != nil || errs != nil || !reflect.DeepEqual(counts, limiter.ImportCounts{}) || st.imports != 0 {
				t.Errorf("%s %q: %+v, %v, %v; Import called %d times", kind, doc, counts, errs, err, st.imports)
			}
		}
	}
}

func TestImportDryRun(t *testing.T) {
	st := newFakeStore(catalogue()...)
	before, _ := st.state()
	counts, errs, err := Import(t.Context(), st, "tester", Defaults, []byte("NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}\nX: {burst: 1, count: 1, period: 1s, id_format: string}"), ImportOptions{DryRun: true})
	if err != nil || errs != nil {
		t.Fatalf("Import: %v, %v", errs, err)
	}
	if want := (limiter.ImportCounts{Created: 1, Updated: 1}); !reflect.DeepEqual(counts, want) {
		t.Errorf("counts = %+v, want %+v", counts, want)
	}
	if after, _ := st.state(); !reflect.DeepEqual(after, before) {
		t.Errorf("a dry run changed the limits: %+v", after)
	}
}

func TestImportStoreErrors(t *testing.T) {
	boom := errors.New("boom")
	st := newFakeStore()
	st.err = boom
	for _, kind := range []Kind{Defaults, Overrides} {
		_, errs, err := Import(t.Context(), st, "tester", kind, []byte("A: {}"), ImportOptions{})
		if !errors.Is(err, boom) || errs != nil {
			t.Errorf("%s: %v, %v; want boom", kind, errs, err)
		}
		if _, err := Export(t.Context(), st, kind); !errors.Is(err, boom) {
			t.Errorf("Export %s: %v; want boom", kind, err)
		}
	}
	// A limit taken in the meantime: the store's conflict is the error.
	st = newFakeStore(lim("A", 100, limiter.String, 1, 1, time.Second))
	_, errs, err := Import(t.Context(), st, "tester", Defaults, []byte("A: {burst: 1, count: 1, period: 1s, enum: 100}"), ImportOptions{})
	if err != nil || errs != nil {
		t.Fatal(errs, err)
	}
	_, _, err = Import(t.Context(), racer{st}, "tester", Defaults, []byte("B: {burst: 1, count: 1, period: 1s, id_format: string, enum: 100}"), ImportOptions{})
	if !errors.Is(err, limiter.ErrConflict) {
		t.Errorf("Import after a race: %v; want a conflict", err)
	}
}

// racer hides the stored limits from the checks, as if another writer had
// added them after the checks read them.
type racer struct{ *fakeStore }

func (racer) ListLimits(context.Context) ([]limiter.Limit, error) { return nil, nil }

func TestImportBadKind(t *testing.T) {
	st := newFakeStore()
	for _, kind := range []Kind{"", "limits"} {
		if _, _, err := Import(t.Context(), st, "tester", kind, []byte("A: {}"), ImportOptions{}); err == nil {
			t.Errorf("Import of kind %q: no error", kind)
		}
		if _, err := Export(t.Context(), st, kind); err == nil {
			t.Errorf("Export of kind %q: no error", kind)
		}
	}
}

// badStore is what the error tests import into: the catalogue, Existing
// (reg_id, enum 100, with an override) and Other (enum 101).
func badStore() *fakeStore {
	st := newFakeStore(append(catalogue(),
		lim("Existing", 100, limiter.RegID, 1, 1, time.Second),
		lim("Other", 101, limiter.RegID, 1, 1, time.Second))...)
	return st.withOverride(limiter.Override{Limit: "Existing", BucketID: "1", Params: params(1, 1, time.Second), Enabled: true})
}

func TestImportErrorFiles(t *testing.T) {
	formats := "ip_address, ipv6_range, reg_id, domain, domain_or_cidr, ident_value, fqdn_set, reg_id_domain, reg_id_fqdn_set, string"
	for _, tc := range []struct {
		file string
		kind Kind
		want []EntryError
	}{{
		file: "bad_defaults.yaml",
		kind: Defaults,
		want: []EntryError{
			{4, "ZeroBurst", "burst: must be at least 1"},
			{6, "Fractions", `burst: must be an integer, not the string "20"`},
			{7, "Fractions", "count: must be an integer, not 1.5"},
			{8, "Fractions", `period: must be a Go duration such as "1s" or "3h", not "300"`},
			{10, "Missing", "burst: required"},
			{10, "Missing", "period: required"},
			{11, "Missing", "count: must be at least 1"},
			{13, "Typo", `unknown key "burts": want burst, count, period, id_format, enum, description, shadow`},
			{14, "NoFormat", "id_format: required for a limit outside Let's Encrypt's catalogue; one of " + formats},
			{15, "NewOrdersPerAccount", "id_format: NewOrdersPerAccount has id_format reg_id in Let's Encrypt's catalogue"},
			{15, "NewOrdersPerAccount", "enum: NewOrdersPerAccount has enum 3 in Let's Encrypt's catalogue"},
			{16, "Existing", "id_format: cannot change from reg_id while limit Existing has overrides (1): their bucket ids are written in it"},
			{16, "Existing", "enum: limit Existing has enum 100, and an enum never changes"},
			{17, "9Lives", "name: must start with a letter"},
			{18, "ZeroBurst", "defined twice; first at line 4"},
			{19, "NotAMap", "must be a map of burst, count, period, id_format, enum, description, shadow; not a list"},
			{20, "Taken", `id_format: must be one of ` + formats + `; not the string "email"`},
			{20, "Taken", "enum: 101 is already the enum of limit Other"},
			{21, "Kept", "enum: 5 is reserved for CertificatesPerDomain of Let's Encrypt's catalogue"},
			{21, "Kept", `shadow: must be true or false, not the string "yes"`},
			{22, "TooFast", "period: period / count must be at least 1µs"},
			{22, "TooFast", "count: period / count must be at least 1µs"},
			{23, "Huge", "burst: must be an integer between -9223372036854775808 and 9223372036854775807"},
			{25, "Twin2", "enum: 50 is also the enum of Twin1 at line 24"},
			{27, "Alias", "must be a map of burst, count, period, id_format, enum, description, shadow; not a YAML alias, which is not supported"},
			{28, "Aliased", "enum: YAML aliases are not supported"},
		},
	}, {
		file: "bad_overrides.yaml",
		kind: Overrides,
		want: []EntryError{
			{4, "NewOrdersPerAccount", "burst: must be at least 0"},
			{5, "NewOrdersPerAccount", "count: must be at least 1"},
			{14, "NewOrdersPerAccount:12x45", "ids[1]: must be a positive decimal integer"},
			{15, "NewOrdersPerAccount:0012345", "ids[2]: the same bucket as line 7"},
			{18, "NewOrdersPerAccount:7", `ids[3]: unknown key "note": want id, comment`},
			{19, "NewOrdersPerAccount", "ids[4]: must be an id, or a map of id and comment; not a list"},
			{20, "NewOrdersPerAccount", "ids[5].id: required"},
			{21, "NoSuchLimit", "limit NoSuchLimit does not exist; import it with the defaults first"},
			{26, "Not a name", `"Not a name" is not a limit name: may hold only letters, digits, '_', '.' and '-'`},
			{31, "NewRegistrationsPerIPAddress", "ids: must list at least one id"},
			{36, "NewRegistrationsPerIPAddress", `unknown key "expires": want burst, count, period, unlimited, comment, ids`},
			{37, "NewRegistrationsPerIPAddress", `ids: must be a list of ids; not the string "10.0.0.1"`},
			{41, "CertificatesPerDomain", `period: must be a Go duration such as "1s" or "3h", not "forever"`},
			{42, "CertificatesPerDomain:com", "ids[0]: must have at least two labels"},
			{42, "CertificatesPerDomain:10.0.0.0/8", "ids[2]: IPv4 prefix must be /32"},
			{43, "NewRegistrationsPerIPAddress", `unlimited: must be true or false, not the string "yes"`},
			{44, "NewRegistrationsPerIPAddress", "burst: must be an integer, not 1.5"},
			{45, "", "a list entry is a map with one key, the limit's name; not a map with 2 keys"},
			{46, "", `a list entry is a map with one key, the limit's name; not the string "just a string"`},
		},
	}} {
		t.Run(tc.file, func(t *testing.T) {
			st := badStore()
			if tc.kind == Defaults {
				// Without the catalogue, whose names the file creates.
				st = newFakeStore(lim("Existing", 100, limiter.RegID, 1, 1, time.Second), lim("Other", 101, limiter.RegID, 1, 1, time.Second))
				st.withOverride(limiter.Override{Limit: "Existing", BucketID: "1", Params: params(1, 1, time.Second), Enabled: true})
			}
			checkErrors(t, st, tc.kind, string(testdata(t, tc.file)), tc.want)
		})
	}
}

// checkErrors imports doc into st and checks that it reports want and
// writes nothing.
func checkErrors(t *testing.T, st *fakeStore, kind Kind, doc string, want []EntryError) {
	t.Helper()
	limits, overrides := st.state()
	counts, errs, err := Import(t.Context(), st, "tester", kind, []byte(doc), ImportOptions{})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if !reflect.DeepEqual(errs, want) {
		var b strings.Builder
		for _, e := range errs {
			fmt.Fprintf(&b, "\t%#v\n", e)
		}
		t.Errorf("entry errors:\n%s want %d of them: %+v", b.String(), len(want), want)
	}
	if !reflect.DeepEqual(counts, limiter.ImportCounts{}) || st.imports != 0 {
		t.Errorf("counts %+v, %d calls of Import; want nothing written", counts, st.imports)
	}
	if l, o := st.state(); !reflect.DeepEqual(l, limits) || !reflect.DeepEqual(o, overrides) {
		t.Errorf("the store changed")
	}
}

func TestImportErrors(t *testing.T) {
	long := strings.Repeat("x", 1001)
	for _, tc := range []struct {
		name string
		kind Kind
		doc  string
		want []EntryError
	}{
		{"syntax error", Defaults, "A:\n  burst: 1\n count: 2\n",
			// yaml.v3 reports the line of the mapping the bad line breaks.
			[]EntryError{{2, "", "not valid YAML: did not find expected key"}}},
		{"unclosed flow sequence", Overrides, "- A:\n    ids: [1,\n",
			[]EntryError{{2, "", "not valid YAML: did not find expected node content"}}},
		{"tab indentation", Defaults, "A:\n\tburst: 1\n",
			[]EntryError{{2, "", "not valid YAML: found character that cannot start any token"}}},
		{"control character", Defaults, "A: {description: \"\x01\"}",
			[]EntryError{{0, "", "not valid YAML: control characters are not allowed"}}},
		{"unknown anchor", Defaults, "A: *nowhere\n",
			[]EntryError{{0, "", "not valid YAML: unknown anchor 'nowhere' referenced"}}},
		{"two documents", Defaults, "A: {burst: 1, count: 1, period: 1s}\n---\nB: {}\n",
			[]EntryError{{2, "", "a file holds one YAML document, and this is a second one"}}},
		{"defaults not a map", Defaults, "\n- A: {}\n",
			[]EntryError{{2, "", "a defaults document is a map from limit names to their parameters, not a list"}}},
		{"defaults a scalar", Defaults, "hello",
			[]EntryError{{1, "", `a defaults document is a map from limit names to their parameters, not the string "hello"`}}},
		{"overrides a scalar", Overrides, "42",
			[]EntryError{{1, "", "an overrides document is a list of limits with their ids, or a map from <limit>:<id> to parameters; not 42"}}},
		{"key given twice", Defaults, "X:\n  burst: 1\n  count: 1\n  burst: 2\n  period: 1s\n  id_format: string\n",
			[]EntryError{{4, "X", "burst: given twice"}}},
		{"merge key", Defaults, "X: {<<: {burst: 1}, count: 1, period: 1s, id_format: string}",
			[]EntryError{{1, "X", "merge keys (<<) are not supported"}, {1, "X", "burst: required"}}},
		{"negative period, enum 0, string enum", Defaults, "X: {burst: 1, count: 1, period: -1s, id_format: string, enum: 0}\nY: {burst: 1, count: 1, period: 1s, id_format: string, enum: '3'}",
			[]EntryError{{1, "X", "period: must be a positive duration"}, {1, "X", "enum: must be between 1 and 2147483647"}, {2, "Y", `enum: must be an integer, not the string "3"`}}},
		{"wrong types", Defaults, "X: {burst: [1], count: true, period: {a: 1}, id_format: [string], description: {a: b}, shadow: 1}",
			[]EntryError{
				{1, "X", "burst: must be an integer, not a list"},
				{1, "X", "count: must be an integer, not true"},
				{1, "X", `period: must be a Go duration such as "1s" or "3h", not a map`},
				{1, "X", "id_format: must be one of ip_address, ipv6_range, reg_id, domain, domain_or_cidr, ident_value, fqdn_set, reg_id_domain, reg_id_fqdn_set, string; not a list"},
				{1, "X", "description: must be text, not a map"},
				{1, "X", "shadow: must be true or false, not 1"},
			}},
		{"name too long, key not text", Defaults, "A" + strings.Repeat("b", 64) + ": {burst: 1, count: 1, period: 1s, id_format: string}\n[a]: {}\n",
			[]EntryError{{1, "A" + strings.Repeat("b", 64), "name: must be at most 64 characters"}, {2, "", "limit names must be plain text, not a list"}}},
		{"description too long", Defaults, "X: {burst: 1, count: 1, period: 1s, id_format: string, description: " + long + "}",
			[]EntryError{{1, "X", "description: must be at most 1000 bytes"}}},
		{"comment too long", Overrides, "- NewOrdersPerAccount:\n    burst: 1\n    count: 1\n    period: 1s\n    comment: " + long + "\n    ids: [1, 2, {id: 3, comment: " + long + "}]\n",
			[]EntryError{{5, "NewOrdersPerAccount", "comment: must be at most 1000 bytes"}, {6, "NewOrdersPerAccount:3", "ids[2].comment: must be at most 1000 bytes"}}},
		{"map format problems", Overrides, "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}\n" +
			"NewOrdersPerAccount:abc: {burst: 1, count: 1, period: 1s}\n" +
			"NewRegistrationsPerIPAddress:10.0.0.1: {burst: 1, count: 1, period: 1s}\n" +
			"NewRegistrationsPerIPAddress:::ffff:10.0.0.1: {burst: 1, count: 1, period: 1s}\n" +
			"NewOrdersPerAccount:1: {burst: 1, count: 1, period: 1s, ids: [1]}\n" +
			"NewOrdersPerAccount:2: {count: 1, period: 1s, unlimited: false}\n" +
			"NewOrdersPerAccount:3: 5\n" +
			":4: {unlimited: true}\n",
			[]EntryError{
				{1, "NewOrdersPerAccount", "the key must be a limit name and a bucket id joined by a colon, such as NewOrdersPerAccount:12345"},
				{2, "NewOrdersPerAccount:abc", "id: must be a positive decimal integer"},
				{4, "NewRegistrationsPerIPAddress:::ffff:10.0.0.1", "the same bucket as line 3"},
				{5, "NewOrdersPerAccount:1", `unknown key "ids": want burst, count, period, unlimited, comment`},
				{6, "NewOrdersPerAccount:2", "burst: required"},
				{7, "NewOrdersPerAccount:3", "must be a map of burst, count, period, unlimited, comment; not 5"},
				{8, ":4", `"" is not a limit name: must not be empty`},
			}},
		{"the same bucket in two entries and two notations", Overrides, "- NewRegistrationsPerIPv6Range: {unlimited: true, ids: ['2001:db8::/48']}\n" +
			"- NewRegistrationsPerIPv6Range: {burst: 1, count: 1, period: 1s, ids: ['2001:db8:0:1::7']}\n",
			[]EntryError{{2, "NewRegistrationsPerIPv6Range:2001:db8:0:1::7", "ids[0]: the same bucket as line 1"}}},
		{"null unlimited is no unlimited", Overrides, "- NewOrdersPerAccount:\n    unlimited:\n    ids: [\"2\"]\n",
			[]EntryError{{1, "NewOrdersPerAccount", "burst: required"}, {1, "NewOrdersPerAccount", "count: required"}, {1, "NewOrdersPerAccount", "period: required"}}},
		{"null and empty ids, entry not a map", Overrides, "- NewOrdersPerAccount: {unlimited: true, ids: [~, '', {id: ~}, {id: [1]}]}\n- NewOrdersPerAccount: [1]\n- NewOrdersPerAccount: {unlimited: true}\n",
			[]EntryError{
				{1, "NewOrdersPerAccount:", "ids[0]: must not be empty"},
				{1, "NewOrdersPerAccount:", "ids[1]: must not be empty"},
				{1, "NewOrdersPerAccount:~", "ids[2].id: required"},
				{1, "NewOrdersPerAccount", "ids[3].id: must be text, not a list"},
				{2, "NewOrdersPerAccount", "must be a map of burst, count, period, unlimited, comment, ids; not a list"},
				{3, "NewOrdersPerAccount", "ids: required: the ids these parameters apply to"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErrors(t, badStore(), tc.kind, tc.doc, tc.want)
		})
	}
	t.Run("catalogue enum taken by a limit outside the catalogue", func(t *testing.T) {
		st := newFakeStore(lim("Foo", 3, limiter.String, 1, 1, time.Second))
		checkErrors(t, st, Defaults, "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}",
			[]EntryError{{1, "NewOrdersPerAccount", "enum: 3 is already the enum of limit Foo"}})
	})
}

// TestImportAccountWideOverride: Boulder overrides the per-account-per-domain
// limits by account alone; such an id is an account-wide override.
func TestImportAccountWideOverride(t *testing.T) {
	st := newFakeStore(lim("FailedAuthorizationsPerDomainPerAccount", 4, limiter.RegIDDomain, 3, 3, time.Minute))
	doc := "- FailedAuthorizationsPerDomainPerAccount:\n    burst: 60\n    count: 60\n    period: 3s\n    ids:\n      - id: 01234\n        comment: Foo\n"
	counts, errs, err := Import(context.Background(), st, "test", Overrides, []byte(doc), ImportOptions{})
	if err != nil || len(errs) > 0 || counts.Created != 1 {
		t.Fatalf("Import = %+v, %v, %v", counts, errs, err)
	}
	_, overrides := st.state()
	o, ok := overrides[bucket{"FailedAuthorizationsPerDomainPerAccount", "1234"}]
	if !ok || o.Burst != 60 || o.Comment != "Foo" {
		t.Fatalf("overrides %+v", overrides)
	}
}
