-- The Lua action of haproxy.cfg: asks ratelimitd's forward-auth route
-- whether a request may pass, with HAProxy's HTTP client (2.6 or later).
--
--   http-request lua.ratelimitd <address> <path and query> <token>
--
-- <address> is where HAProxy's HTTP client connects (haproxy.cfg's
-- listener in front of ratelimitd), <path and query> the route with its d
-- parameters, <token> a ratelimitd token of scope decide. Allowed (2xx):
-- the answer's RateLimit, RateLimit-Policy and X-Ratelimit-Degraded go into
-- the variables txn.ratelimit, txn.ratelimit_policy and
-- txn.ratelimit_degraded, and the request goes on. Denied (429), or the
-- store failed in fail mode closed (503): the client gets that answer.
-- Anything else (ratelimitd unreachable, the token refused, a 4xx naming
-- what it could not read): 503, and a warning in HAProxy's log.

-- Headers of the client's request not copied onto the question: hop-by-hop
-- and framing ones, those set below, and names a client could send to
-- choose its own path or method.
local not_copied = {
    ["connection"] = true, ["keep-alive"] = true, ["te"] = true, ["trailer"] = true,
    ["transfer-encoding"] = true, ["upgrade"] = true, ["content-length"] = true,
    ["proxy-connection"] = true,
    ["x-ratelimit-authorization"] = true, ["x-forwarded-host"] = true,
    ["x-forwarded-method"] = true, ["x-forwarded-uri"] = true,
    ["x-original-method"] = true, ["x-original-uri"] = true,
}

-- The headers of a denial that reach the client.
local passed = { "retry-after", "ratelimit", "ratelimit-policy", "content-type" }

-- values returns the values of one header as HAProxy gives them (indexed
-- from 0) as a Lua list.
local function values(v)
    local list = {}
    for i = 0, #v do
        if v[i] ~= nil then list[#list + 1] = v[i] end
    end
    return list
end

core.register_action("ratelimitd", { "http-req" }, function(txn, address, uri, token)
    local headers, forwarded_for, host = {}, {}, nil
    for name, v in pairs(txn.http:req_get_headers()) do
        if name == "x-forwarded-for" then
            forwarded_for = values(v)
        elseif name == "host" then
            host = v[0]
        elseif not not_copied[name] then
            headers[name] = values(v)
        end
    end
    -- The address the request came from, after those a proxy in front of
    -- HAProxy wrote: ratelimitd believes the entries that
    -- RATELIMIT_TRUSTED_PROXIES vouches for.
    forwarded_for[#forwarded_for + 1] = txn.f:src()
    headers["x-forwarded-for"] = { table.concat(forwarded_for, ", ") }
    headers["x-forwarded-method"] = { txn.f:method() }
    headers["x-forwarded-uri"] = { txn.f:pathq() }
    if host ~= nil then headers["x-forwarded-host"] = { host } end
    -- The token goes in a header of its own, so that the client's
    -- Authorization reaches ratelimitd as sent.
    headers["x-ratelimit-authorization"] = { "Bearer " .. token }

    local res = core.httpclient():get{ url = "http://ratelimitd" .. uri, dst = address, headers = headers }
    local status = res and res.status or 0
    if status >= 200 and status < 300 then
        local h = res.headers or {}
        if h["ratelimit"] then txn:set_var("txn.ratelimit", h["ratelimit"][0]) end
        if h["ratelimit-policy"] then txn:set_var("txn.ratelimit_policy", h["ratelimit-policy"][0]) end
        if h["x-ratelimit-degraded"] then txn:set_var("txn.ratelimit_degraded", h["x-ratelimit-degraded"][0]) end
        return
    end
    local reply = txn:reply()
    if status == 429 or status == 503 then
        reply:set_status(status)
        for _, name in ipairs(passed) do
            local v = res.headers[name]
            if v then reply:add_header(name, v[0]) end
        end
        reply:set_body(res.body or "")
    else
        core.Warning("ratelimitd did not decide: status " .. tostring(status))
        reply:set_status(503)
    end
    txn:done(reply)
end, 3)
