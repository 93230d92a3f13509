-- release.lua: compare-and-delete every key the owner token still holds, and
-- tell waiters.
--
-- KEYS: two per lock key, in this order:
--   lock  string  owner token
--   meta  hash    holder, fence, acquired
-- ARGV:
--   1 owner token
--   then two per lock key: release channel, key name (as the caller named it)
-- Publishes "<key name> <fence>" on the channel of each key released.
-- Returns the number of keys released.
local owner = ARGV[1]
local released = 0
for i = 1, #KEYS / 2 do
  local lk, mk = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('GET', lk) == owner then
    local fence = redis.call('HGET', mk, 'fence') or '0'
    redis.call('DEL', lk, mk)
    redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' ' .. fence)
    released = released + 1
  end
end
return released
