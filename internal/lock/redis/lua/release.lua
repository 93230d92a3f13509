-- release.lua: compare-and-delete every key the owner token still holds, and
-- tell waiters.
--
-- KEYS: two per lock key, in this order:
--   lock  string  the lease (lease.lua)
--   meta  hash    the old layout's metadata (lease.lua)
-- ARGV:
--   1 owner token
--   then two per lock key: release channel, key name (as the caller named it)
-- Publishes "<key name> <fence>" on the channel of each key released.
-- Returns the number of keys released.
local owner = ARGV[1]
local tag = leaseTag(owner)
local released = 0
for i = 1, #KEYS / 2 do
  local fence = releaseHeld(KEYS[2 * i - 1], KEYS[2 * i], owner, tag)
  if fence then
    redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' ' .. fence)
    released = released + 1
  end
end
return released
