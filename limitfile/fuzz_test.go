package limitfile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// fuzzStore holds limits of every id format, one of them with an override,
// and a calendar quota (with an override) and a concurrency limit, which
// Boulder's format cannot describe, so that both kinds of document have
// something to refer to and to conflict with.
func fuzzStore() *fakeStore {
	st := newFakeStore(append(catalogue(),
		lim("Existing", 100, limiter.RegID, 1, 1, time.Second),
		lim("Str", 101, limiter.String, 1, 1, time.Second),
		lim("Dom", 102, limiter.Domain, 1, 1, time.Second),
		lim("Ident", 103, limiter.IdentValue, 1, 1, time.Second),
		lim("Pair", 104, limiter.RegIDFQDNSet, 1, 1, time.Second),
		limiter.Limit{Name: "Quota", Enum: 105, IDFormat: limiter.String, Calendar: limiter.CalendarDay, TimeZone: "UTC", Params: params(5, 5, 0)},
		limiter.Limit{Name: "Leases", Enum: 106, IDFormat: limiter.String, Kind: limiter.KindConcurrency, Params: params(5, 5, time.Second)})...)
	st.withOverride(limiter.Override{Limit: "Quota", BucketID: "q", Params: params(9, 9, 0), Enabled: true})
	return st.withOverride(limiter.Override{Limit: "Existing", BucketID: "1", Params: params(1, 1, time.Second), Enabled: true})
}

// FuzzParse feeds arbitrary bytes to Import as both kinds of document. It
// must never panic; the store must never refuse what the checks let
// through; every entry error must say something; and whatever imports
// without errors must export and re-import unchanged.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"Str: {burst: 1, count: 1, period: 1s, description: \"a\\tb\\u2028c\\u0085d \"}",
		"- Str: {burst: 1, count: 1, period: 1s, ids: ['- x', '~', 'a: b', ' lead', '#', '\"', \"'\", '…'], comment: \"x\\ny \"}",
		"- Pair: {unlimited: true, ids: ['1:b.example,A.example']}\n- Ident: {burst: 0, count: 1, period: 1ns, ids: ['::ffff:1.2.3.4', 'Example.COM.']}",
		"Dom:Example.com: {burst: 0, count: 1, period: 1us}\nStr:a:b: {unlimited: true, comment: yes}",
		"X: {burst: 1, count: 1, period: 1s, id_format: string, enum: 2147483647, shadow: false}\nExisting: {burst: 2, count: 1, period: 1s}",
		"NewOrdersPerAccount: {burst: 0x10, count: 0o10, period: 1h1m1s1ms1us1ns}",
		"Quota: {burst: 5, count: 5, period: 24h}\nLeases: {burst: 5, count: 5, period: 1s}",
		"- Quota: {burst: 5, count: 5, period: 24h, ids: [q]}\nLeases:x: {burst: 5, count: 5, period: 1s}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// yaml.v3 counts lines as libyaml does: CR, LF, CR LF, NEL, LS and
		// PS each end one (this bound counts CR LF twice).
		lines := 1
		for _, b := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
			lines += strings.Count(string(data), b)
		}
		for _, kind := range []Kind{Defaults, Overrides} {
			st := fuzzStore()
			_, errs, err := Import(t.Context(), st, "fuzz", kind, data, ImportOptions{})
			if err != nil {
				t.Fatalf("%s: the store refused what the checks accepted: %v", kind, err)
			}
			for _, e := range errs {
				if e.Message == "" || e.Line < 0 || e.Line > lines {
					t.Errorf("%s: bad entry error %#v", kind, e)
				}
			}
			if errs == nil {
				roundTrip(t, st, kind)
			}
		}
	})
}

// FuzzRoundTrip builds well-formed documents around arbitrary texts and
// numbers, which FuzzParse's random bytes seldom are, so that export must
// write every description, comment and id that imports in a form that
// reads back the same. The documents are JSON, which is YAML too.
func FuzzRoundTrip(f *testing.F) {
	f.Add("Custom", "a description", "an id", "a comment", int64(10), int64(5), "1h", false)
	f.Add("x", "\nlead", "- x", "\t\n", int64(0), int64(1), "1ns", true)
	f.Add("A.b-c_9", "ls\u2028ps", "~", "null", int64(1<<62), int64(3), "87600h", false)
	f.Fuzz(func(t *testing.T, name, description, id, comment string, burst, count int64, period string, unlimited bool) {
		defaults := map[string]any{name: map[string]any{
			"burst": burst, "count": count, "period": period, "id_format": "string", "description": description,
		}}
		override := map[string]any{"burst": burst, "count": count, "period": period, "comment": description,
			"ids": []any{id, map[string]any{"id": id + "2", "comment": comment}}}
		if unlimited {
			override = map[string]any{"unlimited": true, "comment": description, "ids": []any{id, map[string]any{"id": id + "2", "comment": comment}}}
		}
		overrides := []any{map[string]any{"Str": override}}
		for kind, doc := range map[Kind]any{Defaults: defaults, Overrides: overrides} {
			data, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			st := fuzzStore()
			_, errs, err := Import(t.Context(), st, "fuzz", kind, data, ImportOptions{})
			if err != nil {
				t.Fatalf("%s: the store refused what the checks accepted: %v", kind, err)
			}
			if errs == nil {
				roundTrip(t, st, kind)
			}
		}
	})
}
