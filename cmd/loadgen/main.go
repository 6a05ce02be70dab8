// Command loadgen loads an HTTP/1.1 service on loopback, ratelimitd's
// decision endpoints in particular, and reports throughput and latency.
//
//	loadgen -url http://127.0.0.1:8080/v1/spend -token SECRET \
//	    -body '{"buckets":[{"limit":"L","bucket_id":"{id}"}]}' -ids 1000 \
//	    -c 64 -d 10s -warmup 2s -expect '"allowed":true'
//
// It shares the machine with the service it loads, so it is built to cost
// little per request: each connection is a goroutine that writes a request
// prepared in advance on a keep-alive net.Conn and parses the answer with a
// minimal HTTP/1.1 reader, with no allocation per request. "{id}" in the
// body takes -ids values in turn (-id-base, -id-base+1, ...), so a run can
// spread over many buckets; the sequence is fixed, so two runs send the
// same requests.
//
// Without -rate, every connection sends its next request as soon as the
// last is answered (a closed loop: the throughput is the service's
// maximum). With -rate, the connections together send that many requests
// per second on a fixed schedule (an open loop, for soak tests), and a
// latency is measured from when its request was due, so that a stall
// shows in the latencies instead of only in a lower rate.
//
// Requests sent during -warmup are not counted. A response that is not
// 2xx, or whose body lacks -expect, counts as an error, as does any
// failure to connect, write or read; the exit status is 1 when any error
// was counted. Only loopback targets are accepted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// errFailed reports a run that completed with errors; the report says
// which.
var errFailed = errors.New("some requests failed")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case errors.Is(err, errFailed):
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
}

// run is the whole program: it parses args, loads the target and writes the
// report to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := load(ctx, cfg)
	if err != nil {
		return err
	}
	if err := rep.write(stdout, cfg.format); err != nil {
		return err
	}
	if rep.Errors > 0 {
		return fmt.Errorf("%w: %d of %d (%s)", errFailed, rep.Errors, rep.Requests, rep.FirstError)
	}
	return nil
}
