-- Renew step: extends an in-flight claim while its request still runs, so
-- that idempotency_lock_ttl only bounds how long a claim outlives a request
-- that died; only if the claim is still ours.
-- KEYS[1] record key
-- ARGV[1] owner token   ARGV[2] lock TTL in ms
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
    return 0
end
if redis.call('HGET', KEYS[1], 'state') ~= 'inflight' then
    return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
