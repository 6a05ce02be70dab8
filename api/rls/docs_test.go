package rls_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"
)

// validator is what every generated Envoy message has.
type validator interface {
	proto.Message
	ValidateAll() error
}

// TestDocsEnvoyYAML parses the envoy.yaml of docs/envoy.md into Envoy's
// bootstrap proto and validates it, with every typed_config it holds, so
// that the example cannot rot.
func TestDocsEnvoyYAML(t *testing.T) {
	md, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(md), "\n## envoy.yaml\n")
	if !ok {
		t.Fatal("docs/envoy.md has no section envoy.yaml")
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("the section envoy.yaml has no yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	var tree any
	if err := yaml.Unmarshal([]byte(block), &tree); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		t.Fatalf("not a bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("invalid bootstrap: %v", err)
	}
	// Validation stops at each Any: open and check them one by one.
	var seen []string
	check := func(m validator) {
		t.Helper()
		if err := m.ValidateAll(); err != nil {
			t.Errorf("%T: %v", m, err)
		}
		seen = append(seen, string(m.ProtoReflect().Descriptor().FullName()))
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				check(&hcm)
				for _, hf := range hcm.GetHttpFilters() {
					switch hf.GetName() {
					case "envoy.filters.http.ratelimit":
						var rl ratelimitv3.RateLimit
						if err := hf.GetTypedConfig().UnmarshalTo(&rl); err != nil {
							t.Fatal(err)
						}
						check(&rl)
						if rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "ratelimitd" {
							t.Errorf("the filter asks cluster %v", rl.GetRateLimitService())
						}
					case "envoy.filters.http.router":
						var r routerv3.Router
						if err := hf.GetTypedConfig().UnmarshalTo(&r); err != nil {
							t.Fatal(err)
						}
						check(&r)
					}
				}
			}
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, opts := range c.GetTypedExtensionProtocolOptions() {
			var po upstreamhttpv3.HttpProtocolOptions
			if err := opts.UnmarshalTo(&po); err != nil {
				t.Fatal(err)
			}
			check(&po)
		}
	}
	want := []string{
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"envoy.extensions.filters.http.ratelimit.v3.RateLimit",
		"envoy.extensions.filters.http.router.v3.Router",
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
	}
	if strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("checked %v, want %v", seen, want)
	}
}
