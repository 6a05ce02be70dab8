package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

const (
	// chart is the chart's directory, relative to this package.
	chart = "helm/ratelimitd"
	// kubeVersion is the Kubernetes version the chart is rendered for and
	// validated against: the newest whose schemas kubectl-validate v0.0.4
	// carries in its binary, so that validation needs no network.
	kubeVersion = "1.30"
	// operatorModule ships the CustomResourceDefinition of ServiceMonitor,
	// the one kind of the chart that is not built into Kubernetes.
	operatorModule    = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	serviceMonitorCRD = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
)

// object is one rendered Kubernetes object, as YAML decodes it.
type object = map[string]any

// tool returns the path of a command the chart's tests need, or ends the
// test: a skip on a developer's machine, a failure in CI.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Unavailable(t, name+" (.ci/run installs it)", err)
	}
	return p
}

// helmTemplate renders the chart with the release name "rl" and the extra
// arguments (values files, --set), and returns what helm printed and
// whether it failed.
func helmTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helm := tool(t, "helm")
	cmd := exec.Command(helm, append([]string{"template", "rl", chart, "--namespace", "rl", "--kube-version", kubeVersion}, args...)...)
	// No repository configuration or cache of the developer's leaks in.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String(), err
	}
	return stdout.String(), nil
}

// render renders the chart, validates every document against the
// Kubernetes schemas, and returns the objects by kind.
func render(t *testing.T, args ...string) map[string]object {
	t.Helper()
	out, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	if msg, err := validate(t, out); err != nil {
		t.Fatalf("the chart rendered with %v is not valid: %v\n%s\nmanifests:\n%s", args, err, msg, out)
	}
	byKind := map[string]object{}
	for _, o := range decode(t, out) {
		kind, _ := o["kind"].(string)
		if _, dup := byKind[kind]; dup {
			t.Fatalf("two objects of kind %s", kind)
		}
		byKind[kind] = o
	}
	return byKind
}

// decode splits a YAML stream into its objects.
func decode(t *testing.T, manifests string) []object {
	t.Helper()
	var objs []object
	dec := yaml.NewDecoder(strings.NewReader(manifests))
	for {
		var o object
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decoding the rendered chart: %v\n%s", err, manifests)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
}

// validate checks manifests with kubectl-validate against the built-in
// schemas of kubeVersion and the ServiceMonitor CRD. A kind with no
// schema is an error, as is a field a schema does not know. It returns
// the validator's report and its failure.
func validate(t *testing.T, manifests string) (string, error) {
	t.Helper()
	validator := tool(t, "kubectl-validate")
	dir := t.TempDir()
	file := filepath.Join(dir, "manifests.yaml")
	if err := os.WriteFile(file, []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	// An empty kubeconfig: the validator asks a reachable cluster for its
	// schemas before its own, and a developer's cluster must not decide.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(validator, file, "--version", kubeVersion, "--local-crds", crdDir(t), "--output", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// crdDir returns a directory holding the ServiceMonitor CRD, taken from
// the Prometheus Operator's module through the Go module proxy and cache.
func crdDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", operatorModule).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = errors.New(strings.TrimSpace(string(exit.Stderr)) + string(out))
		}
		testenv.Unavailable(t, operatorModule, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s: %v\n%s", operatorModule, err, out)
	}
	crd, err := os.ReadFile(filepath.Join(mod.Dir, serviceMonitorCRD))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(serviceMonitorCRD)), crd, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// at follows a path of map keys and list indexes through an object and
// fails the test where it leads nowhere.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for i, step := range path {
		switch s := step.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok || m[s] == nil {
				t.Fatalf("no %v in %v", path[:i+1], v)
			}
			v = m[s]
		case int:
			l, ok := v.([]any)
			if !ok || s >= len(l) {
				t.Fatalf("no %v in %v", path[:i+1], v)
			}
			v = l[s]
		}
	}
	return v
}

// named returns the element of a list of objects whose name is name, or
// nil.
func named(list any, name string) map[string]any {
	l, _ := list.([]any)
	for _, e := range l {
		if m, ok := e.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// container returns the Deployment's one container.
func container(t *testing.T, deployment object) map[string]any {
	t.Helper()
	cs := at(t, deployment, "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

// envVar returns the container's variable name, failing when it is absent.
func envVar(t *testing.T, c map[string]any, name string) map[string]any {
	t.Helper()
	e := named(c["env"], name)
	if e == nil {
		t.Fatalf("no %s in the container's env %v", name, c["env"])
	}
	return e
}

// secretRef returns the Secret name and key a variable is read from.
func secretRef(t *testing.T, c map[string]any, name string) (string, string) {
	t.Helper()
	ref := at(t, envVar(t, c, name), "valueFrom", "secretKeyRef").(map[string]any)
	return ref["name"].(string), ref["key"].(string)
}

// kinds lists the kinds rendered, sorted.
func kinds(objs map[string]object) []string {
	var ks []string
	for k := range objs {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestChartDefaults renders the chart as installed without values: one
// pod on SQLite, the ports, probes and security settings the service
// needs in a cluster.
func TestChartDefaults(t *testing.T) {
	objs := render(t)
	if got, want := kinds(objs), []string{"Deployment", "PodDisruptionBudget", "Service"}; !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	dep := objs["Deployment"]
	c := container(t, dep)

	ports := map[string]any{}
	for _, p := range at(t, c, "ports").([]any) {
		ports[p.(map[string]any)["name"].(string)] = p.(map[string]any)["containerPort"]
	}
	if ports["http"] != 8080 || ports["grpc-rls"] != 8081 {
		t.Errorf("container ports %v, want http 8080 and grpc-rls 8081", ports)
	}
	svcPort := named(at(t, objs["Service"], "spec", "ports"), "grpc-rls")
	if svcPort == nil || svcPort["port"] != 8081 || svcPort["targetPort"] != "grpc-rls" {
		t.Errorf("Service port grpc-rls: %v, want 8081 to the container's grpc-rls", svcPort)
	}
	for name, want := range map[string]string{
		"RATELIMIT_HTTP_ADDR":    "0.0.0.0:8080",
		"RATELIMIT_GRPC_ADDR":    "0.0.0.0:8081",
		"RATELIMIT_DATABASE_URL": "sqlite:/data/ratelimitd.db",
		"RATELIMIT_FAIL_MODE":    "open",
		"RATELIMIT_GRPC_AUTH":    "token",
	} {
		if got := envVar(t, c, name)["value"]; got != want {
			t.Errorf("%s = %v, want %q", name, got, want)
		}
	}
	for _, name := range []string{"RATELIMIT_REDIS_URL", "RATELIMIT_BOOTSTRAP_TOKEN"} {
		if named(c["env"], name) != nil {
			t.Errorf("%s is set without a value for it", name)
		}
	}

	if got := at(t, c, "livenessProbe", "httpGet", "path"); got != "/healthz" {
		t.Errorf("liveness probe path %v, want /healthz", got)
	}
	if got := at(t, c, "readinessProbe", "httpGet", "path"); got != "/readyz" {
		t.Errorf("readiness probe path %v, want /readyz", got)
	}
	if got := at(t, c, "readinessProbe", "httpGet", "port"); got != "http" {
		t.Errorf("readiness probe port %v, want http", got)
	}
	if got := at(t, c, "startupProbe", "grpc", "port"); got != ports["grpc-rls"] {
		t.Errorf("gRPC startup probe on port %v, want grpc-rls's %v", got, ports["grpc-rls"])
	}

	if at(t, dep, "spec", "template", "spec", "securityContext", "runAsNonRoot") != true ||
		at(t, c, "securityContext", "readOnlyRootFilesystem") != true {
		t.Error("the pod may run as root or write its root filesystem")
	}
	mount := named(at(t, c, "volumeMounts"), "data")
	vol := named(at(t, dep, "spec", "template", "spec", "volumes"), "data")
	if mount == nil || mount["mountPath"] != "/data" || vol == nil || vol["emptyDir"] == nil {
		t.Errorf("SQLite has no writable /data: mount %v, volume %v", mount, vol)
	}

	pdb := objs["PodDisruptionBudget"]
	if got := at(t, pdb, "spec", "maxUnavailable"); got != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", got)
	}
	podLabels := at(t, dep, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range at(t, pdb, "spec", "selector", "matchLabels").(map[string]any) {
		if podLabels[k] != v {
			t.Errorf("the PodDisruptionBudget selects %s=%v, which the pods do not carry", k, v)
		}
	}
}

// TestChartEveryOption turns every option on: replicas on Postgres and
// Redis, URLs from values and from existing Secrets, the bootstrap token
// from a Secret, a ServiceMonitor, and minAvailable.
func TestChartEveryOption(t *testing.T) {
	objs := render(t, "--values", "testdata/every-option.yaml")
	if got, want := kinds(objs), []string{"Deployment", "PodDisruptionBudget", "Secret", "Service", "ServiceMonitor"}; !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	dep := objs["Deployment"]
	c := container(t, dep)
	if got := at(t, dep, "spec", "replicas"); got != 3 {
		t.Errorf("replicas %v, want 3", got)
	}
	secret := objs["Secret"]
	secretName := at(t, secret, "metadata", "name")
	if got := at(t, secret, "stringData", "redis-url"); got != "redis://:pw@redis.rl.svc:6379/0" {
		t.Errorf("the chart's Secret holds redis-url %v", got)
	}
	if data := at(t, secret, "stringData").(map[string]any); len(data) != 1 {
		t.Errorf("the chart's Secret holds %v, want the Redis URL only", data)
	}
	for _, tc := range []struct{ env, secret, key string }{
		{"RATELIMIT_DATABASE_URL", "ratelimitd-postgres", "url"},
		{"RATELIMIT_REDIS_URL", secretName.(string), "redis-url"},
		{"RATELIMIT_BOOTSTRAP_TOKEN", "ratelimitd-admin", "token"},
	} {
		if name, key := secretRef(t, c, tc.env); name != tc.secret || key != tc.key {
			t.Errorf("%s from Secret %s key %s, want %s key %s", tc.env, name, key, tc.secret, tc.key)
		}
	}
	for name, want := range map[string]string{"RATELIMIT_FAIL_MODE": "closed", "RATELIMIT_LOG_LEVEL": "debug"} {
		if got := envVar(t, c, name)["value"]; got != want {
			t.Errorf("%s = %v, want %q", name, got, want)
		}
	}
	if c["volumeMounts"] != nil {
		t.Errorf("a /data volume on Postgres: %v", c["volumeMounts"])
	}

	pdb := at(t, objs["PodDisruptionBudget"], "spec").(map[string]any)
	if pdb["minAvailable"] != 2 || pdb["maxUnavailable"] != nil {
		t.Errorf("PodDisruptionBudget %v, want minAvailable 2 only", pdb)
	}

	sm := objs["ServiceMonitor"]
	if got := at(t, sm, "metadata", "labels", "release"); got != "prometheus" {
		t.Errorf("ServiceMonitor label release=%v, want the value's prometheus", got)
	}
	ep := at(t, sm, "spec", "endpoints", 0).(map[string]any)
	if ep["port"] != "http" || ep["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %v, want /metrics on port http", ep)
	}
	svcLabels := at(t, objs["Service"], "metadata", "labels").(map[string]any)
	for k, v := range at(t, sm, "spec", "selector", "matchLabels").(map[string]any) {
		if svcLabels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%v, which the Service does not carry", k, v)
		}
	}
}

// TestChartInlineDatabaseURL keeps a database URL given in the values in
// the chart's Secret, never in the pod spec.
func TestChartInlineDatabaseURL(t *testing.T) {
	url := "postgres://rl:secret@db.rl.svc:5432/rl"
	objs := render(t, "--set", "database.url="+url)
	c := container(t, objs["Deployment"])
	name, key := secretRef(t, c, "RATELIMIT_DATABASE_URL")
	if name != at(t, objs["Secret"], "metadata", "name") || key != "database-url" {
		t.Errorf("RATELIMIT_DATABASE_URL from Secret %s key %s, want the chart's database-url", name, key)
	}
	if got := at(t, objs["Secret"], "stringData", key); got != url {
		t.Errorf("the chart's Secret holds %v, want %s", got, url)
	}
}

// TestChartRefusesBadValues: values that would deploy something other than
// what they say fail to render, with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"replicaCount=2"}, "replicaCount: more than one replica needs Postgres"},
		{[]string{"replicaCount=2", "database.url=postgres://db/rl"}, "replicaCount: more than one replica needs Redis"},
		{[]string{"database.url=postgres://db/rl", "database.existingSecret.name=db"}, "give database.url or database.existingSecret.name, not both"},
		{[]string{"redis.url=redis://r:6379", "redis.existingSecret.name=r"}, "give redis.url or redis.existingSecret.name, not both"},
		{[]string{"env.RATELIMIT_HTTP_ADDR=0.0.0.0:9000"}, "env.RATELIMIT_HTTP_ADDR: set by the chart"},
		{[]string{"env.RATELIMIT_BOOTSTRAP_TOKEN=s3cret"}, "env.RATELIMIT_BOOTSTRAP_TOKEN: set by the chart"},
		{[]string{"podDisruptionBudget.minAvailable=1"}, "podDisruptionBudget: give exactly one of minAvailable and maxUnavailable"},
		{[]string{"env.RATELIMIT_FAIL_MODE=sideways"}, "RATELIMIT_FAIL_MODE"},
		{[]string{"env.LOG_LEVEL=debug"}, "LOG_LEVEL"},
		{[]string{"database.url=mysql://db/rl"}, "database"},
		{[]string{"replicas=3"}, "replicas"},
		{[]string{"service.grpcPort=0"}, "grpcPort"},
	} {
		out, err := helmTemplate(t, "--set", strings.Join(tc.set, ","))
		if err == nil {
			t.Errorf("--set %v rendered:\n%s", tc.set, out)
			continue
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("--set %v: %q, want it to say %q", tc.set, out, tc.want)
		}
	}
}

// TestValidatorCatchesMistakes shows that the validation the other tests
// rely on is strict: a field no schema knows, a value of the wrong type
// and a kind without a schema each fail it.
func TestValidatorCatchesMistakes(t *testing.T) {
	out, err := helmTemplate(t)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	if msg, err := validate(t, out); err != nil {
		t.Fatalf("the default rendering is not valid: %v\n%s", err, msg)
	}
	for name, bad := range map[string]string{
		"unknown field": strings.Replace(out, "  replicas: 1\n", "  replicas: 1\n  replicaz: 1\n", 1),
		"wrong type":    strings.Replace(out, "  replicas: 1\n", "  replicas: one\n", 1),
		"unknown kind":  out + "---\napiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n",
	} {
		if bad == out {
			t.Fatalf("%s: the rendering changed; the test no longer breaks it", name)
		}
		if msg, err := validate(t, bad); err == nil {
			t.Errorf("%s: the validator accepted it:\n%s", name, msg)
		}
	}
}
