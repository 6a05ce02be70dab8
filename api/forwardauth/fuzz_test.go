package forwardauth

import (
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

func fuzzSnapshot(t testing.TB) *limiter.Snapshot {
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	for _, l := range []limiter.Limit{
		{Name: "PerIP", Enum: 1, IDFormat: limiter.IPAddress, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "PerText", Enum: 2, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
	} {
		if err := b.PutLimit(l); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range []limiter.Rule{
		{Domain: "web", Descriptor: []limiter.DescriptorEntry{{Key: "remote_address"}}, Limit: "PerIP"},
		{Domain: "web", Descriptor: []limiter.DescriptorEntry{{Key: "path"}}, Limit: "PerText"},
		{Domain: "web", Descriptor: []limiter.DescriptorEntry{{Key: "method"}, {Key: "host"}}, Limit: "PerText"},
		{Domain: "web", Descriptor: []limiter.DescriptorEntry{{Key: "api_key"}, {Key: "path", Value: "/a*"}}, Limit: "PerText"},
		{Domain: "web", Descriptor: []limiter.DescriptorEntry{{Key: "api_key", Value: "rlt_x"}}, Limit: "PerText"},
	} {
		r.ID = string(rune('A' + i))
		if err := b.PutRule(r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Snapshot(1)
}

// FuzzCall feeds the reading of a forward-auth call arbitrary query
// strings and headers: it never panics; a call is either refused with a
// 400 or a 422 that names a parameter or header, or it makes at most one
// descriptor per d, each matched to a rule or to none; a path is in its
// normal form, which normalising again does not change.
func FuzzCall(f *testing.F) {
	f.Add("d=remote_address&d=path", "/a/../b?x", "GET", "shop.example", "198.51.100.7, 127.0.0.1", "k1", "127.0.0.1:1")
	f.Add("d=header:X-Api-Key:api_key,path&deny_status=403", "//a/./%62", "POST", "", "", "k", "203.0.113.9:1")
	f.Add("d=method,host&d=k=v", "http://h/p", "G\x00T", "A,B", "nonsense", "", "[::1]:1")
	f.Add("d=&d=,&d=%zz&token=x", "%", "", "\xff", ",", "\x00", "127.0.0.1:1")
	f.Add("d=path", "/%00", "GET", "h", "::ffff:1.2.3.4", "rlt_x", "127.0.0.1:1")
	snap := fuzzSnapshot(f)
	clients := clientip.New(clientip.Loopback)
	f.Fuzz(func(t *testing.T, query, uri, method, host, xff, key, peer string) {
		if tokenInQuery(query) {
			return
		}
		p, err := parsePlan(query)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		r := &http.Request{Header: http.Header{}, Host: host, RemoteAddr: peer, URL: &url.URL{RawQuery: query}}
		for h, v := range map[string]string{"X-Forwarded-Uri": uri, "X-Forwarded-Method": method, "X-Forwarded-For": xff, "X-Api-Key": key} {
			if v != "" {
				r.Header.Set(h, v)
			}
		}
		var sc scratch
		a := attributes{r: r, clients: clients}
		err = sc.fill(snap, "web", p, &a)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if sc.batch.Len() > len(p.descriptors) || len(sc.made) != sc.batch.Len() {
			t.Fatalf("%d descriptors made of %d d, %d marked", sc.batch.Len(), len(p.descriptors), len(sc.made))
		}
		if a.read[fromPath] {
			if again, msg := normalizePath(a.path); msg != "" || again != a.path {
				t.Fatalf("%q normalises to %q, then to %q (%s)", uri, a.path, again, msg)
			}
		}
	})
}

// checkRefusal fails t unless err is a 400, or a 422 naming what is wrong.
func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var pe *problem.Error
	if !errors.As(err, &pe) {
		t.Fatalf("%v (%T) is no problem", err, err)
	}
	switch {
	case pe.Status == http.StatusBadRequest:
	case pe.Status == http.StatusUnprocessableEntity && len(pe.Fields) > 0 && pe.Fields[0].Field != "":
	default:
		t.Fatalf("refused with %d %+v", pe.Status, pe)
	}
}

// TestNormalizePath: the normal forms, and what is refused.
func TestNormalizePath(t *testing.T) {
	for in, want := range map[string]string{
		"/": "/", "/a": "/a", "/a/": "/a/", "//a//b": "/a/b", "/a/./b": "/a/b", "/a/../b": "/b", "/../../b": "/b",
		"/a/..": "/", "/a/b/..": "/a/", "/%41%2f%62": "/A/b", "/a?b=/../c": "/a", "HTTPS://x.example:1/p/../q": "/q",
		"http://x.example": "/", "/caf%C3%A9": "/café", "/.": "/", "/a/.%2E/b": "/b",
	} {
		if got, msg := normalizePath(in); got != want || msg != "" {
			t.Errorf("%q: %q (%s), want %q", in, got, msg, want)
		}
	}
	for _, bad := range []string{"a", "", "/%", "/%4", "/%zz", "/%00", "/\x00", "/%ff", "/\x7f", "*"} {
		if got, msg := normalizePath(bad); msg == "" {
			t.Errorf("%q: accepted as %q", bad, got)
		}
	}
}
