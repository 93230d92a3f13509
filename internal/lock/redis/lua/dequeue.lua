-- dequeue.lua: remove one owner from the FIFO queues of some keys.
--
-- KEYS: five per lock key, in this order:
--   lock       string  owner token of the holder
--   queue      zset    waiting owner -> ticket
--   deadlines  zset    waiting owner -> heartbeat deadline
--   waiters    hash    waiting owner -> "<since microseconds> <holder>"
--                      ("<since microseconds>:<weight> <holder>" for a weight above 1)
--   slots      zset    semaphore holders
-- ARGV:
--   1 owner token
--   then two per lock key: release channel, key name (as the caller named it)
-- When the owner was at the head of a free key's queue, or anywhere in the
-- queue of a semaphore (its place may have been among the free slots), and
-- others still wait, publishes "<key name> dequeue-<server microseconds>" so the next waiter tries
-- at once. Returns the number of queues the owner left.
local owner = ARGV[1]
local left = 0
local t = redis.call('TIME')
local stamp = t[1] .. string.format('%06d', tonumber(t[2]))
for i = 1, #KEYS / 5 do
  local b = 5 * (i - 1)
  local lk, q, d, w, s = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4], KEYS[b + 5]
  local head = redis.call('ZRANGE', q, 0, 0)
  if redis.call('ZREM', q, owner) == 1 then
    left = left + 1
    if (head[1] == owner or redis.call('EXISTS', s) == 1) and redis.call('EXISTS', lk) == 0 and redis.call('ZCARD', q) > 0 then
      redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1] .. ' dequeue-' .. stamp)
    end
  end
  redis.call('ZREM', d, owner)
  redis.call('HDEL', w, owner)
end
return left
