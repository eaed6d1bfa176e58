-- Claim, on a server without "SET ... NX GET" (before Redis 7.0): the
-- same as "SET KEYS[1] ARGV[1] NX GET PX ARGV[5]", which the claim is
-- where the server has it (the handshake's HELLO tells): the record when
-- there is one, changing nothing, else nil, the key then holding ARGV[1]
-- for ARGV[5] ms.
-- KEYS[1] record key
-- ARGV[1] our in-flight record   ARGV[2..4] "NX", "GET", "PX" (unused)
-- ARGV[5] lock TTL in ms
-- pcall: the error of a key that is not a string (WRONGTYPE) is the reply
-- as it is, as SET's would be, not wrapped in a script error as 6.x does.
local cur = redis.pcall('GET', KEYS[1])
if cur then
    return cur
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[5])
return false
