-- semraise.lua: raise.lua for semaphore slots (Redlock write-back).
--
-- KEYS: four per lock key, in this order:
--   counter    string  last fencing token issued for the key
--   slots      zset    holding owner -> expiry (server milliseconds)
--   slotfences zset    holding owner -> fencing token
--   slotmeta   hash    holding owner -> "<fence> <acquired us> <limit> <holder>"
-- ARGV:
--   1 fencing token
--   2 owner token
-- Sets each counter to the token when it is lower, and records the token as
-- the fence of the owner's slot where it holds one. Returns how many keys it holds.
local fence, owner = tonumber(ARGV[1]), ARGV[2]
local held = 0
for i = 1, #KEYS / 4 do
  local b = 4 * (i - 1)
  local c = tonumber(redis.call('GET', KEYS[b + 1]) or '0')
  if c < fence then redis.call('SET', KEYS[b + 1], ARGV[1]) end
  if redis.call('ZSCORE', KEYS[b + 2], owner) then
    redis.call('ZADD', KEYS[b + 3], 'XX', ARGV[1], owner)
    local info = redis.call('HGET', KEYS[b + 4], owner) or ''
    redis.call('HSET', KEYS[b + 4], owner, ARGV[1] .. (string.match(info, '^%d+( .*)$') or ' 0 0 '))
    held = held + 1
  end
end
return held
