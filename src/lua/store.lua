-- Store step: completes a record, only if the claim is still ours: the
-- record must still be, byte for byte, the in-flight record this request
-- wrote with its claim (it holds the request's owner token).
-- KEYS[1] record key
-- ARGV[1] our in-flight record   ARGV[2] the complete record
-- ARGV[3] TTL in ms
-- ARGV[4] for a split record only: the key of its body, whose chunks
--         "<ARGV[4]>:0", ":1" ... were written just before (same hash slot)
-- ARGV[5] how many chunks: without every one of them, the head is not
--         stored
-- Returns 1 when stored (or when a first copy of this store was), else
-- why not: 0 the key is gone, 2 it holds another request's claim or
-- record, 3 a chunk is missing.  Each chunk gets the head's TTL plus a
-- minute here, with the head, so that no chunk expires before its head
-- (they were written with it, maybe long before).  A refused store removes
-- its chunks: they are this request's alone (the body key holds its owner
-- token), no head will ever name them.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[2] then
    return 1
end
local n = ARGV[4] and tonumber(ARGV[5] or '1') or 0
local rc = 0
if cur == ARGV[1] then
    local ttl = tonumber(ARGV[3]) + 60000
    rc = 1
    for i = 0, n - 1 do
        if redis.call('PEXPIRE', ARGV[4] .. ':' .. i, ttl) == 0 then
            rc = 3
            break
        end
    end
    if rc == 1 then
        redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
        return 1
    end
elseif cur then
    rc = 2
end
for i = 0, n - 1 do
    redis.call('DEL', ARGV[4] .. ':' .. i)
end
return rc
