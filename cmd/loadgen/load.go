package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// errorKind classifies a failed request.
type errorKind int

const (
	kindConnect   errorKind = iota // dialing failed
	kindTimeout                    // no complete answer within -timeout
	kindIO                         // the connection failed while writing or reading
	kindMalformed                  // the answer is not HTTP/1.x as the reader knows it
	kindStatus                     // the status is not 2xx
	kindBody                       // the body lacks -expect
	kindCount
)

var kindNames = [kindCount]string{"connect", "timeout", "io", "malformed", "status", "body"}

// reconnectPause keeps a worker whose connections fail from spinning.
const reconnectPause = 10 * time.Millisecond

// plan is the timing of a run, shared by its workers.
type plan struct {
	start        time.Time
	measureStart time.Time
	end          time.Time
	// interval is each connection's time between requests, zero for a
	// closed loop.
	interval time.Duration
}

// worker drives one connection and counts what it saw.
type worker struct {
	id   int
	cfg  *config
	plan *plan
	reqs [][]byte

	hist     histogram
	statuses [1000]uint64
	errs     [kindCount]uint64
	firstErr string
	// done is when the last counted request finished.
	done time.Time
}

// load runs the whole test and reports it.
func load(ctx context.Context, cfg *config) (*report, error) {
	reqs := cfg.requests()
	now := time.Now()
	p := &plan{start: now, measureStart: now.Add(cfg.warmup)}
	p.end = p.measureStart.Add(cfg.duration)
	if cfg.rate > 0 {
		p.interval = time.Duration(float64(cfg.conns) / cfg.rate * float64(time.Second))
	}
	workers := make([]*worker, cfg.conns)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{id: i, cfg: cfg, plan: p, reqs: reqs}
		workers[i] = w
		wg.Go(func() { w.run(ctx) })
	}
	// The generator's own CPU time over the measured window says how much
	// of the machine it took from the service.
	var cpuStart time.Duration
	select {
	case <-time.After(time.Until(p.measureStart)):
		cpuStart = cpuTime()
	case <-ctx.Done():
	}
	wg.Wait()
	total := cpuTime()
	rep := summarize(cfg, p, workers, total-cpuStart)
	rep.TotalS, rep.LoadgenCPUTotalS = time.Since(p.start).Seconds(), total.Seconds()
	return rep, nil
}

// cpuTime returns the user and system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// run sends requests until the plan ends or ctx is cancelled.
func (w *worker) run(ctx context.Context) {
	p := w.plan
	var (
		conn     net.Conn
		rd       *responseReader
		resp     response
		deadline time.Time
		timer    *time.Timer
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	// Connections interleave: connection i sends ids i, i+conns, ... and
	// in an open loop its k-th request is due at start + (k + i/conns)·interval.
	next := w.id % len(w.reqs)
	offset := time.Duration(float64(p.interval) * float64(w.id) / float64(w.cfg.conns))
	for k := 0; ctx.Err() == nil; k++ {
		var due time.Time
		if p.interval > 0 {
			due = p.start.Add(offset + time.Duration(k)*p.interval)
			if !due.Before(p.end) {
				return
			}
			if d := time.Until(due); d > 0 {
				if timer == nil {
					timer = time.NewTimer(d)
				} else {
					timer.Reset(d)
				}
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			}
		}
		if conn == nil {
			if !time.Now().Before(p.end) {
				return
			}
			var err error
			conn, err = w.dial()
			if err != nil {
				if time.Now().After(p.measureStart) {
					w.fail(kindConnect, err)
				}
				if !w.pause(ctx, reconnectPause) {
					return
				}
				continue
			}
			rd = newResponseReader(conn)
			deadline = time.Time{}
		}
		t0 := time.Now()
		if !t0.Before(p.end) {
			return
		}
		// Setting a deadline costs a timer update, so it is moved only when
		// a quarter of the timeout has gone: every request has between 3/4
		// of the timeout and all of it.
		if deadline.Sub(t0) < w.cfg.timeout*3/4 {
			deadline = t0.Add(w.cfg.timeout)
			_ = conn.SetDeadline(deadline)
		}
		_, err := conn.Write(w.reqs[next])
		if err == nil {
			err = rd.read(&resp)
		}
		t1 := time.Now()
		counted := !t0.Before(p.measureStart)
		if err != nil {
			conn.Close()
			conn = nil
			if counted {
				w.fail(classify(err), err)
				w.done = t1
			}
			continue
		}
		next += w.cfg.conns
		for next >= len(w.reqs) {
			next -= len(w.reqs)
		}
		if counted {
			if p.interval > 0 {
				t0 = due
			}
			w.hist.record(t1.Sub(t0))
			w.statuses[resp.status]++
			switch {
			case resp.status < 200 || resp.status > 299:
				w.fail(kindStatus, errors.New(statusText(resp.status, resp.body)))
			case w.cfg.expect != "" && !bytes.Contains(resp.body, []byte(w.cfg.expect)):
				w.fail(kindBody, errors.New("body without the expected text: "+truncate(resp.body)))
			}
			w.done = t1
		}
		if resp.close {
			conn.Close()
			conn = nil
		}
	}
}

func (w *worker) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: w.cfg.timeout}
	return d.Dial("tcp", w.cfg.target.Host)
}

// pause sleeps for d, or less if the run ends or ctx is cancelled first; it
// reports whether the run goes on.
func (w *worker) pause(ctx context.Context, d time.Duration) bool {
	d = min(d, time.Until(w.plan.end))
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *worker) fail(kind errorKind, err error) {
	w.errs[kind]++
	if w.firstErr == "" {
		w.firstErr = kindNames[kind] + ": " + err.Error()
	}
}

// classify tells a timeout and a malformed answer from other failures.
func classify(err error) errorKind {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	case errors.Is(err, errMalformed):
		return kindMalformed
	}
	return kindIO
}

func statusText(status int, body []byte) string {
	return "status " + strconv.Itoa(status) + ": " + truncate(body)
}

// truncate shortens a body for an error message.
func truncate(b []byte) string {
	const most = 200
	if len(b) > most {
		return string(b[:most]) + "..."
	}
	return string(b)
}
