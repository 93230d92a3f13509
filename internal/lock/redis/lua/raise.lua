-- raise.lua: raise-if-lower of the fence counters (Redlock write-back), so that
-- any later majority of nodes sees the fencing token issued for a lease.
--
-- KEYS: three per lock key, in this order:
--   lock     string  owner token
--   meta     hash    holder, fence, acquired
--   counter  string  last fencing token issued for the key
-- ARGV:
--   1 fencing token
--   2 owner token
-- Sets each counter to the token when it is lower, and records the token in the
-- lease metadata of the keys the owner holds. Returns how many keys it holds.
local fence = tonumber(ARGV[1])
local held = 0
for i = 1, #KEYS / 3 do
  local c = tonumber(redis.call('GET', KEYS[3 * i]) or '0')
  if c < fence then redis.call('SET', KEYS[3 * i], ARGV[1]) end
  if redis.call('GET', KEYS[3 * i - 2]) == ARGV[2] then
    redis.call('HSET', KEYS[3 * i - 1], 'fence', ARGV[1])
    held = held + 1
  end
end
return held
