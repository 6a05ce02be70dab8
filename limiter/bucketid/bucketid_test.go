package bucketid

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// collapseCase lists notations of one bucket id: each of them must
// canonicalise to want, and want to itself.
type collapseCase struct {
	format limiter.IDFormat
	want   string
	inputs []string
}

// rejectCase is an id its format refuses, with the message a client sees.
type rejectCase struct {
	format limiter.IDFormat
	in     string
	msg    string
}

func collapseCases() []collapseCase {
	return []collapseCase{
		// ip_address
		{limiter.IPAddress, "1.2.3.4", []string{"::ffff:1.2.3.4", "::FFFF:1.2.3.4", "::ffff:102:304", "0:0:0:0:0:ffff:0102:0304"}},
		{limiter.IPAddress, "2001:db8::ff00:42:8329", []string{"2001:0db8:0000:0000:0000:ff00:0042:8329", "2001:DB8::FF00:42:8329", "2001:db8:0:0:0:ff00:42:8329"}},
		{limiter.IPAddress, "::1", []string{"0:0:0:0:0:0:0:1", "::0001"}},
		// IPv4-compatible (not mapped) addresses are IPv6 and stay so.
		{limiter.IPAddress, "::102:304", []string{"::1.2.3.4"}},
		{limiter.IPAddress, "2001:db8::102:304", []string{"2001:db8::1.2.3.4"}},

		// ipv6_range
		{limiter.IPv6Range, "2001:db8::/48", []string{"2001:db8::", "2001:db8::1", "2001:DB8:0:FFFF:1:2:3:4", "2001:0db8:0000::/48", "2001:db8:0:1::/48", "2001:db8:0:ffff::1/48"}},
		{limiter.IPv6Range, "2001:db8:1::/48", []string{"2001:db8:1:2:3:4:5:6", "2001:db8:1:ffff::/48"}},
		{limiter.IPv6Range, "::/48", []string{"::1", "::1.2.3.4"}},

		// reg_id
		{limiter.RegID, "42", []string{"0042", "00000000000000000000042"}},
		{limiter.RegID, "1", []string{"01", "0000001"}},
		{limiter.RegID, "18446744073709551615", []string{"018446744073709551615"}},

		// domain
		{limiter.Domain, "www.example.com", []string{"WWW.Example.COM.", "www.example.com.", "Www.Example.Com"}},
		{limiter.Domain, "xn--bcher-kva.example", []string{"Bücher.Example", "BÜCHER.example.", "bücher.example", "XN--BCHER-KVA.EXAMPLE", "bücher。example", "ｂüｃｈｅｒ.example"}},
		{limiter.Domain, "xn--mnchen-3ya.de", []string{"München.DE"}},
		// Non-transitional processing: ß is kept, not mapped to "ss".
		{limiter.Domain, "xn--fa-hia.de", []string{"faß.de", "FAß.DE"}},
		{limiter.Domain, "123.example.com", []string{"123.EXAMPLE.COM."}},
		{limiter.Domain, "a-b.c-d.example", []string{"A-B.C-D.Example"}},
		{limiter.Domain, strings.Repeat("a", 63) + ".example", []string{strings.Repeat("A", 63) + ".example."}},
		{limiter.Domain, long253(), []string{strings.ToUpper(long253()) + "."}},

		// domain_or_cidr
		{limiter.DomainOrCIDR, "example.co.uk", []string{"www.example.co.uk", "WWW.EXAMPLE.CO.UK.", "a.b.example.co.uk"}},
		{limiter.DomainOrCIDR, "example.com", []string{"www.example.com", "Example.COM."}},
		{limiter.DomainOrCIDR, "xn--bcher-kva.example", []string{"www.Bücher.example"}},
		{limiter.DomainOrCIDR, "1.2.3.4/32", []string{"1.2.3.4", "::ffff:1.2.3.4"}},
		{limiter.DomainOrCIDR, "2001:db8:1:2::/64", []string{"2001:db8:1:2:3:4:5:6", "2001:DB8:1:2::", "2001:db8:1:2::1/64", "2001:0db8:0001:0002::/64"}},

		// ident_value
		{limiter.IdentValue, "www.example.com", []string{"WWW.EXAMPLE.COM."}},
		{limiter.IdentValue, "xn--bcher-kva.example", []string{"Bücher.example"}},
		{limiter.IdentValue, "1.2.3.4", []string{"::ffff:1.2.3.4"}},
		{limiter.IdentValue, "2001:db8::1", []string{"2001:0DB8::0001", "2001:db8:0:0:0:0:0:1"}},

		// fqdn_set
		{limiter.FQDNSet, "a.example.com,b.example.com", []string{"b.example.com,a.example.com", " B.Example.com , a.example.com. ", "a.example.com,b.example.com,A.EXAMPLE.COM"}},
		{limiter.FQDNSet, "1.2.3.4,2001:db8::1,example.com", []string{"example.com, 2001:0db8::1 ,::ffff:1.2.3.4"}},
		{limiter.FQDNSet, "example.com", []string{"Example.com,EXAMPLE.COM", "\texample.com\n"}},
		// Byte order: '-' sorts before '.'.
		{limiter.FQDNSet, "a-b.com,a.com", []string{"a.com,a-b.com"}},

		// reg_id_domain
		{limiter.RegIDDomain, "42:www.example.com", []string{"0042:WWW.Example.COM."}},
		{limiter.RegIDDomain, "1:xn--bcher-kva.example", []string{"01:Bücher.example"}},

		// reg_id_fqdn_set
		{limiter.RegIDFQDNSet, "42:2001:db8::1,example.com", []string{"0042:Example.com,2001:DB8::1", "42: example.com , 2001:db8:0::1", "42:example.com,2001:db8::1,example.com"}},
		{limiter.RegIDFQDNSet, "7:a.com", []string{"7:A.com"}},

		// string: never rewritten.
		{limiter.String, "Hello, World!", nil},
		{limiter.String, "  spaced  ", nil},
		{limiter.String, "user@Example.COM", nil},
		{limiter.String, "Bücher \uFFFD", nil},
		{limiter.String, strings.Repeat("é", 128), nil},
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
		{limiter.IPAddress, "1.2.3", notIP},
		{limiter.IPAddress, "01.2.3.4", notIP},
		{limiter.IPAddress, "256.1.1.1", notIP},
		{limiter.IPAddress, "[::1]", notIP},
		{limiter.IPAddress, " 1.2.3.4", notIP},
		{limiter.IPAddress, "1.2.3.4/32", notIP},
		{limiter.IPAddress, "example.com", notIP},
		{limiter.IPAddress, "fe80::1%eth0", zone},

		{limiter.IPv6Range, "1.2.3.4", v4},
		{limiter.IPv6Range, "::ffff:1.2.3.4", v4},
		{limiter.IPv6Range, "1.2.3.0/24", v4},
		{limiter.IPv6Range, "::ffff:1.2.3.0/120", v4},
		{limiter.IPv6Range, "2001:db8::/64", "IPv6 prefix must be /48"},
		{limiter.IPv6Range, "2001:db8::/32", "IPv6 prefix must be /48"},
		{limiter.IPv6Range, "2001:db8::/048", notV6},
		{limiter.IPv6Range, "2001:db8::/", notV6},
		{limiter.IPv6Range, "example.com", notV6},
		{limiter.IPv6Range, "fe80::1%eth0", zone},
		{limiter.IPv6Range, "fe80::1%eth0/48", zone},

		{limiter.RegID, "0", regID},
		{limiter.RegID, "000", regID},
		{limiter.RegID, "-1", regID},
		{limiter.RegID, "+1", regID},
		{limiter.RegID, " 42", regID},
		{limiter.RegID, "42 ", regID},
		{limiter.RegID, "4_2", regID},
		{limiter.RegID, "0x2a", regID},
		{limiter.RegID, "1e3", regID},
		{limiter.RegID, "٤٢", regID}, // Arabic-Indic digits
		{limiter.RegID, "18446744073709551616", "must be at most 18446744073709551615"},
		{limiter.RegID, "99999999999999999999999", "must be at most 18446744073709551615"},

		{limiter.Domain, "localhost", "must have at least two labels"},
		{limiter.Domain, "localhost.", "must have at least two labels"},
		{limiter.Domain, "*.example.com", "wildcards are not allowed"},
		{limiter.Domain, "*.bücher.example", "wildcards are not allowed"},
		{limiter.Domain, "a.*.example.com", "wildcards are not allowed"},
		{limiter.Domain, "a*.example.com", chars},
		{limiter.Domain, "a..example.com", "empty label"},
		{limiter.Domain, ".example.com", "empty label"},
		{limiter.Domain, "example.com..", "empty label"},
		{limiter.Domain, ".", "empty label"},
		{limiter.Domain, "-a.example.com", "label must not start or end with a hyphen"},
		{limiter.Domain, "a-.example.com", "label must not start or end with a hyphen"},
		{limiter.Domain, "a_b.example.com", chars},
		{limiter.Domain, "exa mple.com", chars},
		{limiter.Domain, "example.com/", chars},
		{limiter.Domain, "1.2.3.4", "an IP address is not a domain name"},
		{limiter.Domain, "2001:db8::1", "an IP address is not a domain name"},
		{limiter.Domain, "::ffff:1.2.3.4", "an IP address is not a domain name"},
		{limiter.Domain, "example.123", "top-level label must not be all digits"},
		{limiter.Domain, "127.1", "top-level label must not be all digits"},
		{limiter.Domain, strings.Repeat("a", 64) + ".example", "label longer than 63 bytes"},
		{limiter.Domain, "a" + long253(), "longer than 253 bytes"},
		{limiter.Domain, strings.Repeat("a.", 600) + "com", "longer than 253 bytes"},
		{limiter.Domain, "a\u200d.example", "not a valid internationalised domain name"},
		{limiter.Domain, "\xff.example", "not a valid internationalised domain name"},
		{limiter.Domain, "\uFFFD.example", "not a valid internationalised domain name"},
		{limiter.Domain, "_a.bücher.example", "not a valid internationalised domain name"},
		{limiter.Domain, "\u00ad.example", "empty label"}, // a soft hyphen maps to nothing
		{limiter.Domain, "\u00ad", "empty label"},
		// A-labels must round-trip: invalid Punycode, and the encoding of
		// "bu\u0308cher", which is not in normal form, would be buckets
		// apart from xn--bcher-kva.
		{limiter.Domain, "xn--bucher-xyd.example", "an xn-- label must be the canonical encoding of a name"},
		{limiter.Domain, "xn--zz.example", "an xn-- label must be the canonical encoding of a name"},
		{limiter.Domain, "XN--BUCHER-XYD.example", "an xn-- label must be the canonical encoding of a name"},
		{limiter.Domain, "www.xn--zz.bücher.example", "not a valid internationalised domain name"},
		{limiter.DomainOrCIDR, "xn--zz.example", "an xn-- label must be the canonical encoding of a name"},
		{limiter.FQDNSet, "a.example,xn--bucher-xyd.example", "element 2: an xn-- label must be the canonical encoding of a name"},

		{limiter.DomainOrCIDR, "co.uk", "a public suffix, not a registrable domain"},
		{limiter.DomainOrCIDR, "CO.UK.", "a public suffix, not a registrable domain"},
		{limiter.DomainOrCIDR, "com", "must have at least two labels"},
		{limiter.DomainOrCIDR, "1.2.3.0/24", "IPv4 prefix must be /32"},
		{limiter.DomainOrCIDR, "2001:db8::/48", "IPv6 prefix must be /64"},
		{limiter.DomainOrCIDR, "2001:db8::/128", "IPv6 prefix must be /64"},
		{limiter.DomainOrCIDR, "::ffff:1.2.3.4/128", "IPv4-mapped prefix: write the IPv4 address as a.b.c.d/32"},
		{limiter.DomainOrCIDR, "1.2.3.4/33", "not a DNS name, IP address or prefix"},
		{limiter.DomainOrCIDR, "example.com/32", "not a DNS name, IP address or prefix"},
		{limiter.DomainOrCIDR, "fe80::1%eth0", zone},

		{limiter.IdentValue, "1.2.3.256", notIP},
		{limiter.IdentValue, "01.2.3.4", notIP},
		{limiter.IdentValue, "2001:db8::g", "may contain only letters, digits, hyphens and dots"},
		{limiter.IdentValue, "2001:db8:::1", notIP},
		{limiter.IdentValue, "fe80::1%eth0", zone},
		{limiter.IdentValue, "*.example.com", "wildcards are not allowed"},
		{limiter.IdentValue, "localhost", "must have at least two labels"},

		{limiter.FQDNSet, "a.com,,b.com", "element 2 is empty"},
		{limiter.FQDNSet, "a.com,", "element 2 is empty"},
		{limiter.FQDNSet, " , ", "element 1 is empty"},
		{limiter.FQDNSet, "a.com,*.b.com", "element 2: wildcards are not allowed"},
		{limiter.FQDNSet, "a.com;b.com", "element 1: " + chars},
		{limiter.FQDNSet, "user@example.com", "element 1: " + chars},
		{limiter.FQDNSet, strings.Repeat("a.com,", 100) + "a.com", "more than 100 elements"},

		{limiter.RegIDDomain, "42", "must be <registration id>:<domain>"},
		{limiter.RegIDDomain, ":example.com", "registration id: " + regID},
		{limiter.RegIDDomain, "0:example.com", "registration id: " + regID},
		{limiter.RegIDDomain, "42:", "domain: must not be empty"},
		{limiter.RegIDDomain, "42:1.2.3.4", "domain: an IP address is not a domain name"},
		{limiter.RegIDDomain, "42:a:b", "domain: " + chars},

		{limiter.RegIDFQDNSet, "example.com", "must be <registration id>:<name set>"},
		{limiter.RegIDFQDNSet, "x:example.com", "registration id: " + regID},
		{limiter.RegIDFQDNSet, "42:", "name set: must not be empty"},
		{limiter.RegIDFQDNSet, "42:a.com,,b.com", "name set: element 2 is empty"},

		{limiter.String, strings.Repeat("a", 257), "longer than 256 bytes"},
		{limiter.String, strings.Repeat("é", 128) + "a", "longer than 256 bytes"},
		{limiter.String, "a\x00b", "must not contain control characters"},
		{limiter.String, "tab\there", "must not contain control characters"},
		{limiter.String, "line\n", "must not contain control characters"},
		{limiter.String, "\x7f", "must not contain control characters"},
		{limiter.String, "next\u0085line", "must not contain control characters"},
		{limiter.String, "\xff", "not valid UTF-8"},
		{limiter.String, "caf\xc3", "not valid UTF-8"},
	}
}

func TestCanonicalCollapses(t *testing.T) {
	for _, c := range collapseCases() {
		for _, in := range append([]string{c.want}, c.inputs...) {
			got, err := Canonical(c.format, in)
			if err != nil || got != c.want {
				t.Errorf("Canonical(%s, %q) = %q, %v; want %q", c.format, in, got, err, c.want)
			}
			if msg := shapeError(c.format, in, got); msg != "" {
				t.Errorf("Canonical(%s, %q) = %q: %s", c.format, in, got, msg)
			}
		}
	}
}

func TestCanonicalRejects(t *testing.T) {
	for _, c := range rejectCases() {
		got, err := Canonical(c.format, c.in)
		if err == nil {
			t.Errorf("Canonical(%s, %q) = %q; want error %q", c.format, c.in, got, c.msg)
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("Canonical(%s, %q) error = %q; want %q", c.format, c.in, err, c.msg)
		}
		if got != "" {
			t.Errorf("Canonical(%s, %q) returned %q with its error", c.format, c.in, got)
		}
	}
}

func TestCanonicalEmpty(t *testing.T) {
	for _, f := range limiter.IDFormats() {
		if _, err := Canonical(f, ""); err == nil || err.Error() != "must not be empty" {
			t.Errorf("Canonical(%s, \"\") error = %v; want must not be empty", f, err)
		}
	}
}

func TestCanonicalUnknownFormat(t *testing.T) {
	for _, f := range []limiter.IDFormat{"", "ipaddr", "IP_ADDRESS"} {
		_, err := Canonical(f, "1.2.3.4")
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
	got, err := Canonical(limiter.FQDNSet, strings.Join(names, ","))
	if err != nil {
		t.Fatalf("100 names: %v", err)
	}
	slices.Sort(names)
	if want := strings.Join(names, ","); got != want {
		t.Errorf("100 names: got %q, want %q", got, want)
	}
	if _, err := Canonical(limiter.FQDNSet, strings.Repeat("a.com,", 100)+"a.com"); err == nil {
		t.Errorf("101 copies of one name accepted")
	}
}

// Distinct buckets must stay distinct: canonicalisation that merges too much
// is as wrong as one that merges too little.
func TestCanonicalKeepsDistinct(t *testing.T) {
	for _, c := range []struct {
		format limiter.IDFormat
		a, b   string
	}{
		{limiter.String, "ABC", "abc"},
		{limiter.String, "a", "a "},
		{limiter.IPAddress, "1.2.3.4", "::1.2.3.4"},
		{limiter.IPv6Range, "2001:db8::", "2001:db8:1::"},
		{limiter.Domain, "www.example.com", "example.com"},
		{limiter.Domain, "strasse.de", "straße.de"},
		{limiter.DomainOrCIDR, "1.2.3.4", "1.2.3.5"},
		{limiter.DomainOrCIDR, "a.github.io", "b.github.io"}, // github.io is a (private) public suffix
		{limiter.FQDNSet, "a.com", "a.com,b.com"},
		{limiter.RegIDDomain, "1:a.com", "2:a.com"},
	} {
		ca, erra := Canonical(c.format, c.a)
		cb, errb := Canonical(c.format, c.b)
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
		format limiter.IDFormat
		in     string
	}{
		{limiter.FQDNSet, "alice.smith@example.com"},
		{limiter.RegIDFQDNSet, "1:alice.smith@example.com"},
		{limiter.String, "alice.smith\x00"},
		{limiter.Domain, "alice.smith@example.com"},
	} {
		_, err := Canonical(c.format, c.in)
		if err == nil {
			t.Errorf("Canonical(%s, %q) accepted", c.format, c.in)
			continue
		}
		if strings.Contains(err.Error(), "alice") {
			t.Errorf("%s.Canonical error %q echoes the id", c.format, err)
		}
	}
}

// Canonical runs on every decision; ids that are already canonical must come
// back as the very same string, with no allocation. Names with an A-label
// are the exception: checking that it round-trips decodes it.
func TestCanonicalNoAllocWhenCanonical(t *testing.T) {
	for _, c := range []struct {
		format limiter.IDFormat
		in     string
	}{
		{limiter.IPAddress, "192.0.2.1"},
		{limiter.IPAddress, "2001:db8::ff00:42:8329"},
		{limiter.IPv6Range, "2001:db8::/48"},
		{limiter.RegID, "12345678"},
		{limiter.RegID, "18446744073709551615"},
		{limiter.Domain, "www.example.com"},
		{limiter.Domain, long253()},
		{limiter.DomainOrCIDR, "192.0.2.1/32"},
		{limiter.IdentValue, "www.example.com"},
		{limiter.IdentValue, "192.0.2.1"},
		{limiter.RegIDDomain, "42:www.example.com"},
		{limiter.FQDNSet, "192.0.2.1,2001:db8::1,a.example.com,b.example.com"},
		{limiter.RegIDFQDNSet, "42:a.example.com,b.example.com"},
		{limiter.String, "user@example.com"},
	} {
		var got string
		var err error
		allocs := testing.AllocsPerRun(100, func() {
			got, err = Canonical(c.format, c.in)
		})
		if err != nil {
			t.Errorf("Canonical(%s, %q): %v", c.format, c.in, err)
			continue
		}
		if allocs != 0 {
			t.Errorf("Canonical(%s, %q) allocates %v times", c.format, c.in, allocs)
		}
		if unsafe.StringData(got) != unsafe.StringData(c.in) || len(got) != len(c.in) {
			t.Errorf("Canonical(%s, %q) returned a copy", c.format, c.in)
		}
	}
}

// Dropping leading zeros slices the id, so even that costs nothing.
func TestRegIDLeadingZerosNoAlloc(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if got, _ := Canonical(limiter.RegID, "0042"); got != "42" {
			t.Fatalf("got %q", got)
		}
	})
	if allocs != 0 {
		t.Errorf("allocates %v times", allocs)
	}
}

func BenchmarkCanonical(b *testing.B) {
	for _, c := range []struct {
		format           limiter.IDFormat
		canonical, other string
	}{
		{limiter.IPAddress, "192.0.2.1", "::ffff:192.0.2.1"},
		{limiter.IPv6Range, "2001:db8::/48", "2001:db8:0:1:2:3:4:5"},
		{limiter.RegID, "12345678", "0012345678"},
		{limiter.Domain, "www.example.com", "WWW.Example.COM."},
		{limiter.DomainOrCIDR, "example.co.uk", "www.example.co.uk"},
		{limiter.IdentValue, "www.example.com", "2001:0db8::1"},
		{limiter.FQDNSet, "a.example.com,b.example.com,c.example.com", "c.example.com, b.example.com, A.example.com"},
		{limiter.RegIDDomain, "42:www.example.com", "042:www.example.com."},
		{limiter.RegIDFQDNSet, "42:a.example.com,b.example.com", "42:b.example.com,a.example.com"},
		{limiter.String, "user@example.com", ""},
	} {
		b.Run(string(c.format)+"/canonical", func(b *testing.B) { benchCanonical(b, c.format, c.canonical) })
		if c.other != "" {
			b.Run(string(c.format)+"/other", func(b *testing.B) { benchCanonical(b, c.format, c.other) })
		}
	}
	b.Run("domain/idn", func(b *testing.B) { benchCanonical(b, limiter.Domain, "www.Bücher.example") })
}

func benchCanonical(b *testing.B, f limiter.IDFormat, id string) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(f, id); err != nil {
			b.Fatal(err)
		}
	}
}
