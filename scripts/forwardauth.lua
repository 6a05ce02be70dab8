-- forwardauth.lua is the wrk script of `make bench`'s forward-auth runs:
-- each request is a gateway's forward-auth call, GET
-- /v1/forward-auth/bench?d=remote_address, with the token in
-- X-Ratelimit-Authorization and a new client address in X-Forwarded-For,
-- as nginx sends them: wrk connects from loopback, a trusted proxy. The
-- addresses step through 2001:db8::1 .. 2001:db8::<ids>, the bucket ids
-- of the REST runs on bench_allowed_ip, so that both spend the same
-- buckets. Arguments after wrk's "--":
--
--   ids      client addresses, 1 to 65535 (an IPv6 group in hex)
--   token    the secret of a token of scope decide
--   threads  wrk's -t, which a thread cannot see otherwise
--
-- Every answer must be 200 (the limit allows everything). done() prints
-- the line spend.lua prints:
--   result <requests> <seconds> <p50 µs> <p99 µs> <non-2xx> <wrong allowed> <socket errors> <their kinds>

local threads = {}

function setup(thread)
	thread:set("index", #threads)
	table.insert(threads, thread)
end

function init(args)
	ids = tonumber(args[1])
	local nthreads = tonumber(args[3])
	if not ids or ids < 1 or ids > 65535 or not args[2] or not nthreads or nthreads < 1 then
		error("usage: wrk ... -- IDS(1-65535) TOKEN THREADS")
	end
	counter = math.floor(index * ids / nthreads)
	non2xx = 0
	headers = {["X-Ratelimit-Authorization"] = "Bearer " .. args[2]}
end

function request()
	local id = counter % ids + 1
	counter = counter + 1
	headers["X-Forwarded-For"] = string.format("2001:db8::%x", id)
	return wrk.format("GET", "/v1/forward-auth/bench?d=remote_address", headers)
end

function response(status, headers, body)
	if status ~= 200 then
		non2xx = non2xx + 1
	end
end

function done(summary, latency, requests)
	local bad = 0
	for _, t in ipairs(threads) do
		bad = bad + t:get("non2xx")
	end
	local e = summary.errors
	io.write(string.format("result %d %.6f %d %d %d %d %d connect=%d,read=%d,write=%d,timeout=%d\n",
		summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99), bad, 0,
		e.connect + e.read + e.write + e.timeout, e.connect, e.read, e.write, e.timeout))
end
