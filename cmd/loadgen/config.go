package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// config is a validated command line.
type config struct {
	target   *url.URL
	method   string
	token    string
	body     string
	ctype    string
	ids      int
	idBase   int64
	expect   string
	conns    int
	duration time.Duration
	warmup   time.Duration
	rate     float64
	timeout  time.Duration
	format   string
	name     string
	// cpuProfile names a file for the generator's own CPU profile.
	cpuProfile string
}

// Bounds that keep a run small and short, whatever the flags say.
const (
	maxConns    = 10_000
	maxIDs      = 1_000_000
	maxDuration = 24 * time.Hour
)

// idPlaceholder in the body is replaced by each id in turn.
const idPlaceholder = "{id}"

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      config
		target   string
		bodyFile string
	)
	fs.StringVar(&target, "url", "http://127.0.0.1:8080/v1/spend", "target `URL`: http, loopback host")
	fs.StringVar(&cfg.method, "method", "", "request method (default POST with a body, else GET)")
	fs.StringVar(&cfg.token, "token", os.Getenv("LOADGEN_TOKEN"), "bearer `token` sent in Authorization ($LOADGEN_TOKEN)")
	fs.StringVar(&cfg.body, "body", "", "request body; "+idPlaceholder+" takes each id in turn")
	fs.StringVar(&bodyFile, "body-file", "", "read the body from `file` instead")
	fs.StringVar(&cfg.ctype, "content-type", "application/json", "Content-Type of the body")
	fs.IntVar(&cfg.ids, "ids", 1, "number of distinct values of "+idPlaceholder)
	fs.Int64Var(&cfg.idBase, "id-base", 1, "first value of "+idPlaceholder)
	fs.StringVar(&cfg.expect, "expect", "", "`text` every response body must contain; a body without it is an error")
	fs.IntVar(&cfg.conns, "c", 64, "number of keep-alive connections")
	fs.DurationVar(&cfg.duration, "d", 10*time.Second, "how long to measure, after the warm-up")
	fs.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "how long to send before measuring")
	fs.Float64Var(&cfg.rate, "rate", 0, "total requests per second over all connections; 0 sends as fast as answers come")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "bound on connecting and on each request")
	fs.StringVar(&cfg.format, "format", "text", "report format: text, json or tsv (one line: name rps p50 p90 p99 max in ms, requests, errors)")
	fs.StringVar(&cfg.name, "name", "", "a name for the run, in the report")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write the generator's own CPU profile to `file`")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if bodyFile != "" {
		if cfg.body != "" {
			bad("-body and -body-file exclude each other")
		}
		b, err := os.ReadFile(bodyFile)
		if err != nil {
			bad("-body-file: %v", err)
		}
		cfg.body = string(b)
	}
	u, err := checkTarget(target)
	if err != nil {
		bad("-url: %v", err)
	}
	cfg.target = u
	if cfg.method == "" {
		cfg.method = "GET"
		if cfg.body != "" {
			cfg.method = "POST"
		}
	}
	if !isToken(cfg.method) {
		bad("-method: %q is not a method", cfg.method)
	}
	for name, v := range map[string]string{"-token": cfg.token, "-content-type": cfg.ctype} {
		if strings.ContainsAny(v, "\r\n") {
			bad("%s: must be one line", name)
		}
	}
	if cfg.ids < 1 || cfg.ids > maxIDs {
		bad("-ids: want 1 to %d, got %d", maxIDs, cfg.ids)
	}
	if cfg.conns < 1 || cfg.conns > maxConns {
		bad("-c: want 1 to %d, got %d", maxConns, cfg.conns)
	}
	if cfg.duration <= 0 || cfg.duration > maxDuration {
		bad("-d: want more than 0 and at most %v, got %v", maxDuration, cfg.duration)
	}
	if cfg.warmup < 0 || cfg.warmup > maxDuration {
		bad("-warmup: want 0 to %v, got %v", maxDuration, cfg.warmup)
	}
	if cfg.rate < 0 || cfg.rate > 1e7 {
		bad("-rate: want 0 to 1e7, got %v", cfg.rate)
	}
	if cfg.rate > 0 && cfg.rate < float64(cfg.conns)/maxDuration.Seconds() {
		bad("-rate: %v per second over %d connections is too slow", cfg.rate, cfg.conns)
	}
	if cfg.timeout <= 0 || cfg.timeout > time.Hour {
		bad("-timeout: want more than 0 and at most 1h, got %v", cfg.timeout)
	}
	switch cfg.format {
	case "text", "json", "tsv":
	default:
		bad("-format: want text, json or tsv, got %q", cfg.format)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &cfg, nil
}

// checkTarget parses an http URL whose host is on loopback: a load test
// must not leave the machine.
func checkTarget(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("want an http:// URL, got %q", raw)
	}
	if u.User != nil || u.Fragment != "" {
		return nil, fmt.Errorf("want no user or fragment in %q", raw)
	}
	host := u.Hostname()
	if host != "localhost" {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.IsLoopback() {
			return nil, fmt.Errorf("%q is not a loopback address; loadgen loads loopback only", host)
		}
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(host, "80")
	}
	return u, nil
}

// isToken reports whether s is an HTTP token, as a method must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// requests prepares the raw requests, one per id (one in all when the body
// names no id).
func (cfg *config) requests() [][]byte {
	n := cfg.ids
	if !strings.Contains(cfg.body, idPlaceholder) {
		n = 1
	}
	out := make([][]byte, n)
	for i := range out {
		body := strings.ReplaceAll(cfg.body, idPlaceholder, strconv.FormatInt(cfg.idBase+int64(i), 10))
		out[i] = cfg.request(body)
	}
	return out
}

// request is one raw HTTP/1.1 request with body.
func (cfg *config) request(body string) []byte {
	var b strings.Builder
	path := cfg.target.RequestURI()
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: ratelimitd-loadgen\r\n", cfg.method, path, cfg.target.Host)
	if cfg.token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", cfg.token)
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: %s\r\n", cfg.ctype)
	}
	if body != "" || cfg.method == "POST" || cfg.method == "PUT" || cfg.method == "PATCH" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return []byte(b.String())
}
