-- decisions.lua is the wrk script of make bench's decisions runs: each
-- request to /v1/decisions holds `per` spends of one bucket each of
-- bench_allowed_one, as a client that gathers its callers' calls sends
-- them, the bucket ids stepping through 1..ids, so that every request
-- names new ones. Each answer is checked: every result must say allowed,
-- and not degraded.
-- Arguments after wrk's "--":
--
--   per      spends per request, 1 to 1000
--   ids      bucket ids, 1 to 65535
--   threads  wrk's -t, which a thread cannot see otherwise
--
-- Thread i of n starts at id i*ids/n + 1, so that the threads spread over
-- the buckets from the start.
--
-- done() prints the line spend.lua prints, counting requests, not
-- decisions; a request with a result that did not say allowed counts as
-- one wrong answer.

local threads = {}

function setup(thread)
	thread:set("index", #threads)
	table.insert(threads, thread)
end

function init(args)
	per = tonumber(args[1])
	ids = tonumber(args[2])
	local nthreads = tonumber(args[3])
	if not per or per < 1 or per > 1000 or not ids or ids < 1 or ids > 65535 or not nthreads or nthreads < 1 then
		error("usage: wrk ... -- PER(1-1000) IDS(1-65535) THREADS")
	end
	counter = math.floor(index * ids / nthreads)
	parts = {}
	non2xx = 0
	wrong = 0
	wrk.method = "POST"
	wrk.headers["Content-Type"] = "application/json"
end

function request()
	for i = 1, per do
		parts[i] = '{"op":"spend","buckets":[{"limit":"bench_allowed_one","bucket_id":"' .. (counter % ids + 1) .. '"}]}'
		counter = counter + 1
	end
	return wrk.format(nil, nil, nil, '{"requests":[' .. table.concat(parts, ",") .. ']}')
end

function response(status, headers, body)
	if status < 200 or status > 299 then
		non2xx = non2xx + 1
		return
	end
	-- A degraded answer, the store's timeout passed, is allowed too, but
	-- not decided: it counts as wrong.
	local _, allowed = string.gsub(body, '{"allowed":true,', "")
	local _, decided = string.gsub(body, '"degraded":false,"decisions"', "")
	if allowed ~= per or decided ~= per then
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
