package redisstore

// The leases of concurrency limits, on a Node and on a Cluster alike.
//
// A lease bucket is a sorted set at the bucket's key (Prefix + key; a
// concurrency limit never shares an enum with a rate limit, so the key never
// holds a TAT). Each lease is a member "<lease id>:<cost>" scored by its
// expiry in Unix µs, so that an expired member still tells what it held;
// the member "held", scored by minus the units of all the other members,
// keeps the total at hand, so that an acquire costs O(log n + expired), not
// O(n). An acquire drops the expired members of its buckets and counts
// them (LeaseBucket.Expired), and so does Expire, which the Limiter calls
// for its leases' buckets as they expire; Held, release and renewal drop
// none, so that each is counted once, as the in-process store does. The
// key expires by itself ExpiryMargin after its latest lease, and the set
// goes with its last member: a lease whose Limiter stopped before sweeping
// it, on a bucket no acquire touched meanwhile, goes with the key,
// uncounted.
//
// A lease record is a hash at Prefix + "lease:" + id: the lease's expiry,
// its MaxTTL, and the key ("key:<i>") and cost ("cost:<i>") of each bucket
// it holds. Release and Renew find the buckets from the id through it. It
// expires ExpiryMargin after its lease.
//
// Every step is one call of leaseLua. What is atomic:
//
//   - On a Node, everything. An acquire is one script over its buckets and
//     its record. A release or a renewal reads the record, then runs one
//     script over the record and its buckets, which checks the record
//     again: of a release and a renewal at the same time, one comes
//     wholly first.
//   - On a Cluster, a script touches one hash slot, so the buckets are
//     grouped by slot, as spends are (cluster.go). A batch whose buckets
//     share a slot is exact, as on a Node, and when the record is in that
//     slot too (a Prefix with a hash tag) the acquire is one script.
//     Across slots, each group is acquired on its own, all in one
//     pipeline, and the record is written after them; when a group denies
//     or fails, or the record cannot be written, the lease's members are
//     removed again from every group that did not deny. Until then they
//     hold their units, so a concurrent acquire may be denied spuriously,
//     never admitted beyond a burst. Removing a member that is not there
//     changes nothing, so a failed group is undone too; if the undoing
//     fails, the units stay held until the lease expires.
//   - On a Cluster, a release or a renewal first changes the record, in
//     its slot with whatever buckets share it: whichever of a release and
//     a renewal does so first wins, as on a Node. The other slots follow
//     in one pipeline. When they fail, the release or renewal returns an
//     error with the record already changed: a released lease's units on
//     those slots stay held until it expires, and a renewed lease may
//     expire there at its old time.
//   - Anywhere, an acquire whose script ran but whose answer was lost (a
//     timeout) holds its units until the lease expires: the undo that
//     follows has only what is left of the call's deadline, and the
//     caller, who got an error, releases nothing.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// leaseLua is every step on leases, one operation per call, named by
// ARGV[1]; ARGV[2] and ARGV[3] are now (Unix µs) and the expiry margin
// (µs). A lease is live while its expiry is after now, as LeaseStep has
// it. The script checks that every bucket key holds a sorted set (or
// nothing) before it writes anything, so a key of another type fails the
// call with nothing changed.
//
//   - "held": KEYS are buckets. Returns, per bucket, the units its live
//     leases hold and the expiries of the earliest and latest of them (0
//     when none). Writes nothing.
//   - "acquire": KEYS are n buckets, then perhaps the record. ARGV[4..7]:
//     the lease's expiry, its id, n, its MaxTTL in µs; then per bucket its
//     burst, the cost, and "1" for a shadow bucket. Drops each bucket's
//     expired leases, decides as limiter.LeaseStep does and, when that
//     allows, adds the lease to the buckets that allow its cost, and
//     writes the record if it is among the KEYS. Returns 1 when it
//     acquired, else 0; then per bucket what it held, the earliest and
//     latest expiries, and the expired leases it dropped.
//   - "expire": KEYS are buckets. Drops each bucket's expired leases and
//     returns, per bucket, how many it dropped.
//   - "record": KEYS[1] is the record. ARGV[4..5]: the lease's expiry and
//     MaxTTL; then the key and cost of each bucket it holds. Returns 1.
//   - "release", "renew": KEYS are perhaps the record, then buckets.
//     ARGV[4..6]: the lease id, "1" when KEYS[1] is the record, and for a
//     renewal the new expiry; then the lease's cost in each bucket. With
//     the record, does nothing and returns {0, 0} unless it is live;
//     otherwise deletes it (release) or sets its expiry (renew). Then
//     removes the lease from each bucket, or moves the expiry of its
//     member where it is live. Returns {1, the record's expiry before},
//     0 for the expiry without the record.
const leaseLua = `
local op, now, margin = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function zsets(from, to)
  for i = from, to do
    local t = redis.call('TYPE', KEYS[i]).ok
    if t ~= 'zset' and t ~= 'none' then
      return redis.error_reply('ERR ratelimitd: ' .. KEYS[i] .. ' holds a ' .. t .. ', not leases')
    end
  end
end

-- held returns the units of the bucket's members, expired ones included.
local function held(key)
  local s = redis.call('ZSCORE', key, 'held')
  if s then
    return -tonumber(s)
  end
  return 0
end

-- hold adds units (fewer when negative) to the bucket's total, which goes
-- with its last lease: an empty bucket is no key.
local function hold(key, units)
  local h = held(key) + units
  if h == 0 then
    redis.call('ZREM', key, 'held')
  else
    redis.call('ZADD', key, -h, 'held')
  end
end

-- expire makes the key expire the margin after its latest lease; a key
-- without leases is gone already.
local function expire(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then
    redis.call('PEXPIREAT', key, math.ceil((tonumber(last[2]) + margin) / 1000))
  end
end

-- expired returns how many of the bucket's leases have expired and the
-- units they hold. The total's member has a negative score: it is never
-- among them.
local function expired(key)
  local members = redis.call('ZRANGEBYSCORE', key, 0, now)
  local units = 0
  for _, m in ipairs(members) do
    units = units + tonumber(string.match(m, ':(%d+)$'))
  end
  return #members, units
end

-- live returns the expiries of the bucket's earliest and latest live
-- leases, 0 and 0 when it has none.
local function live(key)
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then
    return 0, 0
  end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return tonumber(first[2]), tonumber(last[2])
end

local function record(key, expires, maxTTL, buckets)
  redis.call('HSET', key, 'expires', expires, 'max_ttl', maxTTL, unpack(buckets))
  redis.call('PEXPIREAT', key, math.ceil((tonumber(expires) + margin) / 1000))
end

if op == 'held' then
  local bad = zsets(1, #KEYS)
  if bad then
    return bad
  end
  local reply = {}
  for i, key in ipairs(KEYS) do
    local _, units = expired(key)
    local earliest, latest = live(key)
    reply[3 * i - 2], reply[3 * i - 1], reply[3 * i] = held(key) - units, earliest, latest
  end
  return reply
end

-- drop drops the bucket's expired leases and returns how many.
local function drop(key)
  local count, units = expired(key)
  if count > 0 then
    redis.call('ZREMRANGEBYSCORE', key, 0, now)
    hold(key, -units)
  end
  return count
end

if op == 'expire' then
  local bad = zsets(1, #KEYS)
  if bad then
    return bad
  end
  local reply = {}
  for i, key in ipairs(KEYS) do
    reply[i] = drop(key)
  end
  return reply
end

if op == 'acquire' then
  local expires, id, n = ARGV[4], ARGV[5], tonumber(ARGV[6])
  local bad = zsets(1, n)
  if bad then
    return bad
  end
  local reply, ok, takes = {0}, true, {}
  for i = 1, n do
    local key, a = KEYS[i], 5 + 3 * i
    local count = drop(key)
    local h = held(key)
    local earliest, latest = live(key)
    local burst, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    -- A cost above the burst, which includes any cost on burst 0, is
    -- denied first, so that the sum below stays exact.
    local allowed = cost <= burst and h + cost <= burst
    if allowed and cost > 0 then
      takes[#takes + 1] = i
    elseif not allowed and ARGV[a + 2] ~= '1' then
      ok = false
    end
    reply[4 * i - 2], reply[4 * i - 1], reply[4 * i], reply[4 * i + 1] = h, earliest, latest, count
  end
  if not ok then
    return reply
  end
  local buckets = {}
  for j, i in ipairs(takes) do
    local key, cost = KEYS[i], ARGV[6 + 3 * i]
    if redis.call('ZADD', key, 'NX', expires, id .. ':' .. cost) == 1 then
      hold(key, tonumber(cost))
    end
    expire(key)
    buckets[4 * j - 3], buckets[4 * j - 2], buckets[4 * j - 1], buckets[4 * j] = 'key:' .. j, key, 'cost:' .. j, cost
  end
  if #KEYS > n then
    record(KEYS[n + 1], expires, ARGV[7], buckets)
  end
  reply[1] = 1
  return reply
end

if op == 'record' then
  local buckets = {}
  for j = 1, (#ARGV - 5) / 2 do
    buckets[4 * j - 3], buckets[4 * j - 2], buckets[4 * j - 1], buckets[4 * j] = 'key:' .. j, ARGV[4 + 2 * j], 'cost:' .. j, ARGV[5 + 2 * j]
  end
  record(KEYS[1], ARGV[4], ARGV[5], buckets)
  return 1
end

if op ~= 'release' and op ~= 'renew' then
  return redis.error_reply('ERR ratelimitd: unknown lease operation ' .. tostring(op))
end
local id, renewTo = ARGV[4], ARGV[6]
local first, was = 1, 0
if ARGV[5] == '1' then
  first = 2
end
local bad = zsets(first, #KEYS)
if bad then
  return bad
end
if first == 2 then
  local expires = redis.call('HGET', KEYS[1], 'expires')
  if not expires or tonumber(expires) <= tonumber(now) then
    return {0, 0}
  end
  was = tonumber(expires)
  if op == 'release' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 'expires', renewTo)
    redis.call('PEXPIREAT', KEYS[1], math.ceil((tonumber(renewTo) + margin) / 1000))
  end
end
for i = first, #KEYS do
  local key, cost = KEYS[i], ARGV[7 + i - first]
  local member = id .. ':' .. cost
  if op == 'release' then
    if redis.call('ZREM', key, member) == 1 then
      hold(key, -tonumber(cost))
      expire(key)
    end
  else
    local s = redis.call('ZSCORE', key, member)
    if s and tonumber(s) > tonumber(now) then
      redis.call('ZADD', key, 'XX', renewTo, member)
      expire(key)
    end
  end
end
return {1, was}
`

// leaseScript is leaseLua, by its SHA-1 once the server holds it.
var leaseScript = newLuaScript(leaseLua)

// leases carries out the lease calls of a store: a Node, whose keys are
// all on one server (slot is always 0), or a Cluster (slot is keySlot).
type leases struct {
	cfg    *config
	client redis.UniversalClient
	slot   func(key string) uint16
	// send runs script calls of leaseScript in one pipeline, each
	// server's ended by WAIT when wait is not nil (evalPipelined).
	send func(ctx context.Context, runs []scriptRun, wait *replicaWait) ([]*redis.Cmd, error)
}

// oneSlot is the slot of every key on a single node.
func oneSlot(string) uint16 { return 0 }

// recordKey returns the key of the record of lease id. Bucket keys start
// with their limit's enum, a digit, so they never meet it.
func (l *leases) recordKey(id string) string { return l.cfg.prefix + "lease:" + id }

// eval runs the script calls in one pipeline (one command on a single
// node). With hold, for calls that take or keep units, it waits for the
// replicas Options.WaitReplicas asks for and says whether they
// acknowledged (failover.go).
func (l *leases) eval(ctx context.Context, runs []scriptRun, hold bool) ([]*redis.Cmd, error) {
	if len(runs) == 0 {
		return nil, nil
	}
	var wait *replicaWait
	if hold {
		wait = l.cfg.wait
	}
	return l.send(ctx, runs, wait)
}

// Acquire implements limiter.LeaseStore, as the top of this file
// describes.
func (l *leases) Acquire(ctx context.Context, now time.Time, rec *limiter.LeaseRecord, batch []limiter.LeaseBucket) (bool, error) {
	var ok bool
	err := l.cfg.bounded(ctx, "acquire", func(ctx context.Context) error {
		var err error
		ok, err = l.acquireIn(ctx, now.UnixMicro(), rec, batch)
		return err
	})
	return ok, err
}

// acquireIn acquires the lease on the groups of the batch's buckets by
// slot, as the top of this file describes.
func (l *leases) acquireIn(ctx context.Context, nowUS int64, rec *limiter.LeaseRecord, batch []limiter.LeaseBucket) (bool, error) {
	keys := l.bucketKeys(batch)
	groups := bySlot(keys, l.slot)
	recKey := l.recordKey(rec.ID)
	// The record joins the only group when it shares its slot: the
	// acquire is then one atomic step.
	withRecord := len(groups) == 1 && l.slot(recKey) == l.slot(keys[0])
	runs := make([]scriptRun, len(groups))
	for i, pos := range groups {
		r := scriptRun{args: []any{"acquire", nowUS, l.cfg.marginArg, rec.Expires, rec.ID, len(pos), rec.MaxTTL.Microseconds()}}
		for _, p := range pos {
			b := &batch[p]
			shadow := 0
			if b.Shadow {
				shadow = 1
			}
			r.keys = append(r.keys, keys[p])
			r.args = append(r.args, b.Burst, b.Cost, shadow)
		}
		if withRecord {
			r.keys = append(r.keys, recKey)
		}
		runs[i] = r
	}
	cmds, unreplicated := l.eval(ctx, runs, true)
	errs := make([]error, len(groups))
	// undo marks the groups that may hold the lease's units.
	undo := make([]bool, len(groups))
	denied := false
	for i, pos := range groups {
		acquired, err := readAcquire(cmds[i], nowUS, rec.Expires, batch, pos)
		if acquired && err == nil {
			// Units the replicas may not have: not acquired, as far
			// as the caller knows (failover.go).
			err = unreplicated
		}
		errs[i], undo[i] = err, acquired || err != nil
		denied = denied || !acquired && err == nil
	}
	ok := limiter.LeaseStep(nowUS, rec.Expires, batch)
	err := slotErrors(errs)
	// recorded tells whether the record may have been written: by a
	// script whose answer was lost, or by writeRecord.
	recorded := withRecord && err != nil
	rec.Keys, rec.Costs = rec.Keys[:0], rec.Costs[:0]
	if ok && err == nil {
		for i := range batch {
			if b := &batch[i]; b.Takes() {
				rec.Keys = append(rec.Keys, string(b.Key))
				rec.Costs = append(rec.Costs, b.Cost)
			}
		}
		if withRecord {
			return true, nil
		}
		// No one can release the lease before this returns its id, so
		// the record may follow the buckets.
		if err, recorded = l.writeRecord(ctx, rec), true; err == nil {
			return true, nil
		}
	}
	if undoErr := l.undo(ctx, rec, keys, batch, groups, undo, recorded); undoErr != nil && err != nil {
		err = fmt.Errorf("%w; taking the lease back failed too: %v", err, undoErr)
	}
	rec.Keys, rec.Costs = rec.Keys[:0], rec.Costs[:0]
	if denied {
		// A denial stands even when a slot failed: failing open on the
		// error would admit the batch.
		return false, nil
	}
	return false, err
}

// readAcquire records what a group's acquire read in the group's buckets
// of batch, at pos, and reports whether it acquired, which must be what
// limiter.LeaseStep decides on the group. A group that failed reads as
// holding nothing.
func readAcquire(cmd *redis.Cmd, nowUS, expires int64, batch []limiter.LeaseBucket, pos []int) (bool, error) {
	reply, err := cmd.Int64Slice()
	if err == nil && len(reply) != 1+4*len(pos) {
		err = fmt.Errorf("the lease script answered %d values for %d buckets", len(reply), len(pos))
	}
	group := make([]limiter.LeaseBucket, len(pos))
	for j, p := range pos {
		b := &batch[p]
		b.Held, b.Earliest, b.Latest, b.Expired = 0, 0, 0, 0
		if err == nil {
			b.Held, b.Earliest, b.Latest, b.Expired = reply[1+4*j], reply[2+4*j], reply[3+4*j], reply[4+4*j]
		}
		group[j] = *b
	}
	if err != nil {
		return false, err
	}
	acquired := reply[0] == 1
	if decided := limiter.LeaseStep(nowUS, expires, group); decided != acquired {
		return false, fmt.Errorf("the lease script and limiter.LeaseStep disagree: acquired %v, decided %v", acquired, decided)
	}
	return acquired, nil
}

// writeRecord writes the record of a lease acquired on several slots.
func (l *leases) writeRecord(ctx context.Context, rec *limiter.LeaseRecord) error {
	r := scriptRun{keys: []string{l.recordKey(rec.ID)}, args: []any{"record", 0, l.cfg.marginArg, rec.Expires, rec.MaxTTL.Microseconds()}}
	for i, k := range rec.Keys {
		r.args = append(r.args, l.cfg.prefix+k, rec.Costs[i])
	}
	cmds, unreplicated := l.eval(ctx, []scriptRun{r}, true)
	if err := cmds[0].Err(); err != nil {
		return err
	}
	return unreplicated
}

// undo removes lease rec from the buckets of the groups marked in undo,
// and its record when it may have been written, all in one pipeline.
func (l *leases) undo(ctx context.Context, rec *limiter.LeaseRecord, keys []string, batch []limiter.LeaseBucket, groups [][]int, undo []bool, record bool) error {
	var runs []scriptRun
	for i, pos := range groups {
		if !undo[i] {
			continue
		}
		r := scriptRun{args: []any{"release", 0, l.cfg.marginArg, rec.ID, 0, 0}}
		for _, p := range pos {
			r.keys = append(r.keys, keys[p])
			r.args = append(r.args, batch[p].Cost)
		}
		runs = append(runs, r)
	}
	if record {
		runs = append(runs, scriptRun{keys: []string{l.recordKey(rec.ID)}, args: []any{"release", 0, l.cfg.marginArg, rec.ID, 1, 0}})
	}
	// Forgetting an undo only holds units until the lease expires: it
	// waits for no replica.
	cmds, _ := l.eval(ctx, runs, false)
	errs := make([]error, 0, len(runs))
	for _, cmd := range cmds {
		errs = append(errs, cmd.Err())
	}
	return slotErrors(errs)
}

// bucketKeys returns the Redis keys of the batch's buckets.
func (l *leases) bucketKeys(batch []limiter.LeaseBucket) []string {
	keys := make([]string, len(batch))
	for i := range batch {
		keys[i] = l.cfg.prefix + string(batch[i].Key)
	}
	return keys
}

// slotRuns groups keys by slot, as the positions in keys of each group,
// and makes one script call of op per group that takes nothing but the
// time and the margin besides its keys.
func (l *leases) slotRuns(op string, now time.Time, keys []string) ([][]int, []scriptRun) {
	groups := bySlot(keys, l.slot)
	runs := make([]scriptRun, len(groups))
	for i, pos := range groups {
		runs[i].args = []any{op, now.UnixMicro(), l.cfg.marginArg}
		for _, p := range pos {
			runs[i].keys = append(runs[i].keys, keys[p])
		}
	}
	return groups, runs
}

// Held implements limiter.LeaseStore; on a Cluster the slots may be read
// at slightly different instants.
func (l *leases) Held(ctx context.Context, now time.Time, batch []limiter.LeaseBucket) error {
	if len(batch) == 0 {
		return nil
	}
	return l.cfg.bounded(ctx, "held", func(ctx context.Context) error {
		groups, runs := l.slotRuns("held", now, l.bucketKeys(batch))
		errs := make([]error, len(groups))
		cmds, _ := l.eval(ctx, runs, false)
		for i, cmd := range cmds {
			reply, err := cmd.Int64Slice()
			if err == nil && len(reply) != 3*len(groups[i]) {
				err = fmt.Errorf("the lease script answered %d values for %d buckets", len(reply), len(groups[i]))
			}
			for j, p := range groups[i] {
				b := &batch[p]
				b.Held, b.Earliest, b.Latest = 0, 0, 0
				if err == nil {
					b.Held, b.Earliest, b.Latest = reply[3*j], reply[3*j+1], reply[3*j+2]
				}
			}
			errs[i] = err
		}
		return slotErrors(errs)
	})
}

// Expire implements limiter.LeaseStore; on a Cluster, one script call per
// slot, all in one pipeline.
func (l *leases) Expire(ctx context.Context, now time.Time, keys []string) ([]int64, error) {
	out := make([]int64, len(keys))
	err := l.cfg.bounded(ctx, "expire", func(ctx context.Context) error {
		groups, runs := l.slotRuns("expire", now, l.cfg.fullKeys(keys))
		errs := make([]error, len(groups))
		// Dropping leases that expired gives nothing a failover could
		// cost: it waits for no replica.
		cmds, _ := l.eval(ctx, runs, false)
		for i, cmd := range cmds {
			reply, err := cmd.Int64Slice()
			if err == nil && len(reply) != len(groups[i]) {
				err = fmt.Errorf("the lease script answered %d values for %d buckets", len(reply), len(groups[i]))
			}
			if err == nil {
				for j, p := range groups[i] {
					out[p] = reply[j]
				}
			}
			errs[i] = err
		}
		return slotErrors(errs)
	})
	return out, err
}

// Release implements limiter.LeaseStore.
func (l *leases) Release(ctx context.Context, now time.Time, id string) (limiter.LeaseRecord, error) {
	var (
		rec   limiter.LeaseRecord
		found bool
	)
	err := l.cfg.bounded(ctx, "release", func(ctx context.Context) error {
		var err error
		if rec, found, err = l.read(ctx, now.UnixMicro(), id); err != nil || !found {
			return err
		}
		found, rec.Expires, err = l.change(ctx, "release", now.UnixMicro(), rec, 0)
		return err
	})
	switch {
	case err != nil:
		return limiter.LeaseRecord{}, err
	case !found:
		return limiter.LeaseRecord{}, limiter.ErrLeaseNotFound
	}
	return rec, nil
}

// Renew implements limiter.LeaseStore.
func (l *leases) Renew(ctx context.Context, now time.Time, id string, expires func(limiter.LeaseRecord) (int64, error)) (limiter.LeaseRecord, error) {
	var (
		rec   limiter.LeaseRecord
		found bool
		// refused is expires' error, which is the caller's, not Redis'.
		refused error
	)
	err := l.cfg.bounded(ctx, "renew", func(ctx context.Context) error {
		var err error
		if rec, found, err = l.read(ctx, now.UnixMicro(), id); err != nil || !found {
			return err
		}
		until, err := expires(rec)
		if err != nil {
			refused = err
			return nil
		}
		found, rec.Expires, err = l.change(ctx, "renew", now.UnixMicro(), rec, until)
		return err
	})
	switch {
	case err != nil:
		return limiter.LeaseRecord{}, err
	case refused != nil:
		return limiter.LeaseRecord{}, refused
	case !found:
		return limiter.LeaseRecord{}, limiter.ErrLeaseNotFound
	}
	return rec, nil
}

// read returns the record of lease id, and false when there is none or
// its lease expired by nowUS.
func (l *leases) read(ctx context.Context, nowUS int64, id string) (limiter.LeaseRecord, bool, error) {
	key := l.recordKey(id)
	var cmd *redis.MapStringStringCmd
	// A pipeline, even of one command, as everywhere on a Cluster
	// (Cluster.pipeline says why).
	_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = p.HGetAll(ctx, key)
		return nil
	})
	fields, err := cmd.Result()
	if err != nil || len(fields) == 0 {
		return limiter.LeaseRecord{}, false, err
	}
	rec := limiter.LeaseRecord{ID: id}
	expires, err1 := strconv.ParseInt(fields["expires"], 10, 64)
	maxTTL, err2 := strconv.ParseInt(fields["max_ttl"], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return limiter.LeaseRecord{}, false, fmt.Errorf("the lease record %s: %w", key, err)
	}
	rec.Expires, rec.MaxTTL = expires, time.Duration(maxTTL)*time.Microsecond
	for i := 1; ; i++ {
		full, ok := fields["key:"+strconv.Itoa(i)]
		if !ok {
			break
		}
		k, prefixed := strings.CutPrefix(full, l.cfg.prefix)
		cost, err := strconv.ParseInt(fields["cost:"+strconv.Itoa(i)], 10, 64)
		if !prefixed || err != nil {
			return limiter.LeaseRecord{}, false, fmt.Errorf("the lease record %s holds a bucket %q of cost %q", key, full, fields["cost:"+strconv.Itoa(i)])
		}
		rec.Keys, rec.Costs = append(rec.Keys, k), append(rec.Costs, cost)
	}
	return rec, rec.Expires > nowUS, nil
}

// change releases or renews (to until) lease rec on its record and
// buckets, as the top of this file describes, and reports whether the
// record was live, and its expiry before the change.
func (l *leases) change(ctx context.Context, op string, nowUS int64, rec limiter.LeaseRecord, until int64) (bool, int64, error) {
	// The record comes first, so it leads the first group.
	keys := append([]string{l.recordKey(rec.ID)}, l.cfg.fullKeys(rec.Keys)...)
	groups := bySlot(keys, l.slot)
	runs := make([]scriptRun, len(groups))
	for i, pos := range groups {
		withRecord := 0
		if i == 0 {
			withRecord = 1
		}
		r := scriptRun{args: []any{op, nowUS, l.cfg.marginArg, rec.ID, withRecord, until}}
		for _, p := range pos {
			r.keys = append(r.keys, keys[p])
			if p > 0 {
				r.args = append(r.args, rec.Costs[p-1])
			}
		}
		runs[i] = r
	}
	// A renewal keeps units, which a failover must not forget; a release
	// forgotten only holds them until the lease expires.
	renew := op == "renew"
	first, unreplicated := l.eval(ctx, runs[:1], renew)
	reply, err := first[0].Int64Slice()
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("the lease script answered %d values, not 2", len(reply))
	}
	if err != nil || reply[0] == 0 {
		return false, 0, err
	}
	rest, restUnreplicated := l.eval(ctx, runs[1:], renew)
	errs := make([]error, 0, len(runs)-1)
	for _, cmd := range rest {
		errs = append(errs, cmd.Err())
	}
	err = slotErrors(errs)
	if err == nil {
		err = cmp.Or(unreplicated, restUnreplicated)
	}
	return true, reply[1], err
}
