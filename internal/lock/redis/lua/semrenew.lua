-- semrenew.lua: compare-and-extend the semaphore slot of one lease on every key.
--
-- KEYS: four per lock key, in this order:
--   slots      zset    holding owner -> expiry (server milliseconds)
--   slotfences zset    holding owner -> fencing token
--   slotmeta   hash    holding owner -> "<fence> <acquired us> <limit> <holder>"
--                      (<limit>:<weight> for a weight above 1)
--   preempted  string  largest fencing token a request with Preempt stopped
-- ARGV:
--   1 owner token
--   2 new TTL in milliseconds
--   then two per lock key: release channel, key name (as the caller named it)
--   last: the lease's fencing token: a slot of the owner with a larger token
--     (slotfences) is a later acquisition, not this one's
-- Returns 0 when the owner held a live slot of every key and all were
-- extended. Otherwise returns the 1-based index of the first key whose slot
-- the owner no longer holds: the lease is lost, so the slots it still held
-- are released (and published as "<key name> <fence>") instead of extended.
-- When a request with Preempt stopped one of its slots (its token is at or
-- below the key's mark), it extends none and returns minus that key's index.
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local n = #KEYS / 4
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local maxFence = tonumber(ARGV[#ARGV])
-- live(i) tells whether this lease's slot of key i is live, and returns its
-- expiry (nil when the key has no slot of this lease).
local function live(i)
  local e = redis.call('ZSCORE', KEYS[4 * i - 3], owner)
  if e and (tonumber(redis.call('ZSCORE', KEYS[4 * i - 2], owner)) or 0) > maxFence then return false, nil end
  return e and tonumber(e) > nowMs, e
end
for i = 1, n do
  if not live(i) then
    for j = 1, n do
      local ok, e = live(j)
      if e then
        local fence = string.match(redis.call('HGET', KEYS[4 * j - 1], owner) or '', '^(%d+)') or '0'
        redis.call('ZREM', KEYS[4 * j - 3], owner)
        redis.call('ZREM', KEYS[4 * j - 2], owner)
        redis.call('HDEL', KEYS[4 * j - 1], owner)
        if ok then redis.call('PUBLISH', ARGV[2 * j + 1], ARGV[2 * j + 2] .. ' ' .. fence) end
      end
    end
    return i
  end
end
for i = 1, n do
  local mark = redis.call('GET', KEYS[4 * i])
  if mark and (tonumber(redis.call('ZSCORE', KEYS[4 * i - 2], owner)) or 0) <= (tonumber(mark) or 0) then
    return -i
  end
end
local expiry = string.format('%.0f', nowMs + ttl)
for i = 1, n do
  redis.call('ZADD', KEYS[4 * i - 3], 'XX', expiry, owner)
  if redis.call('PTTL', KEYS[4 * i - 3]) < ttl then
    for j = 3, 1, -1 do redis.call('PEXPIRE', KEYS[4 * i - j], ARGV[2]) end
  end
end
return 0
