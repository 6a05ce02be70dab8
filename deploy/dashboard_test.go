package deploy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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

	"github.com/ratelimitd/ratelimitd/internal/telemetry"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
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
	if code, body := s.call(t, "PUT", "/v1/limits/Logins", `{"id_format":"string","burst":2,"count":2,"period":"1m"}`); code != http.StatusCreated {
		t.Fatalf("creating a limit: %d %s", code, body)
	}
	// Three spends against a burst of two: allowed and denied both get a
	// series. The limit reaches the snapshot a moment after the write.
	spend := `{"buckets":[{"limit":"Logins","bucket_id":"alice@example.com"}]}`
	for spent, deadline := 0, time.Now().Add(10*time.Second); spent < 3; {
		if code, _ := s.call(t, "POST", "/v1/spend", spend); code == http.StatusOK {
			spent++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("spends not answered within 10 s\nlog: %s", s.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	res, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	have := exposed(t, res.Body)
	told := telemetryExposes(t)
	for name := range unmadeByREST {
		have[name] = told[name]
	}
	for name, titles := range used {
		if !have[name] {
			t.Errorf("%s, used by %q, is not among the service's metrics", name, titles)
		}
	}
}

// unmadeByREST are the metrics of concurrency limits and calendar quotas,
// which the REST API of this revision cannot create yet: their names are
// checked against the telemetry the service registers, told of a lease and
// a quota's spend, instead of against the running service.
var unmadeByREST = map[string]bool{"ratelimitd_leases_total": true, "ratelimitd_quota_spent_units_total": true}

// telemetryExposes returns the series names of the service's telemetry
// after a lease event and a spend on a calendar quota.
func telemetryExposes(t *testing.T) map[string]bool {
	t.Helper()
	tel := telemetry.New(telemetry.Config{})
	tel.ObserveLease("Calls", limiter.LeaseAcquired, 1)
	tel.Front("http").ObserveUnits(limiter.Spend, []limiter.Request{{Cost: 1}}, limiter.Result{Allowed: true, Decisions: []limiter.Decision{
		{Limit: "Daily", Calendar: limiter.CalendarDay, Outcome: limiter.Outcome{Allowed: true}},
	}})
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return exposed(t, rec.Body)
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
