package limitfile

import (
	"strings"
	"testing"
)

func TestParseKind(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Kind
		wantErr string
	}{
		{in: "defaults", want: Defaults},
		{in: "overrides", want: Overrides},
		{in: "", wantErr: "kind is missing"},
		{in: "envoy", want: Envoy},
		{in: "Defaults", wantErr: `kind "Defaults" is unknown`},
		{in: "limits", wantErr: `kind "limits" is unknown`},
	} {
		got, err := ParseKind(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseKind(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestEntryErrorString(t *testing.T) {
	for _, tc := range []struct {
		e    EntryError
		want string
	}{
		{EntryError{Line: 3, Entry: "NewOrdersPerAccount", Message: "burst: must be at least 1"}, "line 3: NewOrdersPerAccount: burst: must be at least 1"},
		{EntryError{Line: 7, Message: "not valid YAML: did not find expected key"}, "line 7: not valid YAML: did not find expected key"},
		{EntryError{Message: "not valid YAML: control characters are not allowed"}, "not valid YAML: control characters are not allowed"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%#v.Error() = %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestDetectKind(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want Kind
		err  string
	}{
		{"NewOrdersPerAccount:\n  burst: 1\n", Defaults, ""},
		{"- NewOrdersPerAccount:\n    ids: [\"1\"]\n", Overrides, ""},
		{"NewOrdersPerAccount:12345:\n  burst: 1\n", Overrides, ""},
		{"", "", "empty"},
		{"# only a comment\n", "", "empty"},
		{"just text\n", "", "line 1"},
		{"a: [\n", "", "line"},
	} {
		got, err := DetectKind([]byte(tc.doc))
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("DetectKind(%q) = %q, %v; want %q and an error with %q", tc.doc, got, err, tc.want, tc.err)
		}
	}
}
