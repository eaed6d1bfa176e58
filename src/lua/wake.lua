-- Wake step (idempotency_wait): after a store or a release, tells the
-- waiting duplicates of the record, on every node, that it changed; only
-- when one of them marked it, so that a store nobody waits for publishes
-- nothing.  The mark goes with its PUBLISH: one message per store however
-- many wait.  A PUBLISH the ACL refuses does not fail the step (waiters
-- then learn it from their slow poll).
-- KEYS[1] the record's wait mark (in the record's slot)
-- ARGV[1] channel ("<prefix>done")   ARGV[2] the record key's hash
if redis.call('DEL', KEYS[1]) == 0 then
    return 0
end
redis.pcall('PUBLISH', ARGV[1], ARGV[2])
return 1
