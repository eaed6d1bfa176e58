-- Wake step (idempotency_wait): after a store or a release, tells the
-- waiting duplicates of the record, on every node, that it changed; only
-- when one of them marked it, so that a store nobody waits for publishes
-- nothing.  The mark goes with its PUBLISH: one message per store however
-- many wait.  A PUBLISH the ACL refuses is the reply, an error that nginx
-- logs (the waiters then learn the outcome from their slow poll).
-- KEYS[1] the record's wait mark (in the record's slot)
-- ARGV[1] the record key's hash   ARGV[2] channel ("<prefix>done")
if redis.call('DEL', KEYS[1]) == 0 then
    return 0
end
local r = redis.pcall('PUBLISH', ARGV[2], ARGV[1])
if type(r) == 'table' and r.err then
    return redis.error_reply(r.err)
end
return 1
