-- A completed record and its remaining time to live, read together for a
-- node's replay cache (idempotency_cache): the entry lives no longer than
-- the record.
-- KEYS[1] record key
local v = redis.call('GET', KEYS[1])
if not v then
    return false
end
return {v, redis.call('PTTL', KEYS[1])}
