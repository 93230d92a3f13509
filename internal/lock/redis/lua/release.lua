-- release.lua: compare-and-delete every key the owner still holds, and tell
-- waiters.
--
-- KEYS: the lock key (the lease, lease.lua) of each lock key.
-- ARGV:
--   1 the owner's tag (lease.lua)
--   then two per lock key: release channel, key name (as the caller named it)
--   last: the lease's fencing token: only a lease of the owner with a token
--     at most this is released (heldUpTo); a larger one is a later
--     acquisition of the same owner
-- Publishes "<key name> <fence>" on the channel of each key released.
-- Returns the number of keys released.
local tag, maxFence = ARGV[1], tonumber(ARGV[#ARGV])
local released = 0
for i = 1, #KEYS do
  local fence = releaseHeld(KEYS[i], tag, maxFence)
  if fence then
    redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' ' .. fence)
    released = released + 1
  end
end
return released
