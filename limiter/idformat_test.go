package limiter_test

import (
	"slices"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestIDFormats(t *testing.T) {
	want := []limiter.IDFormat{"ip_address", "ipv6_range", "reg_id", "domain", "domain_or_cidr",
		"ident_value", "fqdn_set", "reg_id_domain", "reg_id_fqdn_set", "string"}
	got := limiter.IDFormats()
	if !slices.Equal(got, want) {
		t.Fatalf("IDFormats() = %v; want %v", got, want)
	}
	got[0] = "changed"
	if limiter.IDFormats()[0] != limiter.IPAddress {
		t.Errorf("IDFormats shares its slice with callers")
	}
	for _, f := range want {
		if !f.Valid() {
			t.Errorf("%s.Valid() = false", f)
		}
	}
	for _, f := range []limiter.IDFormat{"", "ip", "IP_ADDRESS", "string "} {
		if f.Valid() {
			t.Errorf("%q.Valid() = true", f)
		}
	}
}

func TestHashed(t *testing.T) {
	hashed := map[limiter.IDFormat]bool{limiter.String: true, limiter.FQDNSet: true, limiter.RegIDFQDNSet: true}
	for _, f := range limiter.IDFormats() {
		if f.Hashed() != hashed[f] {
			t.Errorf("%s.Hashed() = %v; want %v", f, f.Hashed(), hashed[f])
		}
	}
	if limiter.IDFormat("bogus").Hashed() {
		t.Errorf("an unknown format claims to be hashed")
	}
}

func TestAccountWide(t *testing.T) {
	wide := map[limiter.IDFormat]bool{limiter.RegIDDomain: true, limiter.RegIDFQDNSet: true}
	for _, f := range limiter.IDFormats() {
		if f.AccountWide() != wide[f] {
			t.Errorf("%s.AccountWide() = %v; want %v", f, f.AccountWide(), wide[f])
		}
	}
}
