-- raise.lua: raise-if-lower of the fence counters (Redlock write-back), so that
-- any later majority of nodes sees the fencing token issued for a lease.
--
-- KEYS: three per lock key, in this order:
--   lock     string  the lease (lease.lua)
--   meta     hash    the old layout's metadata (lease.lua)
--   counter  string  last fencing token issued for the key
-- ARGV:
--   1 fencing token
--   2 owner token
-- Sets each counter to the token when it is lower, and records the token in
-- the leases the owner holds (keeping their TTL). Returns how many keys it
-- holds.
local fence = tonumber(ARGV[1])
local owner = ARGV[2]
local tag = leaseTag(owner)
local held = 0
for i = 1, #KEYS / 3 do
  local lk, c = KEYS[3 * i - 2], tonumber(redis.call('GET', KEYS[3 * i]) or '0')
  if c < fence then redis.call('SET', KEYS[3 * i], ARGV[1]) end
  local v = redis.call('GET', lk)
  local how = heldAs(v, owner, tag)
  if how == 'lease' then
    local _, _, acquired, holder = leaseOf(v)
    local pttl = redis.call('PTTL', lk)
    if acquired and pttl > 0 then
      redis.call('SET', lk, tag .. ARGV[1] .. ' ' .. acquired .. ' ' .. holder, 'PX', pttl)
      held = held + 1
    end
  elseif how == 'old' then
    redis.call('HSET', KEYS[3 * i - 1], 'fence', ARGV[1])
    held = held + 1
  end
end
return held
