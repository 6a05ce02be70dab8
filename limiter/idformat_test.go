package limiter

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// collapseCase lists notations of one bucket id: each of them must
// canonicalise to want, and want to itself.
type collapseCase struct {
	format IDFormat
	want   string
	inputs []string
}

// rejectCase is an id its format refuses, with the message a client sees.
type rejectCase struct {
	format IDFormat
	in     string
	msg    string
}

func collapseCases() []collapseCase {
	return []collapseCase{
		// ip_address
		{IPAddress, "1.2.3.4", []string{"::ffff:1.2.3.4", "::FFFF:1.2.3.4", "::ffff:102:304", "0:0:0:0:0:ffff:0102:0304"}},
		{IPAddress, "2001:db8::ff00:42:8329", []string{"2001:0db8:0000:0000:0000:ff00:0042:8329", "2001:DB8::FF00:42:8329", "2001:db8:0:0:0:ff00:42:8329"}},
		{IPAddress, "::1", []string{"0:0:0:0:0:0:0:1", "::0001"}},
		// IPv4-compatible (not mapped) addresses are IPv6 and stay so.
		{IPAddress, "::102:304", []string{"::1.2.3.4"}},
		{IPAddress, "2001:db8::102:304", []string{"2001:db8::1.2.3.4"}},

		// ipv6_range
		{IPv6Range, "2001:db8::/48", []string{"2001:db8::", "2001:db8::1", "2001:DB8:0:FFFF:1:2:3:4", "2001:0db8:0000::/48", "2001:db8:0:1::/48", "2001:db8:0:ffff::1/48"}},
		{IPv6Range, "2001:db8:1::/48", []string{"2001:db8:1:2:3:4:5:6", "2001:db8:1:ffff::/48"}},
		{IPv6Range, "::/48", []string{"::1", "::1.2.3.4"}},

		// reg_id
		{RegID, "42", []string{"0042", "00000000000000000000042"}},
		{RegID, "1", []string{"01", "0000001"}},
		{RegID, "18446744073709551615", []string{"018446744073709551615"}},

		// domain
		{Domain, "www.example.com", []string{"WWW.Example.COM.", "www.example.com.", "Www.Example.Com"}},
		{Domain, "xn--bcher-kva.example", []string{"Bücher.Example", "BÜCHER.example.", "bücher.example", "XN--BCHER-KVA.EXAMPLE", "bücher。example", "ｂüｃｈｅｒ.example"}},
		{Domain, "xn--mnchen-3ya.de", []string{"München.DE"}},
		// Non-transitional processing: ß is kept, not mapped to "ss".
		{Domain, "xn--fa-hia.de", []string{"faß.de", "FAß.DE"}},
		{Domain, "123.example.com", []string{"123.EXAMPLE.COM."}},
		{Domain, "a-b.c-d.example", []string{"A-B.C-D.Example"}},
		{Domain, strings.Repeat("a", 63) + ".example", []string{strings.Repeat("A", 63) + ".example."}},
		{Domain, long253(), []string{strings.ToUpper(long253()) + "."}},

		// domain_or_cidr
		{DomainOrCIDR, "example.co.uk", []string{"www.example.co.uk", "WWW.EXAMPLE.CO.UK.", "a.b.example.co.uk"}},
		{DomainOrCIDR, "example.com", []string{"www.example.com", "Example.COM."}},
		{DomainOrCIDR, "xn--bcher-kva.example", []string{"www.Bücher.example"}},
		{DomainOrCIDR, "1.2.3.4/32", []string{"1.2.3.4", "::ffff:1.2.3.4"}},
		{DomainOrCIDR, "2001:db8:1:2::/64", []string{"2001:db8:1:2:3:4:5:6", "2001:DB8:1:2::", "2001:db8:1:2::1/64", "2001:0db8:0001:0002::/64"}},

		// ident_value
		{IdentValue, "www.example.com", []string{"WWW.EXAMPLE.COM."}},
		{IdentValue, "xn--bcher-kva.example", []string{"Bücher.example"}},
		{IdentValue, "1.2.3.4", []string{"::ffff:1.2.3.4"}},
		{IdentValue, "2001:db8::1", []string{"2001:0DB8::0001", "2001:db8:0:0:0:0:0:1"}},

		// fqdn_set
		{FQDNSet, "a.example.com,b.example.com", []string{"b.example.com,a.example.com", " B.Example.com , a.example.com. ", "a.example.com,b.example.com,A.EXAMPLE.COM"}},
		{FQDNSet, "1.2.3.4,2001:db8::1,example.com", []string{"example.com, 2001:0db8::1 ,::ffff:1.2.3.4"}},
		{FQDNSet, "example.com", []string{"Example.com,EXAMPLE.COM", "\texample.com\n"}},
		// Byte order: '-' sorts before '.'.
		{FQDNSet, "a-b.com,a.com", []string{"a.com,a-b.com"}},

		// reg_id_domain
		{RegIDDomain, "42:www.example.com", []string{"0042:WWW.Example.COM."}},
		{RegIDDomain, "1:xn--bcher-kva.example", []string{"01:Bücher.example"}},

		// reg_id_fqdn_set
		{RegIDFQDNSet, "42:2001:db8::1,example.com", []string{"0042:Example.com,2001:DB8::1", "42: example.com , 2001:db8:0::1", "42:example.com,2001:db8::1,example.com"}},
		{RegIDFQDNSet, "7:a.com", []string{"7:A.com"}},

		// string: never rewritten.
		{String, "Hello, World!", nil},
		{String, "  spaced  ", nil},
		{String, "user@Example.COM", nil},
		{String, "Bücher \uFFFD", nil},
		{String, strings.Repeat("é", 128), nil},
	}
}

// long253 is a name of exactly the maximum length.
func long253() string {
	label := strings.Repeat("a", 63)
	return label + "." + label + "." + label + "." + strings.Repeat("b", 61)
}

func rejectCases() []rejectCase {
	const notIP = "not an IP address"
	const zone = "IP address must not have a zone"
	const notV6 = "not an IPv6 address or prefix"
	const v4 = "must be IPv6, not IPv4"
	const regID = "must be a positive decimal integer"
	const chars = "may contain only letters, digits, hyphens and dots"
	return []rejectCase{
		{IPAddress, "1.2.3", notIP},
		{IPAddress, "01.2.3.4", notIP},
		{IPAddress, "256.1.1.1", notIP},
		{IPAddress, "[::1]", notIP},
		{IPAddress, " 1.2.3.4", notIP},
		{IPAddress, "1.2.3.4/32", notIP},
		{IPAddress, "example.com", notIP},
		{IPAddress, "fe80::1%eth0", zone},

		{IPv6Range, "1.2.3.4", v4},
		{IPv6Range, "::ffff:1.2.3.4", v4},
		{IPv6Range, "1.2.3.0/24", v4},
		{IPv6Range, "::ffff:1.2.3.0/120", v4},
		{IPv6Range, "2001:db8::/64", "IPv6 prefix must be /48"},
		{IPv6Range, "2001:db8::/32", "IPv6 prefix must be /48"},
		{IPv6Range, "2001:db8::/048", notV6},
		{IPv6Range, "2001:db8::/", notV6},
		{IPv6Range, "example.com", notV6},
		{IPv6Range, "fe80::1%eth0", zone},
		{IPv6Range, "fe80::1%eth0/48", zone},

		{RegID, "0", regID},
		{RegID, "000", regID},
		{RegID, "-1", regID},
		{RegID, "+1", regID},
		{RegID, " 42", regID},
		{RegID, "42 ", regID},
		{RegID, "4_2", regID},
		{RegID, "0x2a", regID},
		{RegID, "1e3", regID},
		{RegID, "٤٢", regID}, // Arabic-Indic digits
		{RegID, "18446744073709551616", "must be at most 18446744073709551615"},
		{RegID, "99999999999999999999999", "must be at most 18446744073709551615"},

		{Domain, "localhost", "must have at least two labels"},
		{Domain, "localhost.", "must have at least two labels"},
		{Domain, "*.example.com", "wildcards are not allowed"},
		{Domain, "*.bücher.example", "wildcards are not allowed"},
		{Domain, "a.*.example.com", "wildcards are not allowed"},
		{Domain, "a*.example.com", chars},
		{Domain, "a..example.com", "empty label"},
		{Domain, ".example.com", "empty label"},
		{Domain, "example.com..", "empty label"},
		{Domain, ".", "empty label"},
		{Domain, "-a.example.com", "label must not start or end with a hyphen"},
		{Domain, "a-.example.com", "label must not start or end with a hyphen"},
		{Domain, "a_b.example.com", chars},
		{Domain, "exa mple.com", chars},
		{Domain, "example.com/", chars},
		{Domain, "1.2.3.4", "an IP address is not a domain name"},
		{Domain, "2001:db8::1", "an IP address is not a domain name"},
		{Domain, "::ffff:1.2.3.4", "an IP address is not a domain name"},
		{Domain, "example.123", "top-level label must not be all digits"},
		{Domain, "127.1", "top-level label must not be all digits"},
		{Domain, strings.Repeat("a", 64) + ".example", "label longer than 63 bytes"},
		{Domain, "a" + long253(), "longer than 253 bytes"},
		{Domain, strings.Repeat("a.", 600) + "com", "longer than 253 bytes"},
		{Domain, "a\u200d.example", "not a valid internationalised domain name"},
		{Domain, "\xff.example", "not a valid internationalised domain name"},
		{Domain, "\uFFFD.example", "not a valid internationalised domain name"},
		{Domain, "_a.bücher.example", "not a valid internationalised domain name"},
		{Domain, "\u00ad.example", "empty label"}, // a soft hyphen maps to nothing
		{Domain, "\u00ad", "empty label"},
		// A-labels must round-trip: invalid Punycode, and the encoding of
		// "bu\u0308cher", which is not in normal form, would be buckets
		// apart from xn--bcher-kva.
		{Domain, "xn--bucher-xyd.example", "an xn-- label must be the canonical encoding of a name"},
		{Domain, "xn--zz.example", "an xn-- label must be the canonical encoding of a name"},
		{Domain, "XN--BUCHER-XYD.example", "an xn-- label must be the canonical encoding of a name"},
		{Domain, "www.xn--zz.bücher.example", "not a valid internationalised domain name"},
		{DomainOrCIDR, "xn--zz.example", "an xn-- label must be the canonical encoding of a name"},
		{FQDNSet, "a.example,xn--bucher-xyd.example", "element 2: an xn-- label must be the canonical encoding of a name"},

		{DomainOrCIDR, "co.uk", "a public suffix, not a registrable domain"},
		{DomainOrCIDR, "CO.UK.", "a public suffix, not a registrable domain"},
		{DomainOrCIDR, "com", "must have at least two labels"},
		{DomainOrCIDR, "1.2.3.0/24", "IPv4 prefix must be /32"},
		{DomainOrCIDR, "2001:db8::/48", "IPv6 prefix must be /64"},
		{DomainOrCIDR, "2001:db8::/128", "IPv6 prefix must be /64"},
		{DomainOrCIDR, "::ffff:1.2.3.4/128", "IPv4-mapped prefix: write the IPv4 address as a.b.c.d/32"},
		{DomainOrCIDR, "1.2.3.4/33", "not a DNS name, IP address or prefix"},
		{DomainOrCIDR, "example.com/32", "not a DNS name, IP address or prefix"},
		{DomainOrCIDR, "fe80::1%eth0", zone},

		{IdentValue, "1.2.3.256", notIP},
		{IdentValue, "01.2.3.4", notIP},
		{IdentValue, "2001:db8::g", "may contain only letters, digits, hyphens and dots"},
		{IdentValue, "2001:db8:::1", notIP},
		{IdentValue, "fe80::1%eth0", zone},
		{IdentValue, "*.example.com", "wildcards are not allowed"},
		{IdentValue, "localhost", "must have at least two labels"},

		{FQDNSet, "a.com,,b.com", "element 2 is empty"},
		{FQDNSet, "a.com,", "element 2 is empty"},
		{FQDNSet, " , ", "element 1 is empty"},
		{FQDNSet, "a.com,*.b.com", "element 2: wildcards are not allowed"},
		{FQDNSet, "a.com;b.com", "element 1: " + chars},
		{FQDNSet, "user@example.com", "element 1: " + chars},
		{FQDNSet, strings.Repeat("a.com,", 100) + "a.com", "more than 100 elements"},

		{RegIDDomain, "42", "must be <registration id>:<domain>"},
		{RegIDDomain, ":example.com", "registration id: " + regID},
		{RegIDDomain, "0:example.com", "registration id: " + regID},
		{RegIDDomain, "42:", "domain: must not be empty"},
		{RegIDDomain, "42:1.2.3.4", "domain: an IP address is not a domain name"},
		{RegIDDomain, "42:a:b", "domain: " + chars},

		{RegIDFQDNSet, "example.com", "must be <registration id>:<name set>"},
		{RegIDFQDNSet, "x:example.com", "registration id: " + regID},
		{RegIDFQDNSet, "42:", "name set: must not be empty"},
		{RegIDFQDNSet, "42:a.com,,b.com", "name set: element 2 is empty"},

		{String, strings.Repeat("a", 257), "longer than 256 bytes"},
		{String, strings.Repeat("é", 128) + "a", "longer than 256 bytes"},
		{String, "a\x00b", "must not contain control characters"},
		{String, "tab\there", "must not contain control characters"},
		{String, "line\n", "must not contain control characters"},
		{String, "\x7f", "must not contain control characters"},
		{String, "next\u0085line", "must not contain control characters"},
		{String, "\xff", "not valid UTF-8"},
		{String, "caf\xc3", "not valid UTF-8"},
	}
}

func TestCanonicalCollapses(t *testing.T) {
	for _, c := range collapseCases() {
		for _, in := range append([]string{c.want}, c.inputs...) {
			got, err := c.format.Canonical(in)
			if err != nil || got != c.want {
				t.Errorf("%s.Canonical(%q) = %q, %v; want %q", c.format, in, got, err, c.want)
			}
			if msg := shapeError(c.format, in, got); msg != "" {
				t.Errorf("%s.Canonical(%q) = %q: %s", c.format, in, got, msg)
			}
		}
	}
}

func TestCanonicalRejects(t *testing.T) {
	for _, c := range rejectCases() {
		got, err := c.format.Canonical(c.in)
		if err == nil {
			t.Errorf("%s.Canonical(%q) = %q; want error %q", c.format, c.in, got, c.msg)
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("%s.Canonical(%q) error = %q; want %q", c.format, c.in, err, c.msg)
		}
		if got != "" {
			t.Errorf("%s.Canonical(%q) returned %q with its error", c.format, c.in, got)
		}
	}
}

func TestCanonicalEmpty(t *testing.T) {
	for _, f := range IDFormats() {
		if _, err := f.Canonical(""); err == nil || err.Error() != "must not be empty" {
			t.Errorf("%s.Canonical(\"\") error = %v; want must not be empty", f, err)
		}
	}
}

func TestCanonicalUnknownFormat(t *testing.T) {
	for _, f := range []IDFormat{"", "ipaddr", "IP_ADDRESS"} {
		_, err := f.Canonical("1.2.3.4")
		if want := "unknown id format " + strconv.Quote(string(f)); err == nil || err.Error() != want {
			t.Errorf("%q.Canonical error = %v; want %s", f, err, want)
		}
	}
}

// The set limit counts elements as written, before duplicates collapse, so
// that a request cannot make the server canonicalise unbounded lists.
func TestFQDNSetSize(t *testing.T) {
	names := make([]string, 100)
	for i := range names {
		names[i] = "n" + strconv.Itoa(i) + ".example"
	}
	got, err := FQDNSet.Canonical(strings.Join(names, ","))
	if err != nil {
		t.Fatalf("100 names: %v", err)
	}
	slices.Sort(names)
	if want := strings.Join(names, ","); got != want {
		t.Errorf("100 names: got %q, want %q", got, want)
	}
	if _, err := FQDNSet.Canonical(strings.Repeat("a.com,", 100) + "a.com"); err == nil {
		t.Errorf("101 copies of one name accepted")
	}
}

// Distinct buckets must stay distinct: canonicalisation that merges too much
// is as wrong as one that merges too little.
func TestCanonicalKeepsDistinct(t *testing.T) {
	for _, c := range []struct {
		format IDFormat
		a, b   string
	}{
		{String, "ABC", "abc"},
		{String, "a", "a "},
		{IPAddress, "1.2.3.4", "::1.2.3.4"},
		{IPv6Range, "2001:db8::", "2001:db8:1::"},
		{Domain, "www.example.com", "example.com"},
		{Domain, "strasse.de", "straße.de"},
		{DomainOrCIDR, "1.2.3.4", "1.2.3.5"},
		{DomainOrCIDR, "a.github.io", "b.github.io"}, // github.io is a (private) public suffix
		{FQDNSet, "a.com", "a.com,b.com"},
		{RegIDDomain, "1:a.com", "2:a.com"},
	} {
		ca, erra := c.format.Canonical(c.a)
		cb, errb := c.format.Canonical(c.b)
		if erra != nil || errb != nil {
			t.Errorf("%s: %q: %v, %q: %v", c.format, c.a, erra, c.b, errb)
			continue
		}
		if ca == cb {
			t.Errorf("%s: %q and %q both canonicalise to %q", c.format, c.a, c.b, ca)
		}
	}
}

// Error messages are shown to clients and logged; sets and strings may hold
// personal data, so the id itself must not appear in them.
func TestCanonicalErrorsDoNotEchoID(t *testing.T) {
	for _, c := range []struct {
		format IDFormat
		in     string
	}{
		{FQDNSet, "alice.smith@example.com"},
		{RegIDFQDNSet, "1:alice.smith@example.com"},
		{String, "alice.smith\x00"},
		{Domain, "alice.smith@example.com"},
	} {
		_, err := c.format.Canonical(c.in)
		if err == nil {
			t.Errorf("%s.Canonical(%q) accepted", c.format, c.in)
			continue
		}
		if strings.Contains(err.Error(), "alice") {
			t.Errorf("%s.Canonical error %q echoes the id", c.format, err)
		}
	}
}

func TestIDFormats(t *testing.T) {
	want := []IDFormat{"ip_address", "ipv6_range", "reg_id", "domain", "domain_or_cidr",
		"ident_value", "fqdn_set", "reg_id_domain", "reg_id_fqdn_set", "string"}
	got := IDFormats()
	if !slices.Equal(got, want) {
		t.Fatalf("IDFormats() = %v; want %v", got, want)
	}
	got[0] = "changed"
	if IDFormats()[0] != IPAddress {
		t.Errorf("IDFormats shares its slice with callers")
	}
	for _, f := range want {
		if !f.Valid() {
			t.Errorf("%s.Valid() = false", f)
		}
	}
	for _, f := range []IDFormat{"", "ip", "IP_ADDRESS", "string "} {
		if f.Valid() {
			t.Errorf("%q.Valid() = true", f)
		}
	}
}

func TestHashed(t *testing.T) {
	hashed := map[IDFormat]bool{String: true, FQDNSet: true, RegIDFQDNSet: true}
	for _, f := range IDFormats() {
		if f.Hashed() != hashed[f] {
			t.Errorf("%s.Hashed() = %v; want %v", f, f.Hashed(), hashed[f])
		}
	}
	if IDFormat("bogus").Hashed() {
		t.Errorf("an unknown format claims to be hashed")
	}
}

// Canonical runs on every decision; ids that are already canonical must come
// back as the very same string, with no allocation. Names with an A-label
// are the exception: checking that it round-trips decodes it.
func TestCanonicalNoAllocWhenCanonical(t *testing.T) {
	for _, c := range []struct {
		format IDFormat
		in     string
	}{
		{IPAddress, "192.0.2.1"},
		{IPAddress, "2001:db8::ff00:42:8329"},
		{IPv6Range, "2001:db8::/48"},
		{RegID, "12345678"},
		{RegID, "18446744073709551615"},
		{Domain, "www.example.com"},
		{Domain, long253()},
		{DomainOrCIDR, "192.0.2.1/32"},
		{IdentValue, "www.example.com"},
		{IdentValue, "192.0.2.1"},
		{RegIDDomain, "42:www.example.com"},
		{FQDNSet, "192.0.2.1,2001:db8::1,a.example.com,b.example.com"},
		{RegIDFQDNSet, "42:a.example.com,b.example.com"},
		{String, "user@example.com"},
	} {
		var got string
		var err error
		allocs := testing.AllocsPerRun(100, func() {
			got, err = c.format.Canonical(c.in)
		})
		if err != nil {
			t.Errorf("%s.Canonical(%q): %v", c.format, c.in, err)
			continue
		}
		if allocs != 0 {
			t.Errorf("%s.Canonical(%q) allocates %v times", c.format, c.in, allocs)
		}
		if unsafe.StringData(got) != unsafe.StringData(c.in) || len(got) != len(c.in) {
			t.Errorf("%s.Canonical(%q) returned a copy", c.format, c.in)
		}
	}
}

// Dropping leading zeros slices the id, so even that costs nothing.
func TestRegIDLeadingZerosNoAlloc(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if got, _ := RegID.Canonical("0042"); got != "42" {
			t.Fatalf("got %q", got)
		}
	})
	if allocs != 0 {
		t.Errorf("allocates %v times", allocs)
	}
}

func BenchmarkCanonical(b *testing.B) {
	for _, c := range []struct {
		format           IDFormat
		canonical, other string
	}{
		{IPAddress, "192.0.2.1", "::ffff:192.0.2.1"},
		{IPv6Range, "2001:db8::/48", "2001:db8:0:1:2:3:4:5"},
		{RegID, "12345678", "0012345678"},
		{Domain, "www.example.com", "WWW.Example.COM."},
		{DomainOrCIDR, "example.co.uk", "www.example.co.uk"},
		{IdentValue, "www.example.com", "2001:0db8::1"},
		{FQDNSet, "a.example.com,b.example.com,c.example.com", "c.example.com, b.example.com, A.example.com"},
		{RegIDDomain, "42:www.example.com", "042:www.example.com."},
		{RegIDFQDNSet, "42:a.example.com,b.example.com", "42:b.example.com,a.example.com"},
		{String, "user@example.com", ""},
	} {
		b.Run(string(c.format)+"/canonical", func(b *testing.B) { benchCanonical(b, c.format, c.canonical) })
		if c.other != "" {
			b.Run(string(c.format)+"/other", func(b *testing.B) { benchCanonical(b, c.format, c.other) })
		}
	}
	b.Run("domain/idn", func(b *testing.B) { benchCanonical(b, Domain, "www.Bücher.example") })
}

func benchCanonical(b *testing.B, f IDFormat, id string) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.Canonical(id); err != nil {
			b.Fatal(err)
		}
	}
}
