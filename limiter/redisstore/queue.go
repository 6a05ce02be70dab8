package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Node's script calls queue when they come faster than the wire takes
// them, and the queue goes as one pipeline. A call that finds fewer
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
	// maxInFlight is how many round trips a Node has on the wire at
	// once, each on its own connection: with one, two concurrent calls
	// wait for each other; more gain nothing under load
	// (BenchmarkSpendConcurrent).
	maxInFlight = 2
	// maxPipeline bounds the calls of one pipeline, and so the wait of the
	// calls behind them.
	maxPipeline = 128
)

// scriptCall is one script run. The caller owns it until it queues it;
// then the queue owns it until it signals done, and may fill reply and err
// until then. A Node reuses the calls it owns again, and their buffers.
type scriptCall struct {
	// ctx is the caller's: a call whose context has ended by the time its
	// pipeline is sent is not sent.
	ctx   context.Context
	run   scriptRun
	reply []int64
	err   error
	// done receives one value when reply and err are set; it is buffered
	// so that the pipeline never waits for a caller that gave up.
	done chan struct{}
}

// queue sends script calls, queueing those that find the wire full and
// sending them together.
type queue struct {
	client redis.UniversalClient

	mu      sync.Mutex
	pending []*scriptCall
	// inFlight counts the round trips under way: callers sending their
	// own call, and goroutines sending what was queued, at most
	// maxInFlight. The goroutines exit when nothing is queued, so an idle
	// Store holds none.
	inFlight int
}

// do sends c, or queues it when the wire is full, and waits for its reply
// or for its context to end. It reports whether c is the caller's again:
// a call given up on while queued still belongs to the queue.
func (p *queue) do(c *scriptCall) (bool, error) {
	if err := c.ctx.Err(); err != nil {
		return true, err
	}
	p.mu.Lock()
	if p.inFlight < maxInFlight {
		p.inFlight++
		p.mu.Unlock()
		var buf pipelineBuf
		calls := [1]*scriptCall{c}
		p.run(c.ctx, calls[:], &buf)
		<-c.done
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
		return true, c.err
	}
	p.pending = append(p.pending, c)
	p.mu.Unlock()
	select {
	case <-c.done:
		return true, c.err
	case <-c.ctx.Done():
		return false, c.ctx.Err()
	}
}

// pipelineBuf is the memory of one pipeline, reused by the next.
type pipelineBuf struct {
	runs []scriptRun
	cmds []*redis.Cmd
}

// send sends what is queued, a pipeline at a time, until nothing is. It
// runs as one of the round trips inFlight counts.
func (p *queue) send() {
	var (
		calls []*scriptCall
		buf   pipelineBuf
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
		p.runQueued(calls, &buf)
		// The calls belong to their callers again.
		clear(calls)
	}
}

// runQueued sends queued calls in one pipeline, which lasts as long as the
// most patient of them; each caller stops waiting at its own deadline.
func (p *queue) runQueued(calls []*scriptCall, buf *pipelineBuf) {
	// Every call's context has a deadline: the Store's calls are bounded.
	var deadline time.Time
	for _, c := range calls {
		if d, _ := c.ctx.Deadline(); d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	p.run(ctx, calls, buf)
}

// run sends calls in one pipeline under ctx, then hands every call its
// result. Calls whose context has ended are answered with its error
// and not sent.
func (p *queue) run(ctx context.Context, calls []*scriptCall, buf *pipelineBuf) {
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
		return
	}
	buf.runs = buf.runs[:0]
	for _, c := range live {
		buf.runs = append(buf.runs, c.run)
	}
	buf.cmds = evalPipelined(ctx, p.client, buf.runs, buf.cmds)
	for i, c := range live {
		c.reply, c.err = buf.cmds[i].Int64Slice()
		c.done <- struct{}{}
	}
	clear(buf.runs)
	clear(buf.cmds)
}
