package redisstore

// What a failover does to the store, and what the store does about it.
//
// Redis replicates asynchronously: a primary answers a script before its
// replicas have the script's writes. When Sentinel or a Cluster promotes a
// replica after its primary died, the writes the replica had not received
// are gone, and so are the decisions they recorded: spends, charges,
// quota units and leases answered in the last replication lag (on a
// healthy link, the writes of the last milliseconds before the death).
// Each forgotten spend can be admitted once more, so a failover admits at
// most those writes beyond a limit; a forgotten release or refund only
// keeps units or tokens taken a little longer.
//
// Options.WaitReplicas closes that gap for the writes that take: each
// round trip, which carries the script calls of every decision in flight
// to one server (queue.go), ends with WAIT <replicas> <timeout> on the
// same connection, so one WAIT serves many decisions, and it covers every
// write the connection made before it. A write that took tokens or held
// units (a spend or settle that moved a TAT forward, an acquire that
// acquired, a renewal, a lease record) is answered only when the replicas
// acknowledged it. When they do not within WaitTimeout, the write was
// made on the primary but is not known to survive a failover: the call
// fails with ErrNotReplicated, as a call that timed out after Redis ran
// it, and the fail mode answers (open: allowed, degraded; closed: 503),
// so that a closed service never admits what a failover could forget. A
// denial, a check and a write that only gives back (a refund, a settle
// that returns tokens, a release) is answered as it is: forgetting it
// admits nothing, and failing it would invite a retry that gives back
// twice. Reads (checks, held units) send no WAIT.
//
// On a Cluster, WAIT has no key, and go-redis would route it to any
// master; with the option on, each master's round trips go through that
// master's own client instead of the Cluster's pipeline, so that WAIT
// follows the scripts on their connection. Those round trips do not
// follow MOVED redirects: a call whose slot has just moved fails, and the
// store asks the client to reload its map of the slots, as it does after
// any error a stale map may explain (staleMap).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// ErrNotReplicated reports writes that the primary made but that the
// replicas Options.WaitReplicas asks for did not acknowledge within
// WaitTimeout: a failover may forget them. It is a limiter.ErrNotDurable.
var ErrNotReplicated = fmt.Errorf("%w: the replicas did not acknowledge it in time", limiter.ErrNotDurable)

// replicaWait is what WAIT is sent with, and whether the replicas were
// late at the last WAIT.
type replicaWait struct {
	replicas  int64
	timeoutMS int64
	timeout   time.Duration
	log       *slog.Logger
	late      atomic.Bool
}

func newReplicaWait(replicas int, timeout time.Duration, log *slog.Logger) *replicaWait {
	if timeout <= 0 {
		timeout = DefaultWaitTimeout
	}
	// WAIT takes whole milliseconds, and 0 would wait for ever.
	ms := max(timeout.Milliseconds(), 1)
	return &replicaWait{replicas: int64(replicas), timeoutMS: ms, timeout: time.Duration(ms) * time.Millisecond, log: log}
}

// cmd returns the WAIT command that follows a round trip's scripts.
func (w *replicaWait) cmd(ctx context.Context) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", w.replicas, w.timeoutMS)
}

// check returns nil when cmd, a WAIT answered, says enough replicas
// acknowledged the writes before it, else why not, wrapping
// ErrNotReplicated. It logs when the replicas start being late and when
// they are in time again, once each: the limiter counts the decisions it
// fails, but logs no outage for them (limiter.ErrNotDurable).
func (w *replicaWait) check(cmd *redis.IntCmd) error {
	n, err := cmd.Result()
	switch {
	case err != nil:
		err = fmt.Errorf("%w: WAIT failed: %w", ErrNotReplicated, err)
	case n < w.replicas:
		err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, n, w.replicas, w.timeout)
	default:
		if w.late.Load() && w.late.Swap(false) {
			w.log.Info("the replicas acknowledge writes again", "replicas", w.replicas)
		}
		return nil
	}
	if !w.late.Swap(true) {
		w.log.Warn("the replicas do not acknowledge writes in time: decisions that take are answered by the fail mode",
			"err", err, "replicas", w.replicas, "timeout", w.timeout.String())
	}
	return err
}

// Topology is what a store knows of the primaries its writes go to.
type Topology struct {
	// Primaries are their addresses (host:port), sorted: the one primary
	// of a Node, as last dialled; the masters of a Cluster, as its last
	// Ping found them. Empty before the store first reached one.
	Primaries []string
	// Changes counts the times since the store was made that it saw a
	// primary replaced by another: a Sentinel's failover, at the first
	// connection to the new primary; a Cluster's replica promoted in the
	// place of a master whose calls failed, at the first call that
	// succeeds there (Cluster.observe; a manual failover, which fails no
	// call, is not seen). ChangedAt is when it saw the last, zero before
	// any.
	Changes   int64
	ChangedAt time.Time
	// WaitReplicas is Options.WaitReplicas: the replicas that acknowledge
	// each write that takes, before it is answered.
	WaitReplicas int
}

// primaries records where a store's writes go, and logs each replacement.
type primaries struct {
	log *slog.Logger

	mu        sync.Mutex
	addrs     []string
	changes   int64
	changedAt time.Time
}

// dialed records a connection of a Node to addr: the first gives the
// primary; one to another address means the primary was replaced, as
// after a Sentinel's failover (a lone server restarted keeps its address).
func (p *primaries) dialed(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case len(p.addrs) == 0:
		p.addrs = []string{addr}
	case p.addrs[0] != addr:
		p.replacedLocked(p.addrs[0], addr)
	}
}

// replaced records that to serves what from did.
func (p *primaries) replaced(from, to string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replacedLocked(from, to)
}

func (p *primaries) replacedLocked(from, to string) {
	p.addrs = slices.DeleteFunc(p.addrs, func(a string) bool { return a == from })
	if !slices.Contains(p.addrs, to) {
		p.addrs = append(p.addrs, to)
		slices.Sort(p.addrs)
	}
	p.changes++
	p.changedAt = time.Now()
	p.log.Warn("the store's primary changed", "from", from, "to", to, "changes", p.changes)
}

// set records the primaries a Cluster's Ping found.
func (p *primaries) set(addrs []string) {
	addrs = slices.Sorted(slices.Values(addrs))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addrs = addrs
}

func (p *primaries) topology() Topology {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Topology{Primaries: slices.Clone(p.addrs), Changes: p.changes, ChangedAt: p.changedAt}
}

// dialHook tells primaries the address of every connection a Node's
// client opens: with Sentinel, go-redis dials whichever primary the
// Sentinels name at the time, so a new address is a failover. It costs
// nothing per command.
type dialHook struct{ p *primaries }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err == nil {
			h.p.dialed(conn.RemoteAddr().String())
		}
		return conn, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// staleMap reports whether err may come from a Cluster client's map of
// slots to masters being out of date: a master that does not answer (it
// died, and its replica may have taken its slots) or a redirect. go-redis
// reloads the map by itself only on a redirect it follows and once a
// minute, so without a reload after a master's death the store would go
// on calling it for up to a minute after its replica took over. A call
// cancelled says nothing of its master: the store bounds its own calls
// with deadlines, so only a caller that gave up cancels one.
func staleMap(err error) bool {
	if err == nil || errors.Is(err, ErrNotReplicated) || errors.Is(err, context.Canceled) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	for _, prefix := range [...]string{"MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}
