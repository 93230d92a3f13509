-- raise.lua: raise-if-lower of the fence counters (Redlock write-back), so that
-- any later majority of nodes sees the fencing token issued for a lease.
--
-- KEYS: three per lock key, in this order:
--   lock       string  the lease (lease.lua)
--   counter    string  last fencing token issued for the key
--   preempted  string  largest fencing token a request with Preempt stopped
-- ARGV:
--   1 fencing token
--   2 the owner's tag (lease.lua)
--   3 the token this node issued to the acquisition being written back, when
--     it is larger than ARGV 1 (a late grant from a node that was ahead), or 0
-- Sets each counter to the token when it is lower (a counter that is not a
-- number counts as none), and records the token in the leases the owner holds
-- with a token at most this one, or with ARGV 3 (keeping their TTL): another
-- larger token is a later acquisition of the same owner, whose token a late
-- write-back of an earlier one must not lower. A lease preempted meanwhile
-- (its old token at or below the key's mark) stays preempted: the mark is
-- raised to the new token. Returns how many keys it holds so.
local fence = tonumber(ARGV[1])
local tag = ARGV[2]
local issued = tonumber(ARGV[3]) or 0
local held = 0
for i = 1, #KEYS / 3 do
  local lk, ck, pk = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local c = tonumber(redis.call('GET', ck) or '0') or 0
  if c < fence then redis.call('SET', ck, ARGV[1]) end
  local v = redis.call('GET', lk)
  local f = heldToken(v, tag)
  if f and (f <= fence or f == issued) then
    local _, _, acquired, holder = leaseOf(v)
    local pttl = redis.call('PTTL', lk)
    if acquired and pttl > 0 then
      redis.call('SET', lk, tag .. ARGV[1] .. ' ' .. acquired .. ' ' .. holder, 'PX', pttl)
      local mark = tonumber(redis.call('GET', pk) or '')
      if mark and f <= mark and mark < fence then
        redis.call('SET', pk, ARGV[1], 'PX', math.max(pttl, redis.call('PTTL', pk)))
      end
      held = held + 1
    end
  end
end
return held
