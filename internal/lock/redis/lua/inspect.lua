-- inspect.lua: read what the node holds for some keys (writes nothing).
--
-- KEYS: six per lock key, in this order:
--   lock       string  owner token
--   meta       hash    holder, fence, acquired
--   counter    string  last fencing token issued for the key
--   queue      zset    waiting owner -> ticket
--   deadlines  zset    waiting owner -> heartbeat deadline (server milliseconds)
--   waiters    hash    waiting owner -> "<since microseconds> <holder>"
-- ARGV:
--   1 how many waiters to report per key (the head of the queue)
-- Returns one entry per key:
--   {owner ('' when free), holder, fence, PTTL ms, acquired us, {holder, since us, ...}}
-- where fence is the lease's token when held and the last one issued when free.
-- Waiters past their heartbeat deadline are skipped (the next acquire prunes them).
local limit = tonumber(ARGV[1])
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS / 6 do
  local b = (i - 1) * 6
  local owner = redis.call('GET', KEYS[b + 1]) or ''
  local holder, fence, acquired, pttl = '', '0', '0', -2
  if owner ~= '' then
    local m = redis.call('HMGET', KEYS[b + 2], 'holder', 'fence', 'acquired')
    holder, fence, acquired = m[1] or '', m[2] or '0', m[3] or '0'
    pttl = redis.call('PTTL', KEYS[b + 1])
  else
    fence = redis.call('GET', KEYS[b + 3]) or '0'
  end
  local ws = {}
  local members = redis.call('ZRANGE', KEYS[b + 4], 0, 999)
  for _, w in ipairs(members) do
    if #ws >= 2 * limit then break end
    local d = redis.call('ZSCORE', KEYS[b + 5], w)
    if d and tonumber(d) >= nowMs then
      local info = redis.call('HGET', KEYS[b + 6], w) or ''
      local sp = string.find(info, ' ', 1, true)
      if sp then
        table.insert(ws, string.sub(info, sp + 1))
        table.insert(ws, string.sub(info, 1, sp - 1))
      else
        table.insert(ws, '')
        table.insert(ws, '0')
      end
    end
  end
  out[i] = {owner, holder, fence, pttl, acquired, ws}
end
return out
