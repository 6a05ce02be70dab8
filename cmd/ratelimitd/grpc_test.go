package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

var grpcListening = regexp.MustCompile(`Envoy rate limit service listening on (grpcs?)://(\S+)`)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ratelimitd test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// grpcAddr waits for the gRPC listener's line and returns its scheme and
// address.
func (s *service) grpcAddr(t *testing.T) (string, string) {
	t.Helper()
	var m []string
	s.waitFor(t, func() bool {
		m = grpcListening.FindStringSubmatch(s.stdout.String())
		return m != nil
	})
	return m[1], m[2]
}

// TestServeGRPC: Envoy's rate limit service over TLS with a token, its
// health, and a graceful stop with the HTTP server.
func TestServeGRPC(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	s := startServe(t, map[string]string{
		"RATELIMIT_BOOTSTRAP_TOKEN": "boot-secret",
		"RATELIMIT_GRPC_TLS_CERT":   certFile,
		"RATELIMIT_GRPC_TLS_KEY":    keyFile,
	})
	s.waitReady(t)
	scheme, addr := s.grpcAddr(t)
	if scheme != "grpcs" {
		t.Fatalf("scheme %s with a certificate", scheme)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Serving from the moment /readyz answers 200, not a poll later.
	hc := healthpb.NewHealthClient(conn)
	if res, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health right after /readyz answered 200: %v, %v", res.GetStatus(), err)
	}
	for _, call := range []struct{ method, path, body string }{
		{"PUT", "/v1/limits/PerUser", `{"id_format":"string","burst":1,"count":1,"period":"1m"}`},
		{"POST", "/v1/rules", `{"domain":"edge","descriptor":[{"key":"user"}],"limit":"PerUser"}`},
	} {
		if code, body := s.call(t, call.method, call.path, "boot-secret", call.body); code != http.StatusCreated {
			t.Fatalf("%s %s: %d %s", call.method, call.path, code, body)
		}
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer boot-secret")
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*extv3.RateLimitDescriptor{
		{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}}
	var codes []rlsv3.RateLimitResponse_Code
	for range 2 {
		res, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, res.GetOverallCode())
	}
	if codes[0] != rlsv3.RateLimitResponse_OK || codes[1] != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("two calls against a burst of 1: %v", codes)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := client.ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("the gRPC listener answers after the stop")
	}
}

// TestServeGRPCWithoutAuth warns that anyone who reaches the listener may
// spend tokens.
func TestServeGRPCWithoutAuth(t *testing.T) {
	s := startServe(t, map[string]string{"RATELIMIT_GRPC_AUTH": "none"})
	s.waitReady(t)
	scheme, addr := s.grpcAddr(t)
	if scheme != "grpc" {
		t.Fatalf("scheme %s without a certificate", scheme)
	}
	if !strings.Contains(s.stderr.String(), "RATELIMIT_GRPC_AUTH=none") {
		t.Errorf("no warning in the log:\n%s", s.stderr.String())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "edge", Descriptors: []*extv3.RateLimitDescriptor{{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}},
	})
	if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a call without a token: %v, %v", res, err)
	}
}

// TestServeGRPCResponseHeadersOff: -grpc-response-headers=off leaves
// response_headers_to_add empty, as envoyproxy/ratelimit does unless asked;
// the default fills it.
func TestServeGRPCResponseHeadersOff(t *testing.T) {
	for _, setting := range []string{"on", "off"} {
		s := startServe(t, map[string]string{"RATELIMIT_BOOTSTRAP_TOKEN": "boot-secret", "RATELIMIT_GRPC_RESPONSE_HEADERS": setting})
		s.waitReady(t)
		_, addr := s.grpcAddr(t)
		for _, call := range []struct{ method, path, body string }{
			{"PUT", "/v1/limits/PerUser", `{"id_format":"string","burst":5,"count":5,"period":"1m"}`},
			{"POST", "/v1/rules", `{"domain":"edge","descriptor":[{"key":"user"}],"limit":"PerUser"}`},
		} {
			if code, body := s.call(t, call.method, call.path, "boot-secret", call.body); code != http.StatusCreated {
				t.Fatalf("%s %s: %d %s", call.method, call.path, code, body)
			}
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer boot-secret")
		res, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "edge", Descriptors: []*extv3.RateLimitDescriptor{{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}},
		})
		conn.Close()
		if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v", setting, res, err)
		}
		if got := len(res.GetResponseHeadersToAdd()); (got > 0) != (setting == "on") {
			t.Errorf("RATELIMIT_GRPC_RESPONSE_HEADERS=%s: headers %v", setting, res.GetResponseHeadersToAdd())
		}
	}
}

// TestGRPCConfiguration refuses bad gRPC settings, and turns the listener
// off with an empty address.
func TestGRPCConfiguration(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RATELIMIT_GRPC_AUTH": "maybe"}, "RATELIMIT_GRPC_AUTH: want token or none"},
		{map[string]string{"RATELIMIT_GRPC_ADDR": "nowhere"}, "RATELIMIT_GRPC_ADDR: want host:port or empty"},
		{map[string]string{"RATELIMIT_GRPC_TLS_CERT": "cert.pem"}, "RATELIMIT_GRPC_TLS_CERT: give both"},
		{map[string]string{"RATELIMIT_GRPC_RESPONSE_HEADERS": "yes"}, `RATELIMIT_GRPC_RESPONSE_HEADERS: want on or off, got "yes"`},
	} {
		var out, errOut strings.Builder
		err := run(context.Background(), []string{"serve"}, getenv(tc.env), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
	s := startServe(t, map[string]string{"RATELIMIT_GRPC_ADDR": ""})
	s.waitReady(t)
	if strings.Contains(s.stdout.String(), "Envoy rate limit service listening") {
		t.Errorf("a gRPC listener with an empty address:\n%s", s.stdout.String())
	}
}

// TestImportEnvoyCommand imports an Envoy configuration from the command
// line, refuses a bad one with its line, and exports the domain again.
func TestImportEnvoyCommand(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"RATELIMIT_DATABASE_URL": "sqlite:" + filepath.Join(dir, "rl.db")}
	file := filepath.Join(dir, "config.yaml")
	write := func(doc string) {
		if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	runCmd := func(args ...string) (string, string, error) {
		var out, errOut strings.Builder
		err := run(context.Background(), args, getenv(env), &out, &errOut)
		return out.String(), errOut.String(), err
	}
	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n")
	if out, log, err := runCmd("import", "-kind", "envoy", "-create", file); err != nil || !strings.Contains(out, "imported: 2 created") {
		t.Fatalf("import: %q, %v\n%s", out, err, log)
	}
	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 60\n")
	if _, stderr, err := runCmd("import", "-kind", "envoy", file); err == nil || !strings.Contains(stderr, "line 5: api user: rate_limit.unit: must be one of") {
		t.Fatalf("a bad file: %v\n%s", err, stderr)
	}
	out, _, err := runCmd("export", "-kind", "envoy", "-domain", "api")
	if err != nil || !strings.Contains(out, "name: api.user") || !strings.Contains(out, "requests_per_unit: 60") {
		t.Fatalf("export: %q, %v", out, err)
	}
	if _, _, err := runCmd("export", "-kind", "envoy"); err == nil {
		t.Fatal("an Envoy export without a domain")
	}
	// A file without the rule, and with a setting that only gets a note:
	// both are printed.
	write("domain: api\ndescriptors:\n  - key: path\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n")
	out, log, err := runCmd("import", "-kind", "envoy", "-dry-run", file)
	if err != nil || !strings.Contains(out, "unchanged, 1 removed") || !strings.Contains(out, "removed rule ") ||
		!strings.Contains(out, "domain api, user -> limit api.user") || !strings.Contains(out, "note: line 4 (api path): detailed_metric is accepted") {
		t.Fatalf("import: %q, %v\n%s", out, err, log)
	}
}
