package testenv

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a server, so that
// a test can cut a process off from a server that other tests share: Down
// is an outage as the process sees it (every connection drops, new ones
// are refused), while the server itself, and every other test using it,
// goes on undisturbed.
type Proxy struct {
	t      testing.TB
	target string
	// addr stays the same across Down and Up, so that clients reconnect.
	addr string

	mu sync.Mutex
	// ln is nil while the proxy is down.
	ln net.Listener
	// conns are the open connections, both ends of each pair.
	conns map[net.Conn]struct{}
	// stalled holds forwarding: connections stay open and carry nothing.
	stalled bool
	resume  chan struct{}
	closed  bool
	wg      sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards every connection
// to target (host:port), until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{t: t, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's host:port, the same after Down and Up.
func (p *Proxy) Addr() string { return p.addr }

// Down closes every connection and stops listening, so that connecting
// is refused, until Up. Calling it while down does nothing.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.unstall()
}

// Up listens again on the same port, after Down. Calling it while up does
// nothing.
func (p *Proxy) Up() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	// The port was ours a moment ago; on a busy machine an outgoing
	// connection may hold it briefly.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("proxy: listening again on %s: %v", p.addr, err)
		}
	}
}

// Stall stops forwarding without closing anything: connections stay open
// and new ones are accepted, but no byte goes through until Resume or
// Down, like a server that hangs or a network path that loses everything.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
}

// Resume forwards again after Stall; what was held is delivered.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unstall()
}

// unstall releases the forwarders waiting on a stall; p.mu is held.
func (p *Proxy) unstall() {
	if p.stalled {
		p.stalled = false
		close(p.resume)
		p.resume = make(chan struct{})
	}
}

// gate returns a channel that is closed when forwarding may go on: at once
// unless the proxy is stalled.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		return nil
	}
	return p.resume
}

// serve accepts on ln until it is closed; p.mu is held or p is not yet
// shared.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c)
			}()
		}
	}()
}

// forward connects c to the target and copies both ways until either side
// closes or Down closes both.
func (p *Proxy) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	defer p.untrack(c, up)
	done := make(chan struct{}, 2)
	go func() { p.copy(up, c); done <- struct{}{} }()
	go func() { p.copy(c, up); done <- struct{}{} }()
	<-done
	// One direction ended: end the other, as the peer would see it.
	_ = c.Close()
	_ = up.Close()
	<-done
}

// copy copies from src to dst, waiting at each read while stalled.
func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if g := p.gate(); g != nil {
				<-g
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection alike
		}
	}
}

// track registers a pair of connections, or closes them when the proxy
// went down or closed while the pair was being made.
func (p *Proxy) track(c, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		_ = c.Close()
		_ = up.Close()
		return false
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	return true
}

func (p *Proxy) untrack(c, up net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	delete(p.conns, up)
}

// close ends the proxy for good and waits for its goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Down()
	p.wg.Wait()
}
