-- Inspection (idempotency_admin GET): the start of a record, its size in
-- bytes and its remaining time to live in ms, or nil when there is none.
-- KEYS[1] record key
-- ARGV[1] how many bytes of the record's start to return
local size = redis.call('STRLEN', KEYS[1])
if size == 0 then
    return false
end
return {redis.call('GETRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1), size,
        redis.call('PTTL', KEYS[1])}
