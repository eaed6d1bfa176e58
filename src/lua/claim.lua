-- Claim step: decides MISS / HIT / CONFLICT / MISMATCH for one record.
-- KEYS[1] record key
-- ARGV[1] request fingerprint   ARGV[2] owner token
-- ARGV[3] lock TTL in ms         ARGV[4] creation time (unix seconds)
local rec = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status',
                       'headers', 'body')
if not rec[1] then
    redis.call('HSET', KEYS[1], 'state', 'inflight', 'fp', ARGV[1],
               'owner', ARGV[2], 'created', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {'MISS'}
end
if rec[2] ~= ARGV[1] then
    return {'MISMATCH', rec[1]}
end
if rec[1] == 'inflight' then
    return {'CONFLICT', redis.call('PTTL', KEYS[1])}
end
if rec[1] == 'oversize' then
    return {'OVERSIZE', rec[3] or '0'}
end
return {'HIT', rec[3], rec[4], rec[5]}
