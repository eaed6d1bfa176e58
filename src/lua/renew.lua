-- Renew step: extends an in-flight claim while its request still runs, so
-- that idempotency_lock_ttl only bounds how long a claim outlives a request
-- that died; only if the record is still the in-flight record this request
-- wrote.
-- KEYS[1] record key
-- ARGV[1] our in-flight record   ARGV[2] lock TTL in ms
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
