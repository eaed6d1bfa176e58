-- Removal (idempotency_admin DELETE): forgets a record in any state, an
-- in-flight claim too, so that the key runs again.
-- KEYS[1] record key
return redis.call('DEL', KEYS[1])
