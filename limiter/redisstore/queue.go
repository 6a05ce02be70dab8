package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// A store's decisions in flight share script calls. A call that finds no
// round trip under way is sent at once, by its caller, as without sharing:
// nothing waits on a timer. The calls that arrive meanwhile queue, and
// when the round trip comes back they go together, in one script call per
// hash slot (one on a single node) that runs their batches one after the
// other, each batch still all or nothing on its own (batchLua). A script
// call costs Redis a fixed amount beyond the work on its buckets, which
// pipelining alone does not save, so under load Redis's CPU per decision
// falls (by a third under make bench, docs/performance.md), and this
// process makes one write and one read for many decisions; at low
// concurrency nothing waits and nothing changes hands.
//
// What a call sees is unchanged: its own reply or error, within its own
// deadline. A call whose context ends while it waits returns the
// context's error and is dropped if it has not been sent yet; once sent it
// may have run, as a call that timed out on the wire always may have.
const (
	// maxInFlight is how many round trips a queue has on the wire at
	// once. With two, each carries about half the decisions that one
	// would, for no more throughput under load: measured with 64
	// goroutines, one cost Redis about 8% and this process about 15%
	// less CPU per decision (docs/performance.md).
	maxInFlight = 1
	// maxPipeline bounds the calls of one round trip, and so the wait of
	// the calls behind them.
	maxPipeline = 128
	// maxScriptKeys bounds the keys of one script call, and so how long
	// it holds Redis, which runs nothing else meanwhile; a batch larger
	// than this goes alone.
	maxScriptKeys = 128
	// maxPooledKeys bounds the keys and parts of a round trip whose
	// memory goes back to the pool: one that carried an outsized request
	// (a /v1/decisions of thousands of buckets) keeps none of it, which
	// the next round trips, of a few dozen keys, would hold on to.
	maxPooledKeys = 4096
)

// part is one batch of a call, all of whose keys are in one hash slot.
type part struct {
	slot uint16
	run  scriptRun
	// reply and err are set by the queue: the batch's status and TATs
	// (decide reads them), or the error of its script call.
	reply []int64
	err   error
	// unreplicated is set by the queue when the replicas did not
	// acknowledge the writes of the part's round trip (decide).
	unreplicated error
}

// scriptCall is one decision's batch: one part on a single node, one per
// slot on a Cluster. The caller owns it until it queues it; then the queue
// owns it until it signals done, and may set the parts' replies and
// errors until then. A Node reuses the calls it owns again, and their
// buffers.
type scriptCall struct {
	// ctx is the caller's and deadline the call's, set by bound: a call
	// whose context has ended or whose deadline has passed by the time its
	// round trip is sent is not sent.
	ctx      context.Context
	deadline time.Time
	// ctxEnds is set when ctx ends by the deadline, and so bounds the call
	// alone; else timer, the caller's, fires at the deadline while the
	// call waits in the queue, timeout after bound. Either way a call
	// costs no context of its own unless its caller sends it.
	ctxEnds bool
	timeout time.Duration
	timer   *time.Timer
	parts   []part
	// err is the context's error when the call was not sent.
	err error
	// done receives one value when the parts' replies are set; it is
	// buffered so that the queue never waits for a caller that gave up.
	done chan struct{}
}

// bound gives c the caller's ctx and the deadline timeout from now, or
// ctx's own when that is earlier.
func (c *scriptCall) bound(ctx context.Context, timeout time.Duration) {
	c.ctx, c.deadline, c.timeout = ctx, time.Now().Add(timeout), timeout
	d, ok := ctx.Deadline()
	c.ctxEnds = ok && !d.After(c.deadline)
	if c.ctxEnds {
		c.deadline = d
	}
}

// ended returns why c may no longer be sent at now: its context's error,
// or context.DeadlineExceeded past its deadline.
func (c *scriptCall) ended(now time.Time) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if !now.Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// sendCtx returns the context under which c's caller sends it: ctx,
// with c's deadline unless ctx ends by then.
func (c *scriptCall) sendCtx() (context.Context, context.CancelFunc) {
	if c.ctxEnds {
		return c.ctx, func() {}
	}
	return context.WithDeadline(c.ctx, c.deadline)
}

// expired starts c's timer and returns its channel, or nil when c's
// context ends by its deadline; stopExpiry stops the timer. The timer
// runs for the timeout bound was given, from now rather than from then:
// the microseconds between cost less than reading the clock again.
func (c *scriptCall) expired() <-chan time.Time {
	if c.ctxEnds {
		return nil
	}
	if c.timer == nil {
		c.timer = time.NewTimer(c.timeout)
	} else {
		c.timer.Reset(c.timeout)
	}
	return c.timer.C
}

// stopExpiry stops what expired started.
func (c *scriptCall) stopExpiry() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// queue sends script calls, queueing those that find the wire full and
// sending them together.
type queue struct {
	client redis.UniversalClient
	// wait, when not nil, ends each round trip with WAIT (failover.go).
	wait *replicaWait
	// addr is a Cluster's master's, whose queue this is.
	addr string

	// trips holds the memory of the round trips callers send themselves,
	// which would otherwise grow every slice of it again for each.
	trips sync.Pool

	mu      sync.Mutex
	pending []*scriptCall
	// inFlight counts the round trips under way: callers sending their
	// own call, and goroutines sending what was queued, at most
	// maxInFlight. The goroutines exit when nothing is queued, so an idle
	// store holds none.
	inFlight int
}

// do sends c, or queues it when the wire is full, and waits for its reply
// or for its context to end. It reports whether c is the caller's again:
// a call given up on while queued still belongs to the queue. The error is
// the context's; each part carries the error of its script call.
func (p *queue) do(c *scriptCall) (bool, error) {
	// The deadline is later than now, or ctx's own: run checks it again.
	if err := c.ctx.Err(); err != nil {
		return true, err
	}
	p.mu.Lock()
	if p.inFlight < maxInFlight {
		p.inFlight++
		p.mu.Unlock()
		buf, _ := p.trips.Get().(*roundTrip)
		if buf == nil {
			buf = new(roundTrip)
		}
		calls := [1]*scriptCall{c}
		ctx, cancel := c.sendCtx()
		p.run(ctx, calls[:], buf)
		cancel()
		if cap(buf.keys) <= maxPooledKeys && cap(buf.parts) <= maxPooledKeys {
			p.trips.Put(buf)
		}
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
	expired := c.expired()
	defer c.stopExpiry()
	select {
	case <-c.done:
		return true, c.err
	case <-c.ctx.Done():
		return false, c.ctx.Err()
	case <-expired:
		return false, context.DeadlineExceeded
	}
}

// roundTrip is the memory of one round trip, reused by the next.
type roundTrip struct {
	// sent are the calls it sends, which it answers when it is over.
	sent  []*scriptCall
	parts []*part
	// runs are the script calls; the parts of runs[i] are
	// parts[ends[i-1]:ends[i]].
	runs []scriptRun
	ends []int
	cmds []*redis.IntSliceCmd
	// keys and args hold the runs that join several parts.
	keys []string
	args []any
}

// send sends what is queued, a round trip at a time, until nothing is. It
// runs as one of the round trips inFlight counts.
func (p *queue) send() {
	var (
		calls []*scriptCall
		buf   roundTrip
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

// runQueued sends queued calls in one round trip, which lasts as long as
// the most patient of them; each caller stops waiting at its own deadline.
func (p *queue) runQueued(calls []*scriptCall, buf *roundTrip) {
	var deadline time.Time
	for _, c := range calls {
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	p.run(ctx, calls, buf)
}

// run sends calls in one round trip under ctx, their parts joined into one
// script call per slot and at most maxScriptKeys keys, then hands every
// call its results. Calls whose context has ended are answered with its
// error and not sent.
func (p *queue) run(ctx context.Context, calls []*scriptCall, buf *roundTrip) {
	buf.parts, buf.sent = buf.parts[:0], buf.sent[:0]
	now := time.Now()
	for _, c := range calls {
		if err := c.ended(now); err != nil {
			c.err = err
			// From here on c is its caller's, who may use it again at
			// once: run must not look at it again.
			c.done <- struct{}{}
			continue
		}
		buf.sent = append(buf.sent, c)
		for i := range c.parts {
			buf.parts = append(buf.parts, &c.parts[i])
		}
	}
	if len(buf.parts) == 0 {
		return
	}
	buf.join()
	wait := p.wait
	if wait != nil && onlyChecks(buf.parts) {
		// Nothing to acknowledge: a WAIT would only cost a round trip
		// the timeout while a replica is down.
		wait = nil
	}
	var unreplicated error
	buf.cmds, unreplicated = evalPipelined(ctx, p.client, script, redis.NewIntSliceCmd, buf.runs, buf.cmds, wait)
	from := 0
	for i, cmd := range buf.cmds {
		split(cmd, buf.parts[from:buf.ends[i]], unreplicated)
		from = buf.ends[i]
	}
	for _, c := range buf.sent {
		c.done <- struct{}{}
	}
	clear(buf.sent)
	clear(buf.parts)
	clear(buf.runs)
	clear(buf.cmds)
	clear(buf.keys)
	clear(buf.args)
}

// join orders the parts by slot, keeping their order within a slot, and
// makes their script calls: one per slot, or more where a slot's parts
// exceed maxScriptKeys.
func (buf *roundTrip) join() {
	slices.SortStableFunc(buf.parts, func(a, b *part) int { return int(a.slot) - int(b.slot) })
	buf.runs, buf.ends = buf.runs[:0], buf.ends[:0]
	buf.keys, buf.args = buf.keys[:0], buf.args[:0]
	for i := 0; i < len(buf.parts); {
		first := buf.parts[i]
		j, keys := i+1, len(first.run.keys)
		for j < len(buf.parts) && buf.parts[j].slot == first.slot && keys+len(buf.parts[j].run.keys) <= maxScriptKeys {
			keys += len(buf.parts[j].run.keys)
			j++
		}
		run := first.run
		if j > i+1 {
			// One part is sent as it is; several one after the other.
			k, a := len(buf.keys), len(buf.args)
			for _, pt := range buf.parts[i:j] {
				buf.keys = append(buf.keys, pt.run.keys...)
				buf.args = append(buf.args, pt.run.args...)
			}
			run = scriptRun{keys: buf.keys[k:], args: buf.args[a:]}
		}
		buf.runs = append(buf.runs, run)
		buf.ends = append(buf.ends, j)
		i = j
	}
}

// onlyChecks reports whether every part is a check, which writes nothing:
// a batch's argument starts with its operation (packBatch).
func onlyChecks(parts []*part) bool {
	for _, pt := range parts {
		if binary.LittleEndian.Uint64(*pt.run.blob) != uint64(opCodes[limiter.Check]) {
			return false
		}
	}
	return true
}

// split hands each part of a script call its share of the reply: its
// status and one TAT per key, in order, and unreplicated, the round
// trip's.
func split(cmd *redis.IntSliceCmd, parts []*part, unreplicated error) {
	reply, err := cmd.Result()
	if err == nil {
		n := 0
		for _, pt := range parts {
			n += 1 + len(pt.run.keys)
		}
		if n != len(reply) {
			err = fmt.Errorf("the script answered %d values for %d batches of %d values", len(reply), len(parts), n)
		}
	}
	for _, pt := range parts {
		pt.unreplicated = unreplicated
		if err != nil {
			pt.reply, pt.err = nil, err
			continue
		}
		n := 1 + len(pt.run.keys)
		pt.reply, pt.err = reply[:n:n], nil
		reply = reply[n:]
	}
}
