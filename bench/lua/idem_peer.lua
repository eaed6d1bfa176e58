-- The Lua peer of bench/bench.py: the same claim / replay / store against
-- the same Redis, written the way one would with lua-nginx-module and
-- lua-resty-redis (Debian: libnginx-mod-http-lua, lua-nginx-redis).
-- Minimal, but it does the work the module does on each path:
--
--   access phase   key header -> read the body -> fingerprint
--                  (SHA-1 of method, URI and body; scope = MD5 of
--                  Authorization) -> GET record:
--                    done, same fingerprint  -> replay (status,
--                                               Content-Type, body,
--                                               Idempotent-Replayed)
--                    other fingerprint       -> 422
--                    in flight               -> 409
--                    none -> SET NX PX lock_ttl (the claim) -> proxy
--   header/body    copy status, Content-Type and the body chunks
--   log phase      ngx.timer.at(0): SET XX PX ttl the completed record
--                  (or DEL the claim when the status is not stored)
--
-- One cosocket keepalive pool per worker. A record is one Redis string:
--   state (1 byte: I or D) | fingerprint (28 bytes, base64 SHA-1) |
--   status (3 digits) | "\n" | Content-Type | "\n" | body
-- Simplifications that favour the peer (less work than the module): no
-- owner token on the store (SET XX instead of a compare-and-set script),
-- only Content-Type is stored of the headers, no SF-string key parsing.
--
-- nginx.conf (see bench/bench.py):
--   lua_package_path "<bench>/lua/?.lua;;";
--   access_by_lua_block        { require("idem_peer").access() }
--   header_filter_by_lua_block { require("idem_peer").header() }
--   body_filter_by_lua_block   { require("idem_peer").body() }
--   log_by_lua_block           { require("idem_peer").log() }
-- and, at http level,
--   init_by_lua_block { require("idem_peer").configure{ redis_port = N } }

local redis = require "nginx.redis"     -- lua-resty-redis, as Debian names it

local ngx = ngx
local sub, find, byte = string.sub, string.find, string.byte
local concat = table.concat
local tonumber = tonumber
local null = ngx.null

local _M = {}

local PREFIX = "luapeer:"
local LOCK_TTL_MS = 60000
local TTL_MS = 3600000
local POOL_SIZE = 256
local POOL_IDLE_MS = 60000
local redis_host, redis_port = "127.0.0.1", 6379

function _M.configure(opts)
    redis_host = opts.redis_host or redis_host
    redis_port = opts.redis_port or redis_port
end

local function connect()
    local red = redis:new()
    red:set_timeout(1000)
    local ok, err = red:connect(redis_host, redis_port)
    if not ok then
        return nil, err
    end
    return red
end

local function problem(status, title)
    ngx.status = status
    ngx.header["Content-Type"] = "application/problem+json"
    if status == 409 or status == 503 then
        ngx.header["Retry-After"] = "1"
    end
    ngx.print('{"title":"', title, '","status":', status, '}')
    return ngx.exit(status)
end

function _M.access()
    local key = ngx.var.http_idempotency_key
    if not key or key == "" or #key > 255 then
        return
    end

    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if not body then
        local file = ngx.req.get_body_file()
        if file then
            local f = io.open(file, "rb")
            body = f:read("*a")
            f:close()
        else
            body = ""
        end
    end
    local fp = ngx.encode_base64(ngx.sha1_bin(ngx.req.get_method() .. " "
                                 .. ngx.var.request_uri .. "\n" .. body))
    local rkey = PREFIX .. ngx.md5(ngx.var.http_authorization or "") .. ":"
                 .. key

    local red, err = connect()
    if not red then
        ngx.log(ngx.ERR, "redis: ", err)
        return problem(503, "store unavailable")
    end

    local rec
    rec, err = red:get(rkey)
    if not rec then
        ngx.log(ngx.ERR, "redis GET: ", err)
        return problem(503, "store unavailable")
    end

    if rec == null then
        local ok
        ok, err = red:set(rkey, "I" .. fp, "NX", "PX", LOCK_TTL_MS)
        red:set_keepalive(POOL_IDLE_MS, POOL_SIZE)
        if not ok then
            ngx.log(ngx.ERR, "redis SET: ", err)
            return problem(503, "store unavailable")
        end
        if ok == null then          -- another request claimed it first
            return problem(409, "request in progress")
        end
        ngx.ctx.idem = { key = rkey, fp = fp, n = 0, parts = {} }
        return                      -- MISS: on to proxy_pass
    end

    red:set_keepalive(POOL_IDLE_MS, POOL_SIZE)

    if sub(rec, 2, 29) ~= fp then
        return problem(422, "key reused")
    end
    if byte(rec, 1) ~= 68 then      -- not "D": still in flight
        return problem(409, "request in progress")
    end

    -- HIT: replay
    local nl = find(rec, "\n", 34, true)
    ngx.status = tonumber(sub(rec, 30, 32))
    ngx.header["Content-Type"] = sub(rec, 34, nl - 1)
    ngx.header["Idempotent-Replayed"] = "true"
    ngx.print(sub(rec, nl + 1))
    return ngx.exit(ngx.HTTP_OK)
end

function _M.header()
    local c = ngx.ctx.idem
    if not c then
        return
    end
    c.status = ngx.status
    c.ctype = ngx.header["Content-Type"] or ""
end

function _M.body()
    local c = ngx.ctx.idem
    if not c then
        return
    end
    local chunk = ngx.arg[1]
    if chunk ~= "" then
        c.n = c.n + 1
        c.parts[c.n] = chunk
    end
    if ngx.arg[2] then
        c.eof = true
    end
end

local function settle(premature, rkey, value)
    if premature then
        return
    end
    local red, err = connect()
    if not red then
        ngx.log(ngx.ERR, "redis: ", err)
        return
    end
    local ok
    if value then
        ok, err = red:set(rkey, value, "XX", "PX", TTL_MS)
    else
        ok, err = red:del(rkey)
    end
    if not ok then
        ngx.log(ngx.ERR, "redis store: ", err)
        return
    end
    red:set_keepalive(POOL_IDLE_MS, POOL_SIZE)
end

function _M.log()
    local c = ngx.ctx.idem
    if not c then
        return
    end
    local status = c.status or 0
    local value
    if c.eof and status < 500 and status ~= 408 and status ~= 409
       and status ~= 425 and status ~= 429
    then
        value = "D" .. c.fp .. status .. "\n" .. c.ctype .. "\n"
                .. concat(c.parts, "", 1, c.n)
    elseif not c.eof then
        return                      -- cut short: the claim stays
    end
    local ok, err = ngx.timer.at(0, settle, c.key, value)
    if not ok then
        ngx.log(ngx.ERR, "timer: ", err)
    end
end

return _M
