-- renew.lua: compare-and-extend every key of one lease.
--
-- KEYS: the lock key (the lease, lease.lua) of each lock key.
-- ARGV:
--   1 the owner's tag (lease.lua)
--   2 new TTL in milliseconds
--   then two per lock key: release channel, key name (as the caller named it)
--   last: the lease's fencing token: a lease of the owner with a larger
--     token is a later acquisition, not this one (heldUpTo)
-- Returns 0 when the owner held every key and all were extended. Otherwise
-- returns the 1-based index of the first key the owner no longer holds: the
-- lease is lost, so the keys it still held are released (and published as
-- "<key name> <fence>") instead of extended.
local tag, ttl, maxFence = ARGV[1], ARGV[2], tonumber(ARGV[#ARGV])
local n = #KEYS
for i = 1, n do
  if not heldUpTo(redis.call('GET', KEYS[i]), tag, maxFence) then
    for j = 1, n do
      local fence = releaseHeld(KEYS[j], tag, maxFence)
      if fence then
        redis.call('PUBLISH', ARGV[2 * j + 1], ARGV[2 * j + 2] .. ' ' .. fence)
      end
    end
    return i
  end
end
for i = 1, n do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 0
