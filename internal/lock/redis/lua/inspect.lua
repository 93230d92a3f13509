-- inspect.lua: read what the node holds for some keys (writes nothing).
--
-- KEYS: eight per lock key, as acquire.lua:
--   lock, counter, queue, deadlines, waiters, slots, slotfences, slotmeta
--   (lock: lease.lua)
-- ARGV:
--   1 how many waiters to report per key (the head of the queue)
--   2 how many semaphore holders to report per key (the oldest)
-- Returns one entry per key:
--   {owner ('' when free), holder, fence, PTTL ms, acquired us,
--    {holder, since us, ...}, live waiters, live semaphore holders,
--    {owner, holder, fence, PTTL ms, acquired us, limit, weight, ...}}
-- where fence is the mutex lease's token when held and otherwise the last one
-- issued for the key. Waiters past their heartbeat deadline and semaphore
-- holders past their expiry are skipped (the next acquire prunes them).
-- A waiters entry is "<since us> <holder>" or "<since us>:<weight> <holder>",
-- a slotmeta entry "<fence> <acquired us> <limit> <holder>" or "<fence>
-- <acquired us> <limit>:<weight> <holder>": an entry without a weight (an
-- older release wrote it, or the weight is 1) weighs 1.
local limit = tonumber(ARGV[1])
local maxHolders = tonumber(ARGV[2])
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowMsStr = string.format('%.0f', nowMs)
local out = {}
for i = 1, #KEYS / 8 do
  local b = (i - 1) * 8
  local v = redis.call('GET', KEYS[b + 1])
  local owner, holder, fence, acquired, pttl = '', '', '0', '0', -2
  if v then
    owner = leaseOf(v) or v
    fence, acquired, holder = leaseFields(v)
    pttl = redis.call('PTTL', KEYS[b + 1])
  else
    fence = redis.call('GET', KEYS[b + 2]) or '0'
  end
  local ws = {}
  local members = redis.call('ZRANGE', KEYS[b + 3], 0, 999)
  for _, w in ipairs(members) do
    if #ws >= 2 * limit then break end
    local d = redis.call('ZSCORE', KEYS[b + 4], w)
    if d and tonumber(d) >= nowMs then
      local info = redis.call('HGET', KEYS[b + 5], w) or ''
      local since, h = string.match(info, '^(%d+):?%d* (.*)$')
      if since then
        table.insert(ws, h)
        table.insert(ws, since)
      else
        table.insert(ws, '')
        table.insert(ws, '0')
      end
    end
  end
  local queued = redis.call('ZCOUNT', KEYS[b + 4], nowMsStr, '+inf')
  local slots = redis.call('ZCOUNT', KEYS[b + 6], '(' .. nowMsStr, '+inf')
  local hs = {}
  if slots > 0 then
    for _, o in ipairs(redis.call('ZRANGE', KEYS[b + 7], 0, -1)) do
      if #hs >= 7 * maxHolders then break end
      local e = redis.call('ZSCORE', KEYS[b + 6], o)
      if e and tonumber(e) > nowMs then
        local f, a, l, w, h = string.match(redis.call('HGET', KEYS[b + 8], o) or '', '^(%d+) (%d+) (%d+):?(%d*) (.*)$')
        if w == nil or w == '' then w = '1' end
        for _, v in ipairs({o, h or '', f or '0', string.format('%.0f', tonumber(e) - nowMs), a or '0', l or '0', w}) do
          table.insert(hs, v)
        end
      end
    end
  end
  out[i] = {owner, holder, fence, pttl, acquired, ws, queued, slots, hs}
end
return out
