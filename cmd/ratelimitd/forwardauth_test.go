package main

import (
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestForwardAuthNeverLogsAToken: a token in the query string of a
// forward-auth call, however it is named, is refused with a 400 that does
// not repeat it, and neither the service's log (at debug level, where
// refused requests are logged) nor its HTTP server's error log holds it;
// a token in the gateway's header works.
func TestForwardAuthNeverLogsAToken(t *testing.T) {
	const admin, leaked = "rlt_bootstrap_admin_secret", "rlt_leaked_in_a_query_string"
	s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": admin, "RATELIMIT_LOG_LEVEL": "debug"})
	s.waitReady(t)
	for _, query := range []string{
		"d=remote_address&access_token=" + leaked,
		"d=remote_address&token=" + leaked,
		"d=k=" + leaked,
		"d=remote_address&Authorization=Bearer%20" + leaked,
		"d=remote_address&x=Bearer+" + leaked,
	} {
		for _, token := range []string{admin, "", "wrong"} {
			req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/forward-auth/web?"+query, nil)
			if token != "" {
				req.Header.Set("X-Ratelimit-Authorization", "Bearer "+token)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusBadRequest || strings.Contains(string(body), leaked) {
				t.Errorf("%s with token %q: %d %s", query, token, res.StatusCode, body)
			}
		}
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/forward-auth/web?d=remote_address", nil)
	req.Header.Set("X-Ratelimit-Authorization", "Bearer "+admin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a good call: %d", res.StatusCode)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if log := s.stderr.String(); strings.Contains(log, leaked) || strings.Contains(log, "access_token") {
		t.Errorf("the log holds the token or its query:\n%s", log)
	}
}

// TestTrustedProxies: RATELIMIT_TRUSTED_PROXIES takes CIDRs and addresses,
// empty trusts nobody, and a bad entry is a configuration error naming
// it.
func TestTrustedProxies(t *testing.T) {
	for _, good := range []string{"", "10.0.0.0/8, 192.168.1.7", "fd00::/8"} {
		if _, _, err := loadConfig(flag.NewFlagSet("serve", flag.ContinueOnError), nil, getenv(map[string]string{"RATELIMIT_TRUSTED_PROXIES": good})); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	c, _, err := loadConfig(flag.NewFlagSet("serve", flag.ContinueOnError), nil, getenv(map[string]string{}))
	if err != nil || len(c.TrustedProxies) != 2 || c.TrustedProxies[0].String() != "127.0.0.0/8" {
		t.Errorf("the default: %v, %v", c.TrustedProxies, err)
	}
	if c, _, _ := loadConfig(flag.NewFlagSet("serve", flag.ContinueOnError), nil, getenv(map[string]string{"RATELIMIT_TRUSTED_PROXIES": ""})); len(c.TrustedProxies) != 0 {
		t.Errorf("empty trusts %v", c.TrustedProxies)
	}
	_, _, err = loadConfig(flag.NewFlagSet("serve", flag.ContinueOnError), nil, getenv(map[string]string{"RATELIMIT_TRUSTED_PROXIES": "10.0.0.0/8, localhost"}))
	if err == nil || !strings.Contains(err.Error(), "RATELIMIT_TRUSTED_PROXIES") || !strings.Contains(err.Error(), "localhost") {
		t.Errorf("a host name: %v", err)
	}
}
