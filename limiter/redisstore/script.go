package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// batchLua reads and writes one batch of buckets in one atomic step: the
// GCRA steps of limiter.SpendStep and limiter.RefundStep, line for line,
// run where the TATs are, so that a request costs one round trip and no
// other request can come between the read and the write.
//
// Lua numbers are doubles. Every integer formed here is exact: TATs and
// now are below 2^53 µs (year 2255) and run at most burst·T, below 100
// years, ahead of now; a cost is compared with the burst or with how far a
// TAT runs ahead before it is multiplied, so a product that is formed is
// either exact or, for a refund, known to be far above ahead. Writes format
// with %d: tostring would give "1.7e+15" and lose digits.
//
// KEYS: the buckets' keys.
// ARGV[1]: "read", "spend" or "refund". For spend and refund ARGV[2] is now
// and ARGV[3] the expiry margin, both in µs, then four values per key:
// the interval T in µs, the burst, the cost and "1" for a shadow bucket.
// Returns {1 when the spend or refund was applied, else 0; then the TAT
// read of each key, 0 when absent}.
const batchLua = `
local mode = ARGV[1]
local reply = {0}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  local tat = 0
  if v then
    tat = tonumber(v)
    if not tat then
      return redis.error_reply('ERR ratelimitd: ' .. key .. ' holds no TAT')
    end
  end
  reply[i + 1] = tat
end
if mode == 'read' then
  return reply
end

local now, margin = tonumber(ARGV[2]), tonumber(ARGV[3])

-- The key lives until its bucket is full again, plus the margin that
-- covers the skew between our clocks and the server's.
local function put(key, tat)
  redis.call('SET', key, string.format('%d', tat),
    'PXAT', string.format('%d', math.ceil((tat + margin) / 1000)))
end

if mode == 'spend' then
  local spent = {}
  for i = 1, #KEYS do
    local a = 4 * i
    local interval, burst, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local t = math.max(reply[i + 1], now)
    -- A cost above the burst, which includes any cost on burst 0, is
    -- denied first; below it, cost * interval is at most the offset.
    local allowed = cost <= burst and t + cost * interval - now <= burst * interval
    if allowed and cost > 0 then
      spent[i] = t + cost * interval
    elseif not allowed and ARGV[a + 3] ~= '1' then
      return reply
    end
  end
  for i, tat in pairs(spent) do
    put(KEYS[i], tat)
  end
  reply[1] = 1
  return reply
end

if mode == 'refund' then
  for i, key in ipairs(KEYS) do
    local a = 4 * i
    local interval, burst, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local t = math.max(reply[i + 1], now)
    local ahead = t - now
    if cost > 0 and ahead > 0 and burst > 0 then
      -- RefundStep's cost < ceil(ahead / T) is cost * T < ahead; testing
      -- cost < ahead first keeps a huge cost from being multiplied.
      if cost < ahead and cost * interval < ahead then
        put(key, t - cost * interval)
      else
        redis.call('DEL', key)
      end
    end
  end
  reply[1] = 1
  return reply
end

return redis.error_reply('ERR ratelimitd: unknown mode ' .. tostring(mode))
`

// mode is the script's first argument.
type mode string

const (
	modeRead   mode = "read"
	modeSpend  mode = "spend"
	modeRefund mode = "refund"
)

// args returns the script's ARGV for batch.
func (s *Store) args(m mode, nowUS int64, batch []limiter.Bucket) []any {
	if m == modeRead {
		return []any{string(m)}
	}
	args := make([]any, 0, 3+4*len(batch))
	args = append(args, string(m), nowUS, s.marginUS)
	for i := range batch {
		b := &batch[i]
		shadow := 0
		if b.Shadow {
			shadow = 1
		}
		args = append(args, b.Rate.Interval, b.Rate.Burst, b.Cost, shadow)
	}
	return args
}

// keys returns the Redis keys of batch.
func (s *Store) keys(batch []limiter.Bucket) []string {
	keys := make([]string, len(batch))
	for i := range batch {
		keys[i] = s.prefix + string(batch[i].Key)
	}
	return keys
}

// eval runs the script on batch on a single node or a Sentinel's primary,
// in one round trip while the server has the script cached (else two: the
// script itself is sent then), shared with the calls made meanwhile (see
// pipeline.go), and records the TATs read. It reports whether the script
// applied the batch, false for a denied spend and for a read.
func (s *Store) eval(ctx context.Context, m mode, nowUS int64, batch []limiter.Bucket) (bool, error) {
	c := &scriptCall{ctx: ctx, keys: s.keys(batch), args: s.args(m, nowUS, batch), done: make(chan struct{}, 1)}
	if err := s.pipe.do(c); err != nil {
		return false, err
	}
	return s.record(c.reply, batch)
}

// result records the TATs of the script's reply in batch.
func (s *Store) result(cmd *redis.Cmd, batch []limiter.Bucket) (bool, error) {
	reply, err := cmd.Int64Slice()
	if err != nil {
		return false, err
	}
	return s.record(reply, batch)
}

// record records the TATs of the script's reply in batch and reports
// whether the script applied it.
func (s *Store) record(reply []int64, batch []limiter.Bucket) (bool, error) {
	if len(reply) != len(batch)+1 {
		return false, fmt.Errorf("the script answered %d values for %d buckets", len(reply), len(batch))
	}
	for i := range batch {
		batch[i].TAT = reply[i+1]
	}
	return reply[0] == 1, nil
}

// isNoScript reports that the server does not have the script cached (a
// restart, a failover, SCRIPT FLUSH), so the script did not run.
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}
