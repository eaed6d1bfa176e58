-- Release step: forgets an in-flight claim so that a retry runs again,
-- only if the record is still the in-flight record this request wrote.
-- KEYS[1] record key
-- ARGV[1] our in-flight record
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
return redis.call('DEL', KEYS[1])
