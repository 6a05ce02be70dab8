package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// report is the outcome of a run. Its JSON form is what scripts read.
type report struct {
	Name        string  `json:"name,omitempty"`
	URL         string  `json:"url"`
	Connections int     `json:"connections"`
	TargetRate  float64 `json:"target_rate,omitempty"`
	WarmupS     float64 `json:"warmup_s"`
	// ElapsedS is the measured window: from the end of the warm-up to the
	// last counted answer.
	ElapsedS float64 `json:"elapsed_s"`
	// Requests counts the requests started in the window that got an
	// answer or failed; Errors, those of them that failed.
	Requests uint64  `json:"requests"`
	Errors   uint64  `json:"errors"`
	RPS      float64 `json:"rps"`
	// Latency is in milliseconds, over the answered requests.
	Latency    latency           `json:"latency_ms"`
	Status     map[string]uint64 `json:"status"`
	ErrorKinds map[string]uint64 `json:"error_kinds"`
	FirstError string            `json:"first_error,omitempty"`
	// LoadgenCPUCores is the CPU time this generator used over the window,
	// in cores: what it took from a service on the same machine.
	LoadgenCPUCores float64 `json:"loadgen_cpu_cores"`
	// LoadgenCPUPerReqUS is that time per request, in microseconds.
	LoadgenCPUPerReqUS float64 `json:"loadgen_cpu_us_per_request"`
	// TotalS is the whole run, warm-up included, and LoadgenCPUTotalS the
	// generator's CPU time over it, in seconds.
	TotalS           float64 `json:"total_s"`
	LoadgenCPUTotalS float64 `json:"loadgen_cpu_total_s"`
}

type latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// summarize merges the workers' counts into a report.
func summarize(cfg *config, p *plan, workers []*worker, cpu time.Duration) *report {
	var h histogram
	var errs [kindCount]uint64
	var statuses [1000]uint64
	r := &report{Name: cfg.name, URL: cfg.target.String(), Connections: cfg.conns, TargetRate: cfg.rate,
		WarmupS: cfg.warmup.Seconds(), Status: map[string]uint64{}, ErrorKinds: map[string]uint64{}}
	done := p.measureStart
	for _, w := range workers {
		h.merge(&w.hist)
		for i, n := range w.errs {
			errs[i] += n
		}
		for s, n := range w.statuses {
			statuses[s] += n
		}
		if w.done.After(done) {
			done = w.done
		}
		if r.FirstError == "" {
			r.FirstError = w.firstErr
		}
	}
	for s, n := range statuses {
		if n > 0 {
			r.Status[strconv.Itoa(s)] = n
		}
	}
	r.Requests = h.n
	for i, n := range errs {
		if n == 0 {
			continue
		}
		r.ErrorKinds[kindNames[i]] = n
		r.Errors += n
		if errorKind(i) < kindStatus {
			// A request without an answer is not in the histogram.
			r.Requests += n
		}
	}
	elapsed := done.Sub(p.measureStart)
	r.ElapsedS = elapsed.Seconds()
	if elapsed > 0 {
		r.RPS = float64(r.Requests) / elapsed.Seconds()
		r.LoadgenCPUCores = cpu.Seconds() / elapsed.Seconds()
	}
	if r.Requests > 0 {
		r.LoadgenCPUPerReqUS = float64(cpu.Microseconds()) / float64(r.Requests)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	r.Latency = latency{P50: ms(h.quantile(0.50)), P90: ms(h.quantile(0.90)), P99: ms(h.quantile(0.99)),
		Max: ms(time.Duration(h.max)), Mean: ms(h.mean())}
	return r
}

// write renders the report in format: text, json or tsv.
func (r *report) write(w io.Writer, format string) error {
	var err error
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	case "tsv":
		name := r.Name
		if name == "" {
			name = "-"
		}
		_, err = fmt.Fprintf(w, "%s\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t%d\n",
			name, r.RPS, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max, r.Requests, r.Errors)
	default:
		err = r.writeText(w)
	}
	return err
}

func (r *report) writeText(w io.Writer) error {
	var b strings.Builder
	if r.Name != "" {
		fmt.Fprintf(&b, "run          %s\n", r.Name)
	}
	fmt.Fprintf(&b, "target       %s, %d connections", r.URL, r.Connections)
	if r.TargetRate > 0 {
		fmt.Fprintf(&b, ", %.0f requests/s scheduled", r.TargetRate)
	}
	fmt.Fprintf(&b, "\nmeasured     %.1fs after %.1fs of warm-up\n", r.ElapsedS, r.WarmupS)
	fmt.Fprintf(&b, "requests     %d (%.0f/s), %d errors\n", r.Requests, r.RPS, r.Errors)
	fmt.Fprintf(&b, "latency ms   p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f\n",
		r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max, r.Latency.Mean)
	fmt.Fprintf(&b, "status       %s\n", counts(r.Status))
	if r.Errors > 0 {
		fmt.Fprintf(&b, "errors       %s\nfirst error  %s\n", counts(r.ErrorKinds), r.FirstError)
	}
	fmt.Fprintf(&b, "loadgen cpu  %.2f cores, %.1f µs per request\n", r.LoadgenCPUCores, r.LoadgenCPUPerReqUS)
	_, err := io.WriteString(w, b.String())
	return err
}

// counts renders a count map as "k: n, k: n" in key order.
func counts(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
