-- Removal (idempotency_admin DELETE): forgets a record in any state, an
-- in-flight claim too, so that the key runs again; and tells the nodes'
-- replay caches (idempotency_cache), which listen on ARGV[1] (a
-- "<prefix>purge" channel).  A PUBLISH the ACL refuses does not fail the
-- removal.
-- KEYS[1] record key
-- ARGV[1] channel
local n = redis.call('DEL', KEYS[1])
if ARGV[1] then
    redis.pcall('PUBLISH', ARGV[1], KEYS[1])
end
return n
