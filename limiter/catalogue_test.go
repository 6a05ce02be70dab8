package limiter_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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
		enum, format, ok := limiter.Catalogued(w.name)
		if !ok || enum != w.enum || format != w.format {
			t.Errorf("limiter.Catalogued(%q) = %d, %q, %v; want %d, %q, true", w.name, enum, format, ok, w.enum, w.format)
		}
		if got := limiter.CatalogueName(w.enum); got != w.name {
			t.Errorf("limiter.CatalogueName(%d) = %q, want %q", w.enum, got, w.name)
		}
	}
	for _, name := range []string{"", "newordersperaccount", "NewOrdersPerAccount ", "AccountsPerSite"} {
		if _, _, ok := limiter.Catalogued(name); ok {
			t.Errorf("limiter.Catalogued(%q) is ok", name)
		}
	}
	for _, enum := range []int{0, 10, 100} {
		if got := limiter.CatalogueName(enum); got != "" {
			t.Errorf("limiter.CatalogueName(%d) = %q", enum, got)
		}
	}
}

func TestCatalogueProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		enum int
		ok   bool
	}{
		{"NewOrdersPerAccount", 0, true},
		{"NewOrdersPerAccount", 3, true},
		{"NewOrdersPerAccount", 4, false},
		{"NewOrdersPerAccount", 100, false},
		{"MyLimit", 3, false},
		{"MyLimit", 9, false},
		{"MyLimit", 10, true},
		{"MyLimit", 0, true},
		{"newordersperaccount", 3, false},
	} {
		if got := limiter.CatalogueProblem(tc.name, tc.enum); (got == "") != tc.ok {
			t.Errorf("CatalogueProblem(%q, %d) = %q; want ok %v", tc.name, tc.enum, got, tc.ok)
		}
	}
}
