package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script calls on a single node (or a Sentinel's primary) are pipelined
// when they come faster than the wire takes them. A call that finds fewer
// than maxInFlight round trips under way is sent at once, by its caller,
// as without pipelining; the calls that arrive meanwhile queue, and go
// together as soon as a round trip comes back, in one write and one read,
// each still its own atomic script run. Under load one system call then
// serves many decisions, in this process and in Redis, where a write and a
// read per call cost more than the script; at low concurrency nothing
// waits and nothing changes hands.
//
// What a call sees is unchanged: its own reply or error, within its own
// deadline. A call whose context ends while it waits returns the
// context's error and is dropped if it has not been sent yet; once sent it
// may have run, as a call that timed out on the wire always may have.
const (
	// maxInFlight is how many round trips a Store has on the wire at
	// once, each on its own connection. BenchmarkSpendConcurrent on the
	// 2-core test machine, in CPU time per spend and time per spend, with
	// 1, 2 and unpipelined: at 4 goroutines 32 µs and 60 µs, 22 and 31,
	// 25 and 30 (one in flight makes two concurrent calls wait for each
	// other); at 64, 7 and 15, 7 and 13, 18 and 19. Under the service's
	// load at 64 connections 1 and 2 gave the same throughput.
	maxInFlight = 2
	// maxPipeline bounds the calls of one pipeline, and so the wait of the
	// calls behind them.
	maxPipeline = 128
)

// scriptCall is one script run. The caller owns keys and args until it
// queues the call; then the pipeline owns the call until it signals done,
// and may fill reply and err until then.
type scriptCall struct {
	// ctx is the caller's: a call whose context has ended by the time its
	// pipeline is sent is not sent.
	ctx   context.Context
	keys  []string
	args  []any
	reply []int64
	err   error
	// done receives one value when reply and err are set; it is buffered
	// so that the pipeline never waits for a caller that gave up.
	done chan struct{}
}

// pipeliner sends script calls, queueing and pipelining those that find
// the wire full.
type pipeliner struct {
	client redis.UniversalClient
	script *redis.Script

	mu      sync.Mutex
	pending []*scriptCall
	// inFlight counts the round trips under way: callers sending their
	// own call, and goroutines sending what was queued, at most
	// maxInFlight. The goroutines exit when nothing is queued, so an idle
	// Store holds none.
	inFlight int
}

// do sends c, or queues it when the wire is full, and waits for its reply
// or for its context to end.
func (p *pipeliner) do(c *scriptCall) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.inFlight < maxInFlight {
		p.inFlight++
		p.mu.Unlock()
		calls := [1]*scriptCall{c}
		p.run(c.ctx, calls[:], nil)
		p.mu.Lock()
		if len(p.pending) > 0 {
			// What queued meanwhile goes now, on the round trip this
			// call gives up.
			go p.send()
			p.mu.Unlock()
		} else {
			p.inFlight--
			p.mu.Unlock()
		}
		return c.err
	}
	p.pending = append(p.pending, c)
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-c.ctx.Done():
		return c.ctx.Err()
	}
}

// send sends what is queued, a pipeline at a time, until nothing is. It
// runs as one of the round trips inFlight counts.
func (p *pipeliner) send() {
	var (
		calls []*scriptCall
		cmds  []*redis.Cmd
	)
	for {
		p.mu.Lock()
		if len(p.pending) == 0 {
			p.inFlight--
			p.mu.Unlock()
			return
		}
		n := min(len(p.pending), maxPipeline)
		calls = append(calls[:0], p.pending[:n]...)
		left := copy(p.pending, p.pending[n:])
		clear(p.pending[left:])
		p.pending = p.pending[:left]
		p.mu.Unlock()
		cmds = p.runQueued(calls, cmds[:0])
		// The calls belong to their callers again.
		clear(calls)
	}
}

// runQueued sends queued calls in one pipeline, which lasts as long as the
// most patient of them; each caller stops waiting at its own deadline.
func (p *pipeliner) runQueued(calls []*scriptCall, cmds []*redis.Cmd) []*redis.Cmd {
	// Every call's context has a deadline: the Store's calls are bounded.
	var deadline time.Time
	for _, c := range calls {
		if d, _ := c.ctx.Deadline(); d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return p.run(ctx, calls, cmds)
}

// run sends calls in one pipeline under ctx, and again with the script's
// text those that found it missing from the server, then hands every call
// its result. Calls whose context has ended are answered with its error
// and not sent.
func (p *pipeliner) run(ctx context.Context, calls []*scriptCall, cmds []*redis.Cmd) []*redis.Cmd {
	live := calls[:0]
	for _, c := range calls {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			c.done <- struct{}{}
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return cmds
	}
	pipe := p.client.Pipeline()
	for _, c := range live {
		cmds = append(cmds, p.script.EvalSha(ctx, pipe, c.keys, c.args...))
	}
	_, _ = pipe.Exec(ctx)
	// A call that found the script missing (a restart, a failover, SCRIPT
	// FLUSH) did not run: send it again with the script's text.
	again := false
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			if !again {
				pipe, again = p.client.Pipeline(), true
			}
			cmds[i] = p.script.Eval(ctx, pipe, live[i].keys, live[i].args...)
		}
	}
	if again {
		_, _ = pipe.Exec(ctx)
	}
	for i, c := range live {
		c.reply, c.err = cmds[i].Int64Slice()
		c.done <- struct{}{}
	}
	clear(cmds)
	return cmds[:0]
}
