package limitfile

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
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

func TestCatalogued(t *testing.T) {
	want := []struct {
		name   string
		enum   int
		format limiter.IDFormat
	}{
		{"NewRegistrationsPerIPAddress", 1, limiter.IPAddress},
		{"NewRegistrationsPerIPv6Range", 2, limiter.IPv6Range},
		{"NewOrdersPerAccount", 3, limiter.RegID},
		{"FailedAuthorizationsPerDomainPerAccount", 4, limiter.RegIDDomain},
		{"CertificatesPerDomain", 5, limiter.DomainOrCIDR},
		{"CertificatesPerDomainPerAccount", 6, limiter.RegIDDomain},
		{"CertificatesPerFQDNSet", 7, limiter.FQDNSet},
		{"FailedAuthorizationsForPausingPerDomainPerAccount", 8, limiter.RegIDDomain},
		{"LimitOverrideRequestsPerIPAddress", 9, limiter.IPAddress},
	}
	for _, w := range want {
		enum, format, ok := Catalogued(w.name)
		if !ok || enum != w.enum || format != w.format {
			t.Errorf("Catalogued(%q) = %d, %q, %v; want %d, %q, true", w.name, enum, format, ok, w.enum, w.format)
		}
		if got := catalogueName(w.enum); got != w.name {
			t.Errorf("catalogueName(%d) = %q, want %q", w.enum, got, w.name)
		}
	}
	for _, name := range []string{"", "newordersperaccount", "NewOrdersPerAccount ", "AccountsPerSite"} {
		if _, _, ok := Catalogued(name); ok {
			t.Errorf("Catalogued(%q) is ok", name)
		}
	}
	for _, enum := range []int{0, 10, 100} {
		if got := catalogueName(enum); got != "" {
			t.Errorf("catalogueName(%d) = %q", enum, got)
		}
	}
}
