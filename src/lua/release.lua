-- Release step: forgets an in-flight claim so that a retry runs again,
-- only if the claim is still ours.
-- KEYS[1] record key
-- ARGV[1] owner token
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
    return 0
end
if redis.call('HGET', KEYS[1], 'state') ~= 'inflight' then
    return 0
end
return redis.call('DEL', KEYS[1])
