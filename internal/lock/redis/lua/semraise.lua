-- semraise.lua: raise.lua for semaphore slots (Redlock write-back).
--
-- KEYS: five per lock key, in this order:
--   counter    string  last fencing token issued for the key
--   slots      zset    holding owner -> expiry (server milliseconds)
--   slotfences zset    holding owner -> fencing token
--   slotmeta   hash    holding owner -> "<fence> <acquired us> <limit> <holder>"
--                      (<limit>:<weight> for a weight above 1; kept as it is)
--   preempted  string  largest fencing token a request with Preempt stopped
-- ARGV:
--   1 fencing token
--   2 owner token
-- The write-back gives the owner's slots the lease's token, issued by another
-- node. Semaphore holders overlap, and each node issues its own tokens, so
-- this node may meanwhile have issued the same token, or a larger one, to
-- another holder (or another write-back raised its counter there): two
-- holders would then share a token. So a counter at or past the token
-- refuses the write-back, changing nothing, and the reply is minus the
-- largest such counter; the client moves the lease's token above it on
-- every node (writeBack in acquire.go).
-- Otherwise sets each counter to the token and records the token as the
-- fence of the owner's slot where it holds one with a token at most this one
-- (a larger one is a later acquisition of the owner); a slot preempted
-- meanwhile (its old token at or below the key's mark) stays preempted: the
-- mark is raised to the new token. Returns how many keys it holds so.
local fence, owner = tonumber(ARGV[1]), ARGV[2]
local ahead = 0
for i = 1, #KEYS / 5 do
  local c = tonumber(redis.call('GET', KEYS[5 * (i - 1) + 1]) or '0') or 0
  if c >= fence and c > ahead then ahead = c end
end
if ahead > 0 then return -ahead end
local held = 0
for i = 1, #KEYS / 5 do
  local b = 5 * (i - 1)
  redis.call('SET', KEYS[b + 1], ARGV[1])
  local old = tonumber(redis.call('ZSCORE', KEYS[b + 3], owner)) or 0
  if redis.call('ZSCORE', KEYS[b + 2], owner) and old <= fence then
    redis.call('ZADD', KEYS[b + 3], 'XX', ARGV[1], owner)
    local mark = tonumber(redis.call('GET', KEYS[b + 5]) or '')
    if mark and old <= mark and mark < fence then
      redis.call('SET', KEYS[b + 5], ARGV[1], 'PX', math.max(redis.call('PTTL', KEYS[b + 2]), redis.call('PTTL', KEYS[b + 5])))
    end
    local info = redis.call('HGET', KEYS[b + 4], owner) or ''
    redis.call('HSET', KEYS[b + 4], owner, ARGV[1] .. (string.match(info, '^%d+( .*)$') or ' 0 0 '))
    held = held + 1
  end
end
return held
