-- semrelease.lua: compare-and-delete the semaphore slots the owner token still
-- holds, and tell waiters.
--
-- KEYS: three per lock key, in this order:
--   slots      zset  holding owner -> expiry (server milliseconds)
--   slotfences zset  holding owner -> fencing token
--   slotmeta   hash  holding owner -> "<fence> <acquired us> <limit> <holder>"
--                    (<limit>:<weight> for a weight above 1)
-- ARGV:
--   1 owner token
--   then two per lock key: release channel, key name (as the caller named it)
--   last: the lease's fencing token: only a slot of the owner with a token
--     (slotfences) at most this is released; a larger one is a later
--     acquisition of the owner
-- Publishes "<key name> <fence>" on the channel of each key whose slot was
-- live. Returns the number of live slots released (a slot past its expiry is
-- removed but not counted: it was no longer held).
local owner, maxFence = ARGV[1], tonumber(ARGV[#ARGV])
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local released = 0
for i = 1, #KEYS / 3 do
  local sk, fk, mk = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local e = redis.call('ZSCORE', sk, owner)
  if e and (tonumber(redis.call('ZSCORE', fk, owner)) or 0) > maxFence then e = nil end
  if e then
    local fence = string.match(redis.call('HGET', mk, owner) or '', '^(%d+)') or '0'
    redis.call('ZREM', sk, owner)
    redis.call('ZREM', fk, owner)
    redis.call('HDEL', mk, owner)
    if tonumber(e) > nowMs then
      redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' ' .. fence)
      released = released + 1
    end
  end
end
return released
