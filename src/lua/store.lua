-- Store step: completes a record, only if the claim is still ours: the
-- record must still be, byte for byte, the in-flight record this request
-- wrote with its claim (it holds the request's owner token).
-- KEYS[1] record key
-- ARGV[1] our in-flight record   ARGV[2] the complete record
-- ARGV[3] TTL in ms
-- ARGV[4] for a split record only: the key of its body, whose chunks
--         "<ARGV[4]>:0", ":1" ... were written just before (same hash slot)
-- ARGV[5] how many chunks: without every one of them, the head is not
--         stored
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
    if ARGV[4] then
        for i = 0, tonumber(ARGV[5] or '1') - 1 do
            if redis.call('EXISTS', ARGV[4] .. ':' .. i) == 0 then
                return 0
            end
        end
    end
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
end
-- a store sent again after a lost reply, whose first copy did run
if cur == ARGV[2] then
    return 1
end
return 0
