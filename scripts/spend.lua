-- spend.lua is the wrk script of `make bench` and `make soak`: each request
-- spends on one or three buckets of the bench limits, its bucket ids
-- stepping through 1..ids, and each answer is checked. Arguments after
-- wrk's "--":
--
--   buckets  1 or 3, or ip: one bucket of bench_KIND_ip, the buckets of
--            forwardauth.lua's client addresses
--   kind     allowed or denied: which set of limits (bench.sh makes both)
--   ids      bucket ids per limit, 1 to 65535 (an IPv6 group in hex)
--   expect   true, false or any: what "allowed" must say in every answer
--   threads  wrk's -t, which a thread cannot see otherwise
--
-- Thread i of n starts at id i*ids/n + 1, so that the threads spread over
-- the buckets from the start.
--
-- done() prints one line for the scripts to read:
--   result <requests> <seconds> <p50 µs> <p99 µs> <non-2xx> <wrong allowed> <socket errors> <their kinds>

local threads = {}

function setup(thread)
	thread:set("index", #threads)
	table.insert(threads, thread)
end

function init(args)
	local n = args[1] == "ip" and "ip" or tonumber(args[1])
	local kind = args[2]
	ids = tonumber(args[3])
	local expect = args[4]
	local nthreads = tonumber(args[5])
	if (n ~= 1 and n ~= 3 and n ~= "ip") or (kind ~= "allowed" and kind ~= "denied") or not ids or ids < 1 or ids > 65535
		or (expect ~= "true" and expect ~= "false" and expect ~= "any") or not nthreads or nthreads < 1 then
		error("usage: wrk ... -- 1|3|ip allowed|denied IDS(1-65535) true|false|any THREADS")
	end
	if expect ~= "any" then
		want = '"allowed":' .. expect
	end
	-- The three-bucket body spends on an IPv6 address and a domain as well,
	-- so that each id format's parsing is in the measure.
	if n == 1 then
		template = '{"buckets":[{"limit":"bench_' .. kind .. '_one","bucket_id":"%d"}]}'
	elseif n == "ip" then
		template = '{"buckets":[{"limit":"bench_' .. kind .. '_ip","bucket_id":"2001:db8::%x"}]}'
	else
		template = '{"buckets":[{"limit":"bench_' .. kind .. '_reg","bucket_id":"%d"},'
			.. '{"limit":"bench_' .. kind .. '_ip","bucket_id":"2001:db8::%x"},'
			.. '{"limit":"bench_' .. kind .. '_domain","bucket_id":"host%d.example.com"}]}'
	end
	counter = math.floor(index * ids / nthreads)
	non2xx = 0
	wrong = 0
	wrk.method = "POST"
	wrk.headers["Content-Type"] = "application/json"
end

function request()
	local id = counter % ids + 1
	counter = counter + 1
	return wrk.format(nil, nil, nil, string.format(template, id, id, id))
end

function response(status, headers, body)
	if status < 200 or status > 299 then
		non2xx = non2xx + 1
	elseif want and not string.find(body, want, 1, true) then
		wrong = wrong + 1
	end
end

function done(summary, latency, requests)
	local bad, wrongs = 0, 0
	for _, t in ipairs(threads) do
		bad = bad + t:get("non2xx")
		wrongs = wrongs + t:get("wrong")
	end
	local e = summary.errors
	io.write(string.format("result %d %.6f %d %d %d %d %d connect=%d,read=%d,write=%d,timeout=%d\n",
		summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99), bad, wrongs,
		e.connect + e.read + e.write + e.timeout, e.connect, e.read, e.write, e.timeout))
end
