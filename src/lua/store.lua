-- Store step: completes a record, only if the claim is still ours.
-- KEYS[1] record key
-- ARGV[1] owner token   ARGV[2] state ('done' or 'oversize')
-- ARGV[3] status        ARGV[4] headers   ARGV[5] body
-- ARGV[6] TTL in ms
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
    return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'status', ARGV[3],
           'headers', ARGV[4], 'body', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
