//go:build linux

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// traefikConfig is the part of Traefik's dynamic configuration that
// deploy/gateways/traefik/ratelimitd.yaml uses; reading the file strictly
// into it fails on any other field.
type traefikConfig struct {
	HTTP struct {
		Routers map[string]struct {
			EntryPoints []string `yaml:"entryPoints"`
			Rule        string   `yaml:"rule"`
			Middlewares []string `yaml:"middlewares"`
			Service     string   `yaml:"service"`
		} `yaml:"routers"`
		Middlewares map[string]struct {
			Headers *struct {
				CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
			} `yaml:"headers"`
			ForwardAuth *struct {
				Address             string   `yaml:"address"`
				TrustForwardHeader  bool     `yaml:"trustForwardHeader"`
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
		} `yaml:"middlewares"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
	} `yaml:"http"`
}

// TestTraefikRequestShape checks Traefik's configuration without a
// Traefik, which Debian does not package: it fills the file in as
// Traefik's file provider does (Go templating, env), reads it strictly,
// and plays its router's middlewares on client requests as Traefik's
// documentation says they act: the headers middlewares set and delete
// request headers; ForwardAuth sends ratelimitd a GET with the request's
// headers and X-Forwarded-Method, -Proto, -Host, -Uri and -For (the
// client's address appended to what the entry point kept), answers the
// client with ratelimitd's answer when it is not 2xx, and else copies its
// authResponseHeaders onto the request. Against the real route, a client
// is allowed with RateLimit headers for the application and denied with
// ratelimitd's 429, and the token reaches neither the client nor the
// application.
func TestTraefikRequestShape(t *testing.T) {
	t.Parallel()
	svc := newService(t, "ratelimitd", options{})
	admin := svc.admin()
	token := createToken(t, admin, "traefik", client.ScopeDecide)
	env := map[string]string{"UPSTREAM_ADDR": "127.0.0.1:9", "RATELIMITD_ADDR": svc.addr, "RATELIMITD_TOKEN": token}
	cfg := readTraefikConfig(t, env)

	router, ok := cfg.HTTP.Routers["app"]
	if !ok || router.Service != "app" || !slices.Equal(router.EntryPoints, []string{"web"}) {
		t.Fatalf("the router app: %+v", router)
	}
	if got := cfg.HTTP.Services["app"].LoadBalancer.Servers; len(got) != 1 || got[0].URL != "http://127.0.0.1:9" {
		t.Errorf("the service app's servers: %+v", got)
	}

	tag := testenv.RandomName("traefik-")
	limit := testenv.RandomName("gw_")
	putLimit(t, admin, limit, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(2)), Count: ptr(int64(1)), Period: ptr("1h")})
	value := tag + "-*"
	if res, err := admin.CreateRuleWithResponse(bg, client.RuleCreate{Domain: "web", Descriptor: []client.DescriptorEntry{{Key: "api_key", Value: &value}}, Limit: limit}); err != nil || res.JSON201 == nil {
		t.Fatalf("POST /v1/rules: %s", describe(res, err))
	}

	request := func() *http.Request {
		req, err := http.NewRequest(http.MethodPost, "http://app.example/"+tag+"?page=1", strings.NewReader("a body ForwardAuth does not send"))
		if err != nil {
			t.Fatal(err)
		}
		req.RemoteAddr = "198.51.100.7:40000"
		req.Header.Set("X-Api-Key", tag+"-a")
		req.Header.Set("Authorization", "Bearer the-client's-own")
		req.Header.Set("X-Ratelimit-Authorization", "Bearer rlt_from_the_client")
		req.Header.Set("X-Ratelimit-Degraded", "true")
		req.Header.Set("X-Original-Uri", "/not/"+tag)
		return req
	}
	for i := range 3 {
		req := request()
		answer := playTraefikRouter(t, cfg, router.Middlewares, req)
		if strings.Contains(fmt.Sprint(answer.header), token) || strings.Contains(answer.body, token) {
			t.Errorf("the client's answer carries the token: %v %q", answer.header, answer.body)
		}
		if i < 2 {
			if answer.status != 0 {
				t.Fatalf("request %d: the client got %d %v %q, want it passed to the application", i, answer.status, answer.header, answer.body)
			}
			if strings.Contains(fmt.Sprint(req.Header), token) || req.Header.Get("X-Ratelimit-Authorization") != "" {
				t.Errorf("request %d for the application carries a token: %v", i, req.Header)
			}
			if req.Header.Get("RateLimit") == "" || req.Header.Get("RateLimit-Policy") == "" ||
				req.Header.Get("Authorization") != "Bearer the-client's-own" ||
				req.Header.Get("X-Original-Uri") != "" || req.Header.Get("X-Ratelimit-Degraded") != "" {
				t.Errorf("request %d for the application: %v, want ratelimitd's RateLimit headers, the client's Authorization, and no X-Original-Uri or X-Ratelimit-Degraded", i, req.Header)
			}
			continue
		}
		answer.wantDenied(t)
	}
}

// readTraefikConfig fills the configuration in from env with Go's
// templating and the env function, as Traefik's file provider does, and
// reads it.
func readTraefikConfig(t *testing.T, env map[string]string) traefikConfig {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(gatewaysDir, "traefik", "ratelimitd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, error) {
		v, ok := env[k]
		if !ok {
			return "", fmt.Errorf("%s is not among the variables docs/gateways.md lists", k)
		}
		return v, nil
	}
	tmpl, err := template.New("ratelimitd.yaml").Funcs(template.FuncMap{"env": lookup}).Parse(string(text))
	if err != nil {
		t.Fatalf("ratelimitd.yaml as a template: %v", err)
	}
	var filled bytes.Buffer
	if err := tmpl.Execute(&filled, nil); err != nil {
		t.Fatalf("filling ratelimitd.yaml in: %v", err)
	}
	var cfg traefikConfig
	dec := yaml.NewDecoder(&filled)
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("reading ratelimitd.yaml: %v", err)
	}
	return cfg
}

// playTraefikRouter runs req through the named middlewares of cfg and
// returns the client's answer when one of them answered it (status 0 when
// the request went on to the application, with req changed as it would
// reach it).
func playTraefikRouter(t *testing.T, cfg traefikConfig, names []string, req *http.Request) reply {
	t.Helper()
	for _, name := range names {
		mw, ok := cfg.HTTP.Middlewares[name]
		if !ok {
			t.Fatalf("the router names the middleware %s, which is not defined", name)
		}
		switch {
		case mw.Headers != nil:
			for k, v := range mw.Headers.CustomRequestHeaders {
				if v == "" {
					req.Header.Del(k)
				} else {
					req.Header.Set(k, v)
				}
			}
		case mw.ForwardAuth != nil:
			if answer, done := playForwardAuth(t, mw.ForwardAuth.Address, mw.ForwardAuth.AuthResponseHeaders, req); done {
				return answer
			}
		default:
			t.Fatalf("the middleware %s is of no kind this test knows", name)
		}
	}
	return reply{}
}

// playForwardAuth asks address as Traefik's ForwardAuth does (with
// trustForwardHeader, behind an entry point that removed the client's own
// X-Forwarded-* headers) and reports whether ratelimitd's answer went to
// the client.
func playForwardAuth(t *testing.T, address string, copied []string, req *http.Request) (reply, bool) {
	t.Helper()
	auth, err := http.NewRequest(http.MethodGet, address, nil)
	if err != nil {
		t.Fatalf("the forwardAuth address %q: %v", address, err)
	}
	auth.Header = req.Header.Clone()
	client, _, _ := strings.Cut(req.RemoteAddr, ":")
	auth.Header.Set("X-Forwarded-For", client)
	auth.Header.Set("X-Forwarded-Method", req.Method)
	auth.Header.Set("X-Forwarded-Proto", "http")
	auth.Header.Set("X-Forwarded-Host", req.Host)
	auth.Header.Set("X-Forwarded-Uri", req.URL.RequestURI())
	res, err := http.DefaultClient.Do(auth)
	if err != nil {
		t.Fatalf("GET %s: %v", address, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return reply{status: res.StatusCode, header: res.Header, body: string(body)}, true
	}
	for _, k := range copied {
		req.Header.Del(k)
		if v := res.Header.Values(k); len(v) > 0 {
			req.Header[http.CanonicalHeaderKey(k)] = v
		}
	}
	return reply{}, false
}
