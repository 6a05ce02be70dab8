-- apikey.lua is the wrk script of bench.sh's nginx scenario: each request
-- is a POST without a body whose X-Api-Key header steps through k1..k<ids>,
-- as many clients of one API would send, and each answer must be 2xx.
-- Arguments after wrk's "--":
--
--   ids      keys, 1 or more
--   threads  wrk's -t, which a thread cannot see otherwise
--
-- Thread i of n starts at key i*ids/n + 1. done() prints the line that
-- spend.lua prints, which bench.sh reads (no answer is checked for
-- "allowed", so <wrong allowed> is 0):
--   result <requests> <seconds> <p50 µs> <p99 µs> <non-2xx> 0 <socket errors> <their kinds>

local threads = {}

function setup(thread)
	thread:set("index", #threads)
	table.insert(threads, thread)
end

function init(args)
	ids = tonumber(args[1])
	local nthreads = tonumber(args[2])
	if not ids or ids < 1 or not nthreads or nthreads < 1 then
		error("usage: wrk ... -- IDS THREADS")
	end
	counter = math.floor(index * ids / nthreads)
	non2xx = 0
	headers = {}
end

function request()
	headers["X-Api-Key"] = "k" .. (counter % ids + 1)
	counter = counter + 1
	return wrk.format("POST", nil, headers, "")
end

function response(status)
	if status < 200 or status > 299 then
		non2xx = non2xx + 1
	end
end

function done(summary, latency)
	local bad = 0
	for _, t in ipairs(threads) do
		bad = bad + t:get("non2xx")
	end
	local e = summary.errors
	io.write(string.format("result %d %.6f %d %d %d 0 %d connect=%d,read=%d,write=%d,timeout=%d\n",
		summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99), bad,
		e.connect + e.read + e.write + e.timeout, e.connect, e.read, e.write, e.timeout))
end
