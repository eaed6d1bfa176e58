-- Removal (idempotency_admin DELETE): forgets a record in any state, an
-- in-flight claim too, so that the key runs again; with a split record
-- (its body kept apart), the body's chunks too; and tells the nodes'
-- replay caches (idempotency_cache), which listen on ARGV[1] (a
-- "<prefix>purge" channel).  A PUBLISH the ACL refuses does not fail the
-- removal.
-- KEYS[1] record key
-- ARGV[1] channel
-- ARGV[2] the name of a split body's key up to its owner token (the
--         chunks are "<ARGV[2]><owner>:0", ":1" ..., in KEYS[1]'s hash
--         slot); absent for a key whose record is never split
-- ARGV[3] the size of a chunk: a body of N bytes has ceil(N / ARGV[3])
local cur = redis.call('GET', KEYS[1])
local n = redis.call('DEL', KEYS[1])
if cur and ARGV[2] and string.sub(cur, 1, 12) == 'idem1 split ' then
    -- "idem1 split <fp> <owner> <created> <status>\r\n<headers>\r\n<len>"
    local owner = string.match(cur, '^idem1 split %S+ (%S+) ')
    local head = string.find(cur, '\r\n\r\n', 1, true)
    local len = head and tonumber(string.sub(cur, head + 4))
    local size = tonumber(ARGV[3])
    if owner and len and size and size > 0 then
        for i = 0, math.ceil(len / size) - 1 do
            redis.call('DEL', ARGV[2] .. owner .. ':' .. i)
        end
    end
end
if ARGV[1] then
    redis.pcall('PUBLISH', ARGV[1], KEYS[1])
end
return n
