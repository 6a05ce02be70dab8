package clientip

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes(" 10.1.2.3/8, 192.168.1.7 ,, fd00::/8, ::ffff:172.16.0.0/108, ::ffff:172.16.0.9")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.7/32", "fd00::/8", "172.16.0.0/12", "172.16.0.9/32"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("prefix %d: got %s, want %s", i, got[i], want[i])
		}
	}
	if got, err := ParsePrefixes(""); err != nil || len(got) != 0 {
		t.Errorf(`"" gives %v, %v; want nothing trusted`, got, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "localhost", "fe80::1%eth0", "fe80::/10%eth0", "1.2.3.4:80", "10.0.0.0/8,nope"} {
		if _, err := ParsePrefixes(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestFrom(t *testing.T) {
	// The proxies of the test: loopback and 10.0.0.0/8.
	r := New(append([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Loopback...))
	many := strings.Repeat("127.0.0.1, ", 999) + "127.0.0.2"
	for _, c := range []struct {
		name   string
		remote string
		xff    []string
		real   []string
		want   string
		header string // of the error, when one is wanted
	}{
		{name: "untrusted peer, its headers ignored", remote: "203.0.113.9:4000", xff: []string{"1.1.1.1"}, real: []string{"2.2.2.2"}, want: "203.0.113.9"},
		{name: "untrusted peer, bad headers ignored too", remote: "203.0.113.9:4000", xff: []string{"nonsense"}, real: []string{"nonsense"}, want: "203.0.113.9"},
		{name: "trusted peer, no headers", remote: "127.0.0.1:4000", want: "127.0.0.1"},
		{name: "one hop", remote: "127.0.0.1:4000", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "spoofed entries left of the real client", remote: "127.0.0.1:4000", xff: []string{"6.6.6.6, 7.7.7.7, 198.51.100.7"}, want: "198.51.100.7"},
		{name: "trusted hops skipped", remote: "127.0.0.1:4000", xff: []string{"198.51.100.7, 10.0.0.3,10.9.9.9"}, want: "198.51.100.7"},
		{name: "several lines read as one list", remote: "127.0.0.1:4000", xff: []string{"6.6.6.6, 198.51.100.7", "10.0.0.3"}, want: "198.51.100.7"},
		{name: "all trusted: the leftmost", remote: "127.0.0.1:4000", xff: []string{"10.0.0.9, 10.0.0.3"}, want: "10.0.0.9"},
		{name: "a thousand trusted entries", remote: "127.0.0.1:4000", xff: []string{many}, want: "127.0.0.1"},
		{name: "X-Forwarded-For wins over X-Real-IP", remote: "127.0.0.1:4000", xff: []string{"198.51.100.7"}, real: []string{"2.2.2.2"}, want: "198.51.100.7"},
		{name: "X-Real-IP from a trusted peer", remote: "127.0.0.1:4000", real: []string{" 198.51.100.8 "}, want: "198.51.100.8"},
		{name: "blank X-Forwarded-For is absent", remote: "127.0.0.1:4000", xff: []string{"  "}, real: []string{"198.51.100.8"}, want: "198.51.100.8"},
		{name: "IPv4 in IPv6 unmapped", remote: "127.0.0.1:4000", xff: []string{"::ffff:198.51.100.7"}, want: "198.51.100.7"},
		{name: "mapped peer is trusted as IPv4", remote: "[::ffff:127.0.0.1]:4000", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "mapped trusted hop skipped", remote: "127.0.0.1:4000", xff: []string{"198.51.100.7, ::ffff:10.0.0.3"}, want: "198.51.100.7"},
		{name: "IPv6 with a zone", remote: "127.0.0.1:4000", xff: []string{"fe80::1%eth0"}, want: "fe80::1"},
		{name: "IPv6 peer", remote: "[2001:db8::1]:4000", want: "2001:db8::1"},
		{name: "IPv6 peer with a zone", remote: "[fe80::1%eth0]:4000", want: "fe80::1"},
		{name: "ports in entries", remote: "127.0.0.1:4000", xff: []string{"[2001:db8::7]:443, 10.0.0.3:80"}, want: "2001:db8::7"},
		{name: "bracketed IPv6 without a port", remote: "127.0.0.1:4000", xff: []string{"[2001:db8::7]"}, want: "2001:db8::7"},
		{name: "bare peer address", remote: "203.0.113.9", want: "203.0.113.9"},
		{name: "garbage left of the client is never read", remote: "127.0.0.1:4000", xff: []string{"\x00\xff, , 198.51.100.7"}, want: "198.51.100.7"},

		{name: "garbage where the client should be", remote: "127.0.0.1:4000", xff: []string{"nonsense, 10.0.0.3"}, header: HeaderForwardedFor},
		{name: "NUL", remote: "127.0.0.1:4000", xff: []string{"1.2.3.4\x00"}, header: HeaderForwardedFor},
		{name: "invalid UTF-8", remote: "127.0.0.1:4000", xff: []string{"\xff\xfe"}, header: HeaderForwardedFor},
		{name: "empty entry reached", remote: "127.0.0.1:4000", xff: []string{"198.51.100.7, , 10.0.0.3"}, header: HeaderForwardedFor},
		{name: "port out of range", remote: "127.0.0.1:4000", xff: []string{"1.2.3.4:99999"}, header: HeaderForwardedFor},
		{name: "host name", remote: "127.0.0.1:4000", xff: []string{"example.com"}, header: HeaderForwardedFor},
		{name: "X-Real-IP not an address", remote: "127.0.0.1:4000", real: []string{"nope"}, header: HeaderRealIP},
		{name: "X-Real-IP twice", remote: "127.0.0.1:4000", real: []string{"1.1.1.1", "2.2.2.2"}, header: HeaderRealIP},
		{name: "no peer", remote: "", header: "RemoteAddr"},
		{name: "peer not an address", remote: "pipe", header: "RemoteAddr"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range c.xff {
				h.Add(HeaderForwardedFor, v)
			}
			for _, v := range c.real {
				h.Add(HeaderRealIP, v)
			}
			got, err := r.From(c.remote, h)
			if c.header != "" {
				var e *Error
				if !errors.As(err, &e) || e.Header != c.header {
					t.Fatalf("got %v, %v; want an error naming %s", got, err, c.header)
				}
				if got.IsValid() {
					t.Errorf("an address, %v, beside the error", got)
				}
				return
			}
			if err != nil || got.String() != c.want {
				t.Fatalf("got %v, %v; want %s", got, err, c.want)
			}
		})
	}
}

func TestZeroTrustsNobody(t *testing.T) {
	var r Resolver
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "127.0.0.1:1"
	req.Header.Set(HeaderForwardedFor, "198.51.100.7")
	if got, err := r.Request(req); err != nil || got.String() != "127.0.0.1" {
		t.Fatalf("got %v, %v; want the peer", got, err)
	}
}

// FuzzFrom checks that no header makes the resolver panic or return an
// address beside an error, that an untrusted peer is always the answer
// for itself, and that an answer is always unmapped and without a zone.
func FuzzFrom(f *testing.F) {
	f.Add("127.0.0.1:1", "198.51.100.7, 10.0.0.1", "")
	f.Add("203.0.113.9:1", "1.1.1.1", "2.2.2.2")
	f.Add("[::1]:1", "[fe80::1%eth0]:80,::ffff:1.2.3.4", "x")
	f.Add("127.0.0.1:1", "", "::ffff:10.0.0.1")
	r := New(append([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Loopback...))
	f.Fuzz(func(t *testing.T, remote, xff, real string) {
		h := http.Header{}
		if xff != "" {
			h.Set(HeaderForwardedFor, xff)
		}
		if real != "" {
			h.Set(HeaderRealIP, real)
		}
		got, err := r.From(remote, h)
		if err != nil {
			if got.IsValid() {
				t.Fatalf("%v beside %v", got, err)
			}
			return
		}
		if got.Is4In6() || got.Zone() != "" {
			t.Fatalf("%v is mapped or zoned", got)
		}
		if peer, ok := parse(remote); ok && !r.Trusted(peer) && got != peer {
			t.Fatalf("untrusted peer %v, answer %v", peer, got)
		}
	})
}

func BenchmarkFrom(b *testing.B) {
	r := New(Loopback)
	h := http.Header{HeaderForwardedFor: []string{"6.6.6.6, 198.51.100.7"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.From("127.0.0.1:4000", h); err != nil {
			b.Fatal(err)
		}
	}
}
