-- renew.lua: compare-and-extend every key of one lease.
--
-- KEYS: two per lock key, in this order:
--   lock       string  the lease (lease.lua)
--   preempted  string  largest fencing token a request with Preempt stopped
--                      (acquire.lua)
-- ARGV:
--   1 the owner's tag (lease.lua)
--   2 new TTL in milliseconds
--   then two per lock key: release channel, key name (as the caller named it)
--   last: the lease's fencing token: a lease of the owner with a larger
--     token is a later acquisition, not this one (heldUpTo)
-- Returns 0 when the owner held every key and all were extended. Otherwise
-- returns the 1-based index of the first key the owner no longer holds: the
-- lease is lost, so the keys it still held are released (and published as
-- "<key name> <fence>") instead of extended. When it holds every key but a
-- request with Preempt stopped its holding of one (its token there is at or
-- below the key's mark), it extends none and returns minus that key's index:
-- the lease stays as it was, valid until its TTL ends.
local tag, ttl, maxFence = ARGV[1], ARGV[2], tonumber(ARGV[#ARGV])
local n = #KEYS / 2
local stopped = 0
for i = 1, n do
  -- The mark is read with the lease: no call more than the lease's GET.
  local got = redis.call('MGET', KEYS[2 * i - 1], KEYS[2 * i])
  if not heldUpTo(got[1], tag, maxFence) then
    for j = 1, n do
      local fence = releaseHeld(KEYS[2 * j - 1], tag, maxFence)
      if fence then
        redis.call('PUBLISH', ARGV[2 * j + 1], ARGV[2 * j + 2] .. ' ' .. fence)
      end
    end
    return i
  end
  if stopped == 0 and got[2] and heldToken(got[1], tag) <= (tonumber(got[2]) or 0) then
    stopped = i
  end
end
if stopped > 0 then return -stopped end
for i = 1, n do
  redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
end
return 0
