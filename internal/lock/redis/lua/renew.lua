-- renew.lua: compare-and-extend every key of one lease.
--
-- KEYS: two per lock key, in this order:
--   lock  string  the lease (lease.lua)
--   meta  hash    the old layout's metadata (lease.lua)
-- ARGV:
--   1 owner token
--   2 new TTL in milliseconds
--   then two per lock key: release channel, key name (as the caller named it)
-- Returns 0 when the owner held every key and all were extended. Otherwise
-- returns the 1-based index of the first key the owner no longer holds: the
-- lease is lost, so the keys it still held are released (and published as
-- "<key name> <fence>") instead of extended.
local owner, ttl = ARGV[1], ARGV[2]
local tag = leaseTag(owner)
local n = #KEYS / 2
for i = 1, n do
  local v = redis.call('GET', KEYS[2 * i - 1])
  if not heldAs(v, owner, tag) then
    for j = 1, n do
      local fence = releaseHeld(KEYS[2 * j - 1], KEYS[2 * j], owner, tag)
      if fence then
        redis.call('PUBLISH', ARGV[2 * j + 1], ARGV[2 * j + 2] .. ' ' .. fence)
      end
    end
    return i
  end
end
-- The old layout's meta has no TTL either: only lock is extended.
for i = 1, n do
  redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
end
return 0
