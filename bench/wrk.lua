-- The load shape of every scenario of bench/bench.py, for Debian's wrk.
--
--   wrk -t T -c C -d D -s bench/wrk.lua URL -- MODE KEYS RUNID BODYFILE [DELAY_MS]
--
-- Every request is the same POST: a ~1 KiB JSON body (BODYFILE),
-- Content-Type, a constant Authorization (the module's default scope) and
-- an Idempotency-Key:
--   cycle   KEYS keys "<RUNID>-<n>", n = 0..KEYS-1, round-robin (each
--           thread starts at its own offset); the requests are built once
--           in init(), request() only picks the next one;
--   unique  a new key per request, "<RUNID>-<thread>-<counter>".
-- The ceiling and the baseline use `cycle` too (their servers ignore the
-- key), so the load generator does the same work in every scenario.
-- DELAY_MS > 0: each connection waits that long before each request (the
-- "moderate load" runs). done() prints one machine-readable RESULT line.

local threads = {}

function setup(thread)
    thread:set("tid", #threads)
    table.insert(threads, thread)
end

local mode, prefix, suffix, reqs, nreqs, i

function init(args)
    mode = args[1] or "cycle"
    local keys = tonumber(args[2] or "256")
    local runid = args[3] or "bench"
    local f = assert(io.open(args[4], "rb"))
    local body = f:read("*a")
    f:close()
    local delay_ms = tonumber(args[5] or "0")
    if delay_ms > 0 then
        delay = function() return delay_ms end
    end

    local headers = {
        ["Content-Type"] = "application/json",
        ["Authorization"] = "Bearer bench-client",
        ["Idempotency-Key"] = "\1",
    }
    local template = wrk.format("POST", nil, headers, body)
    local at = template:find("\1", 1, true)
    prefix, suffix = template:sub(1, at - 1), template:sub(at + 1)

    i = 0
    if mode == "unique" then
        prefix = prefix .. runid .. "-" .. tostring(tid or 0) .. "-"
    else
        reqs, nreqs = {}, keys
        for n = 0, keys - 1 do
            reqs[n] = prefix .. runid .. "-" .. n .. suffix
        end
        -- threads start at different keys, so two threads never send the
        -- same key at the same moment
        i = math.floor((tid or 0) * keys / 7) % keys
    end
end

function request()
    if mode == "unique" then
        i = i + 1
        return prefix .. i .. suffix
    end
    local r = reqs[i]
    i = i + 1
    if i == nreqs then i = 0 end
    return r
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "RESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d " ..
        "write=%d status=%d timeout=%d p50=%d p90=%d p99=%d max=%d " ..
        "mean=%.1f\n",
        summary.requests, summary.duration, summary.bytes, e.connect,
        e.read, e.write, e.status, e.timeout, latency:percentile(50),
        latency:percentile(90), latency:percentile(99), latency.max,
        latency.mean))
end
