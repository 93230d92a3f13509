-- release.lua: compare-and-delete every key the owner still holds, and tell
-- waiters.
--
-- KEYS: the lock key (the lease, lease.lua) of each lock key.
-- ARGV:
--   1 the owner's tag (lease.lua)
--   then two per lock key: release channel, key name (as the caller named it)
-- Publishes "<key name> <fence>" on the channel of each key released.
-- Returns the number of keys released.
local tag = ARGV[1]
local released = 0
for i = 1, #KEYS do
  local fence = releaseHeld(KEYS[i], tag)
  if fence then
    redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' ' .. fence)
    released = released + 1
  end
end
return released
