package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// batchLua runs one or more batches of buckets, one after the other, each
// in one atomic step: the GCRA steps of limiter.SpendStep, RefundStep and
// SettleStep, line for line, run where the TATs are, so that no other
// request can come between a batch's read and its write. The batches of
// one call are independent requests that the store sent together (queue.go):
// each is all or nothing on its own, exactly as if it were alone, and a
// batch sees what the batches before it in the call wrote, as it would
// had they been separate calls in that order. Each batch brings its own
// now, the time its request was decided at. The script returns only what
// was read and whether it wrote; the store computes the decisions in Go
// from that.
//
// Lua numbers are doubles. Every integer formed here is exact: TATs and
// now are below 2^53 µs (year 2255) and run at most 2·burst·T, below 200
// years, ahead of now; a cost is compared with the burst or with how far a
// TAT may move before it is multiplied, so a product that is formed is
// either exact or, rounding being monotonic, known to be above that
// distance. Writes format numbers with string.format('%d'), which gives a
// whole number's exact digits (tostring would give "1.7e+15" and lose
// digits; TestStoredForm checks the stored form).
//
// KEYS: the keys of every batch, batch after batch.
// ARGV: one per batch, its numbers packed as little-endian 64-bit integers
// (packBatch), which the script reads with Redis's struct library: one
// argument instead of four and five a bucket, which cost Redis and the
// client a string each to write, read and convert. First the operation
// (opCodes: check, spend, refund, settle) and the number of keys n; except
// for a check, then now and the expiry margin, both in µs, and five
// values per key: the interval T in µs, the burst, the cost (for a
// settle, actual - reserved, which may be negative), 1 for a shadow
// bucket, and the bucket's own now in µs, 0 for the batch's (a calendar
// quota's clock is its window's end: see limiter/calendar.go). struct
// reads an integer into a double, as tonumber reads its digits: a cost
// beyond 2^53 rounds alike either way.
// Returns, per batch: 1 when it was written, 0 when not, -1 when a key
// holds something that is no TAT (the batch is then left alone, and the
// key's TAT is -1); then the TAT read of each key, 0 when absent.
const batchLua = `
local reply = {}
local now, margin, batchNow, blob, pos
-- Locals, not globals: every decision calls them, and a global is a
-- table lookup each time.
local call, format, ceil, unpack, spread = redis.call, string.format, math.ceil, struct.unpack, unpack

-- tats holds each key's TAT, 0 when absent and false when the key holds
-- something that is no TAT, as the call found it and as its batches then
-- wrote it. Every key is read by one MGET before the first batch: each
-- command a script calls costs Redis a fixed amount beyond its keys, and
-- one read for the call rather than one a key took 7% off Redis's CPU
-- per decision (BenchmarkApplyMany, docs/performance.md).
local tats = {}
if #KEYS > 0 then
  local values, absent = call('MGET', spread(KEYS)), {}
  for i, key in ipairs(KEYS) do
    local v = values[i]
    if v then
      tats[key] = tonumber(v) or false
    else
      tats[key] = 0
      absent[#absent + 1] = key
    end
  end
  -- MGET reads a key of another type as absent too; EXISTS tells them
  -- apart, in one call while none is there.
  if #absent > 0 and call('EXISTS', spread(absent)) > 0 then
    for _, key in ipairs(absent) do
      if call('EXISTS', key) == 1 then
        tats[key] = false
      end
    end
  end
end

-- The key lives until its bucket is full again, plus the margin that
-- covers the skew between our clocks and the server's. Both numbers are
-- whole and below 2^53, so '%d' writes their exact digits. Given a
-- number, Redis would format it as a double ('%.17g'), which took about
-- 5% of its CPU under make bench's load.
local function put(key, tat)
  call('SET', key, format('%d', tat), 'PXAT', format('%d', ceil((tat + margin) / 1000)))
  tats[key] = tat
end

-- RefundStep on a bucket whose TAT runs ahead of now.
local function refund(key, t, interval, cost)
  local ahead = t - now
  if ahead > 0 then
    -- cost < ceil(ahead / T) is cost * T < ahead; testing cost < ahead
    -- first keeps a huge cost from being multiplied.
    if cost < ahead and cost * interval < ahead then
      put(key, t - cost * interval)
    else
      call('DEL', key)
      tats[key] = 0
    end
  end
end

-- bucket reads the next bucket's numbers from blob at pos, and sets now
-- to its clock.
local function bucket()
  local interval, burst, cost, shadow, clock
  interval, burst, cost, shadow, clock, pos = unpack('<i8i8i8i8i8', blob, pos)
  now = clock
  if now == 0 then
    now = batchNow
  end
  return interval, burst, cost, shadow
end

local SPEND, REFUND, SETTLE = 1, 2, 3
-- spent[i] holds the TAT a spend is to write to its i-th key, false for
-- none; a spend sets every entry up to its n before it reads one.
local spent = {}

-- run runs the batch of op on the n keys after KEYS[k], whose numbers
-- after the head (op, n, now, margin) are in blob from pos on, and
-- appends its status and TATs to reply.
local function run(op, k, n)
  local at = #reply + 1
  reply[at] = 0
  local bad = false
  for i = 1, n do
    local tat = tats[KEYS[k + i]]
    if not tat then
      tat, bad = -1, true
    end
    reply[at + i] = tat
  end
  if bad then
    reply[at] = -1
    return
  end
  if op ~= SPEND and op ~= REFUND and op ~= SETTLE then
    return
  end
  if op == SPEND then
    local allowed = true
    for i = 1, n do
      local interval, burst, cost, shadow = bucket()
      -- max(TAT, now), without a function call.
      local t = reply[at + i]
      if t < now then
        t = now
      end
      -- A cost above the burst, which includes any cost on burst 0, is
      -- denied first; below it, cost * interval is at most the offset.
      local ok = cost <= burst and t + cost * interval - now <= burst * interval
      spent[i] = false
      if ok and cost > 0 then
        spent[i] = t + cost * interval
      elseif not ok and shadow ~= 1 then
        allowed = false
        break
      end
    end
    if not allowed then
      return
    end
    for i = 1, n do
      if spent[i] then
        put(KEYS[k + i], spent[i])
      end
    end
  else
    for i = 1, n do
      local key = KEYS[k + i]
      local interval, burst, cost = bucket()
      local t = reply[at + i]
      if t < now then
        t = now
      end
      if burst > 0 and op == SETTLE and cost > 0 then
        -- The excess is charged past empty, up to one burst of debt.
        local limit = now + 2 * burst * interval
        if t < limit then
          local room = limit - t
          if cost > room or cost * interval > room then
            put(key, limit)
          else
            put(key, t + cost * interval)
          end
        end
      elseif burst > 0 and cost < 0 then
        refund(key, t, interval, -cost)
      elseif burst > 0 and op == REFUND and cost > 0 then
        refund(key, t, interval, cost)
      end
    end
  end
  reply[at] = 1
end

local k = 0
for a = 1, #ARGV do
  local op, n
  blob = ARGV[a]
  if #blob < 32 then
    -- A check's, which has no more.
    op, n, pos = unpack('<i8i8', blob)
  else
    -- now and the margin are read with the rest of the head: each unpack
    -- costs about as much as the arithmetic of a bucket.
    op, n, batchNow, margin, pos = unpack('<i8i8i8i8', blob)
  end
  if op < 0 or op > SETTLE or n < 0 or k + n > #KEYS then
    return redis.error_reply('ERR ratelimitd: a malformed batch')
  end
  run(op, k, n)
  k = k + n
end
return reply
`

// luaScript is a script's text and SHA-1, each converted to an interface
// once, as the arguments of EVAL and EVALSHA.
type luaScript struct {
	src, sha any
}

func newLuaScript(src string) luaScript {
	return luaScript{src: src, sha: redis.NewScript(src).Hash()}
}

// script is the batch script.
var script = newLuaScript(batchLua)

// scriptRun is the keys and arguments of one or more batches: one batch as
// a store builds it, several once the queue puts them into one call.
type scriptRun struct {
	keys []string
	args []any
	// blob is a batch's one argument of the batch script, which args
	// holds: a pointer, so that it goes into an interface without an
	// allocation.
	blob *packed
}

// packed is a batch's numbers as batchLua reads them, little-endian 64-bit
// integers. go-redis writes it through MarshalBinary as one argument.
type packed []byte

// MarshalBinary returns the bytes as they are.
func (p *packed) MarshalBinary() ([]byte, error) { return *p, nil }

// opCodes are the operations as batchLua numbers them.
var opCodes = [...]int64{limiter.Check: 0, limiter.Spend: 1, limiter.Refund: 2, limiter.Settle: 3}

// run returns the script run of op on batch, in r's memory.
func (c *config) run(r scriptRun, op limiter.Op, nowUS int64, batch []limiter.Bucket) scriptRun {
	keys := r.keys[:0]
	for i := range batch {
		keys = append(keys, c.prefix+string(batch[i].Key))
	}
	if r.blob == nil {
		r.blob = new(packed)
	}
	b := packBatch((*r.blob)[:0], op, nowUS, c.marginUS, batch)
	*r.blob = b
	return scriptRun{keys: keys, args: append(r.args[:0], r.blob), blob: r.blob}
}

// packBatch appends the numbers of op on batch to b, in batchLua's order.
func packBatch(b []byte, op limiter.Op, nowUS, marginUS int64, batch []limiter.Bucket) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(opCodes[op]))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(batch)))
	if op == limiter.Check {
		return b
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(nowUS))
	b = binary.LittleEndian.AppendUint64(b, uint64(marginUS))
	for i := range batch {
		bk := &batch[i]
		cost := bk.Cost
		if op == limiter.Settle {
			cost -= bk.Reserved
		}
		var shadow int64
		if bk.Shadow {
			shadow = 1
		}
		for _, v := range [...]int64{bk.Rate.Interval, bk.Rate.Burst, cost, shadow, bk.Now} {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	}
	return b
}

// decide records the TATs of a batch's part of the script's reply in
// batch, whose keys are keys, and decides the batch with
// limiter.StepBatch, which must agree with what the script did.
// unreplicated is the error of a round trip whose writes the replicas did
// not acknowledge, nil otherwise: it fails a batch that took tokens
// (failover.go).
func decide(op limiter.Op, nowUS int64, reply []int64, keys []string, batch []limiter.Bucket, unreplicated error) (bool, error) {
	if len(reply) != len(batch)+1 {
		return false, fmt.Errorf("the script answered %d values for %d buckets", len(reply), len(batch))
	}
	if reply[0] == -1 {
		for i, tat := range reply[1:] {
			if tat == -1 {
				return false, fmt.Errorf("%s holds no TAT", keys[i])
			}
		}
	}
	for i := range batch {
		batch[i].TAT = reply[i+1]
	}
	commit := limiter.StepBatch(op, nowUS, batch)
	if commit != (reply[0] == 1) {
		return false, fmt.Errorf("the script and limiter.StepBatch disagree on a %s: wrote %v, decided %v", op, reply[0] == 1, commit)
	}
	if unreplicated != nil && commit && took(batch) {
		return false, unreplicated
	}
	return commit, nil
}

// took reports whether a batch written moved a TAT forward: it took
// tokens, which a failover must not forget.
func took(batch []limiter.Bucket) bool {
	for i := range batch {
		if batch[i].Next > batch[i].TAT {
			return true
		}
	}
	return false
}

// evalPipelined runs sc once per run, all in one pipeline of client, then
// once more with the script's text, in a second pipeline, for the runs
// whose server did not have it cached (a restart, a failover, SCRIPT
// FLUSH) and so ran nothing. It appends the result of each run to
// cmds[:0], in order, as a command that newCmd made: redis.NewIntSliceCmd
// reads an array of integers without an interface per value. With wait,
// each pipeline ends with WAIT, and the error says whether the replicas
// acknowledged every write of the runs (nil when they did, or without
// wait); client must then send a pipeline on one connection, as a
// *redis.Client does.
func evalPipelined[C redis.Cmder](ctx context.Context, client redis.UniversalClient, sc luaScript, newCmd func(context.Context, ...any) C, runs []scriptRun, cmds []C, wait *replicaWait) ([]C, error) {
	cmds = cmds[:0]
	n := 0
	for _, r := range runs {
		n += 3 + len(r.keys) + len(r.args)
	}
	// The arguments of every command, in one allocation.
	args := make([]any, 0, n)
	if c, ok := client.(*redis.Client); ok && len(runs) == 1 && wait == nil {
		// A lone run on a single node costs less as a plain command.
		cmd := evalCmd(ctx, newCmd, &args, "evalsha", sc.sha, runs[0])
		_ = c.Process(ctx, cmd)
		if isNoScript(cmd.Err()) {
			cmd = evalCmd(ctx, newCmd, &args, "eval", sc.src, runs[0])
			_ = c.Process(ctx, cmd)
		}
		return append(cmds, cmd), nil
	}
	pipe := client.Pipeline()
	for _, r := range runs {
		cmd := evalCmd(ctx, newCmd, &args, "evalsha", sc.sha, r)
		_ = pipe.Process(ctx, cmd)
		cmds = append(cmds, cmd)
	}
	unreplicated := waitIn(ctx, pipe, wait)
	again := false
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			if !again {
				pipe, again = client.Pipeline(), true
			}
			cmds[i] = evalCmd(ctx, newCmd, &args, "eval", sc.src, runs[i])
			_ = pipe.Process(ctx, cmds[i])
		}
	}
	if again {
		// The second pipeline may go on another connection: its own WAIT
		// covers its writes.
		if err := waitIn(ctx, pipe, wait); unreplicated == nil {
			unreplicated = err
		}
	}
	return cmds, unreplicated
}

// waitIn sends pipe, ended by WAIT unless wait is nil, and returns
// whether the replicas acknowledged the pipeline's writes.
func waitIn(ctx context.Context, pipe redis.Pipeliner, wait *replicaWait) error {
	if wait == nil {
		_, _ = pipe.Exec(ctx)
		return nil
	}
	cmd := wait.cmd(ctx)
	_ = pipe.Process(ctx, cmd)
	_, _ = pipe.Exec(ctx)
	return wait.check(cmd)
}

// evalCmd returns the command that runs r by name (EVAL or EVALSHA) with
// script, the text or the SHA-1, its arguments appended to *args. Keys go
// as *string, which go-redis writes and routes as the string, without an
// allocation each.
func evalCmd[C redis.Cmder](ctx context.Context, newCmd func(context.Context, ...any) C, args *[]any, name string, script any, r scriptRun) C {
	from := len(*args)
	a := append(*args, name, script, len(r.keys))
	for i := range r.keys {
		a = append(a, &r.keys[i])
	}
	a = append(a, r.args...)
	*args = a
	cmd := newCmd(ctx, a[from:len(a):len(a)]...)
	if len(r.keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// isNoScript reports that the server does not have the script cached, so
// the script did not run.
func isNoScript(err error) bool {
	// Most calls succeed: nil is answered without the checks, which
	// allocate.
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
