-- acquire.lua: take every key of one lease for one owner, or none of them.
--
-- KEYS: six per lock key, in this order, and then one shared key:
--   lock       string  owner token, with the lease TTL (SET NX PX)
--   meta       hash    holder, fence, acquired (server microseconds); same TTL as lock
--   counter    string  last fencing token issued for the key (no TTL)
--   queue      zset    waiting owner -> ticket (FIFO order)
--   deadlines  zset    waiting owner -> heartbeat deadline (server milliseconds)
--   waiters    hash    waiting owner -> "<since microseconds> <holder>"
--   KEYS[#KEYS] string ticket counter shared by every key under the prefix
-- ARGV:
--   1 owner token            2 lease TTL in milliseconds   3 holder identity
--   4 "1": join the queues when not acquired, "0": do not
--   5 waiter TTL in milliseconds
--   6 ticket to queue with (0: keep the one held, or draw a new one)
--   7 largest fencing token allowed
-- Returns {1, fence} when every key was taken, otherwise
--   {0, busy key index (1-based), holder, holder fence, position (-1: not queued),
--    queue length, holder PTTL in milliseconds, ticket}.
local owner = ARGV[1]
local ttl = ARGV[2]
local holder = ARGV[3]
local join = ARGV[4] == '1'
local waiterTTL = tonumber(ARGV[5])
local ticket = tonumber(ARGV[6])
local maxFence = tonumber(ARGV[7])
local n = (#KEYS - 1) / 6

local function key(i, j) return KEYS[(i - 1) * 6 + j] end
-- Lua 5.1 prints numbers with 14 significant digits: format integers explicitly.
local function int(x) return string.format('%.0f', x) end

local t = redis.call('TIME')
local nowUs = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowMs = math.floor(nowUs / 1000)

-- Prune waiters that missed their heartbeat.
for i = 1, n do
  local dead = redis.call('ZRANGEBYSCORE', key(i, 5), '-inf', '(' .. int(nowMs))
  for _, w in ipairs(dead) do
    redis.call('ZREM', key(i, 4), w)
    redis.call('ZREM', key(i, 5), w)
    redis.call('HDEL', key(i, 6), w)
  end
end

-- Find the first key held by another owner, or whose queue has someone else at its head.
local busy, bHolder, bFence, bPttl = 0, '', 0, 0
local mine = {}
for i = 1, n do
  local cur = redis.call('GET', key(i, 1))
  if cur == owner then
    mine[i] = true
  elseif cur then
    busy = i
    bHolder = redis.call('HGET', key(i, 2), 'holder') or ''
    bFence = tonumber(redis.call('HGET', key(i, 2), 'fence') or '0')
    bPttl = redis.call('PTTL', key(i, 1))
    break
  else
    local head = redis.call('ZRANGE', key(i, 4), 0, 0)
    if head[1] and head[1] ~= owner then
      busy = i
      break
    end
  end
end

if busy > 0 then
  local tk = 0
  if join then
    tk = ticket
    if tk == 0 then
      for i = 1, n do
        local s = redis.call('ZSCORE', key(i, 4), owner)
        if s and tonumber(s) > tk then tk = tonumber(s) end
      end
      if tk == 0 then tk = redis.call('INCR', KEYS[#KEYS]) end
    else
      local c = tonumber(redis.call('GET', KEYS[#KEYS]) or '0')
      if c < tk then redis.call('SET', KEYS[#KEYS], int(tk)) end
    end
    for i = 1, n do
      if not redis.call('ZSCORE', key(i, 4), owner) then
        redis.call('HSET', key(i, 6), owner, int(nowUs) .. ' ' .. holder)
      end
      redis.call('ZADD', key(i, 4), int(tk), owner)
      redis.call('ZADD', key(i, 5), int(nowMs + waiterTTL), owner)
      -- A queue nobody refreshes disappears on its own.
      for j = 4, 6 do redis.call('PEXPIRE', key(i, j), int(waiterTTL * 2)) end
    end
  end
  local position = redis.call('ZRANK', key(busy, 4), owner)
  if not position then position = -1 end
  return {0, busy, bHolder, int(bFence), position, redis.call('ZCARD', key(busy, 4)), bPttl, int(tk)}
end

local fence = nowUs
for i = 1, n do
  local c = tonumber(redis.call('GET', key(i, 3)) or '0')
  if c + 1 > fence then fence = c + 1 end
end
if fence > maxFence then
  return redis.error_reply('ERR fencing token ' .. int(fence) .. ' would exceed ' .. ARGV[7])
end
for i = 1, n do
  if mine[i] then
    redis.call('SET', key(i, 1), owner, 'PX', ttl, 'XX')
  else
    redis.call('SET', key(i, 1), owner, 'PX', ttl, 'NX')
  end
  redis.call('DEL', key(i, 2))
  redis.call('HSET', key(i, 2), 'holder', holder, 'fence', int(fence), 'acquired', int(nowUs))
  redis.call('PEXPIRE', key(i, 2), ttl)
  redis.call('SET', key(i, 3), int(fence))
  redis.call('ZREM', key(i, 4), owner)
  redis.call('ZREM', key(i, 5), owner)
  redis.call('HDEL', key(i, 6), owner)
end
return {1, int(fence)}
