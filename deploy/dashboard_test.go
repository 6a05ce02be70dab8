package deploy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// dashboard is the Grafana dashboard's file, relative to this package.
const dashboard = "grafana/ratelimitd.json"

// panel is what the test reads of a Grafana panel; a row holds panels of
// its own.
type panel struct {
	Title   string
	Targets []struct{ Expr string }
	Panels  []panel
}

// rangeVariables are Grafana's variables that stand for a range in a
// query; PromQL cannot parse them, so they are replaced by a duration
// before parsing.
var rangeVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// dashboardExprs returns the PromQL of every panel of the dashboard, by
// panel title.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Panels []panel }
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	exprs := map[string][]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs[p.Title] = append(exprs[p.Title], tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return exprs
}

// metricNames parses a PromQL expression and returns the metric name of
// each of its selectors. The parser, rather than a pattern, tells names
// from functions, aggregations, label names and keywords; a selector
// without a name fails the test, since nothing could be checked of it.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(rangeVariables.Replace(expr))
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				t.Errorf("%q: a selector without a metric name", expr)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}

// TestMetricNames shows what the dashboard test reads of an expression:
// the metric names, and none of the functions, labels and keywords around
// them.
func TestMetricNames(t *testing.T) {
	got := metricNames(t, `histogram_quantile(0.9, sum by (le, limit) (rate(a_bucket{route=~"/v1/(check|spend)"}[$__rate_interval])))
		/ on (limit) group_left sum without (instance) (b offset 5m) > bool 0 or vector(0) + count(c{le="1"})`)
	if want := []string{"a_bucket", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("metric names %v, want %v", got, want)
	}
}

// exposed returns the names of the series of a /metrics body: a histogram
// family exposes name_bucket, name_sum and name_count.
func exposed(t *testing.T, body io.Reader) map[string]bool {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	names := map[string]bool{}
	for name, f := range families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names
}

// TestDashboardMetricsExist reads every metric name the dashboard's
// queries use and checks that the service exposes each one, after a few
// decisions so that counters and histograms with labels exist.
func TestDashboardMetricsExist(t *testing.T) {
	exprs := dashboardExprs(t)
	for _, title := range []string{"Decisions by limit and result", "Decision latency quantiles (REST)", "Store errors", "Snapshot age",
		"Leases held by limit", "Lease expiries by limit", "Quota units spent by limit (last 24 h)"} {
		if len(exprs[title]) == 0 {
			t.Errorf("no panel %q with a query", title)
		}
	}
	used := map[string][]string{}
	for title, es := range exprs {
		for _, e := range es {
			for _, n := range metricNames(t, e) {
				if !slices.Contains(used[n], title) {
					used[n] = append(used[n], title)
				}
			}
		}
	}

	s := startService(t)
	for name, body := range map[string]string{
		"Logins":        `{"id_format":"string","burst":2,"count":2,"period":"1m"}`,
		"ModelCalls":    `{"id_format":"string","kind":"concurrency","burst":2,"period":"30s"}`,
		"ExportsPerDay": `{"id_format":"string","calendar":"day","time_zone":"Europe/Paris","count":3}`,
	} {
		if code, body := s.call(t, "PUT", "/v1/limits/"+name, body); code != http.StatusCreated {
			t.Fatalf("creating %s: %d %s", name, code, body)
		}
	}
	// Three spends against a burst of two: allowed and denied both get a
	// series.
	var spent struct{ Allowed bool }
	for range 3 {
		s.answered(t, "/v1/spend", `{"buckets":[{"limit":"Logins","bucket_id":"alice@example.com"}]}`, &spent)
	}
	// A lease taken and given back, and a quota's units spent.
	var acquired struct {
		Allowed bool
		Lease   *struct{ ID string }
	}
	if s.answered(t, "/v1/acquire", `{"buckets":[{"limit":"ModelCalls","bucket_id":"acct-42"}]}`, &acquired); !acquired.Allowed || acquired.Lease == nil {
		t.Fatalf("the acquire: %+v", acquired)
	}
	var released struct{ Released bool }
	if s.answered(t, "/v1/release", `{"lease_id":"`+acquired.Lease.ID+`"}`, &released); !released.Released {
		t.Fatal("the release freed nothing")
	}
	if s.answered(t, "/v1/spend", `{"buckets":[{"limit":"ExportsPerDay","bucket_id":"acct-42","cost":2}]}`, &spent); !spent.Allowed {
		t.Fatal("the quota's spend was not allowed")
	}

	res, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	have := exposed(t, res.Body)
	for name, titles := range used {
		if !have[name] {
			t.Errorf("%s, used by %q, is not among the service's metrics", name, titles)
		}
	}
}

// listening is the line serve prints once it takes connections.
var listening = regexp.MustCompile(`listening on (http://\S+)`)

// service is ratelimitd serve running as a process of the test.
type service struct {
	url, token string
	log        *testenv.LockedBuffer
}

// startService builds ratelimitd, runs `serve` on a loopback port with
// SQLite and the in-process store, and returns it once it is ready.
func startService(t *testing.T) *service {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "ratelimitd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ratelimitd")
	build.Dir = ".." // the module's root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the service: %v\n%s", err, out)
	}
	s := &service{token: "rlt_dashboard_test_bootstrap", log: &testenv.LockedBuffer{}}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"RATELIMIT_HTTP_ADDR=127.0.0.1:0",
		"RATELIMIT_GRPC_ADDR=127.0.0.1:0",
		"RATELIMIT_DATABASE_URL=sqlite:"+filepath.Join(dir, "ratelimitd.db"),
		"RATELIMIT_REDIS_URL=",
		"RATELIMIT_BOOTSTRAP_TOKEN="+s.token,
	)
	cmd.Stderr = s.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				break
			}
		}
		close(found)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case u, ok := <-found:
		if !ok {
			t.Fatalf("serve ended before listening\nlog: %s", s.log.String())
		}
		s.url = u
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not listen within 30 s\nlog: %s", s.log.String())
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := s.call(t, "GET", "/readyz", ""); code == http.StatusOK {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30 s\nlog: %s", s.log.String())
		}
	}
}

// answered POSTs a JSON body until it is answered 200, and decodes the
// answer into v: a limit reaches the snapshot a moment after its write,
// and until then a decision on it is a 422.
func (s *service) answered(t *testing.T, path, body string, v any) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, answer := s.call(t, "POST", path, body)
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(answer), v); err != nil {
				t.Fatalf("POST %s: decoding %s: %v", path, answer, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("POST %s not answered 200 within 10 s: %d %s\nlog: %s", path, code, answer, s.log.String())
		}
	}
}

// call sends a JSON request with the admin token and returns the status
// and the body.
func (s *service) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}
