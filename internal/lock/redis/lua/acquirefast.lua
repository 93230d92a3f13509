-- acquirefast.lua: acquire.lua's common call, run before anything else in
-- the script (scripts.go puts it first). KEYS and ARGV are acquire.lua's.
--
-- One free key that nobody waits for, no semaphore holds and no newer
-- request replaced a waiter of (no replaced marks): the lease is taken here
-- and the script returns; every other call falls through to the
-- general path below, which decides everything again from its own reads.
-- This code comes before the definitions of lease.lua and queue.lua on
-- purpose: Redis runs the whole script on every call, so each function
-- defined above the return would be built (and collected) once per
-- acquisition, on Redis's one thread (see docs/benchmarks.md, "Four calls,
-- before the definitions").
--
-- It issues what the general path would (acquire.lua's header):
-- * Without a proposal (standalone and Sentinel mode), four calls: the
--   largest of this server's TIME and the key's counter + 1. The counter is
--   written with the token in the same call that reads it: GETSET, which
--   Redis calls deprecated in favour of SET ... GET, but which every Redis
--   from 5.0 has (SET ... GET needs 6.2; see docs/backends.md, "Redis
--   requirements"). The counter is the last token issued, so it is below
--   TIME unless the clock stepped back; then the token is the counter + 1
--   and the counter is written again, so that it never goes down. Tokens and
--   TIME are canonical decimal integers, compared here as strings, by length
--   and then with Lua's string order: cheaper than converting them. (Lua
--   orders strings with strcoll; digits collate in numeric order in every
--   locale Redis may run in.)
-- * With a proposal (Redlock), five calls: the largest of TIME, the proposal
--   kept within TIME + window, and the counter + 1, where a key without a
--   counter counts as TIME + window. The counter is read first, so that a
--   refusal writes nothing.
-- A counter that is not a number counts as none, as in the general path
-- (counterFloor).

-- How far ahead of this server's clock a proposal may be (microseconds):
-- queue.lua's window, which the general path uses. Must match fenceWindow in
-- acquire.go.
local window = 20000

-- The largest fencing token when ARGV[7] is left out (also acquire.lua's).
-- Must match maxToken in acquire.go.
local maxFence = '9007199254740990'

if #KEYS == 11 and redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9]) == 0 then
  -- queue.lua's serverNow, inlined: it is defined below this path.
  local t = redis.call('TIME')
  local usec = t[2]
  if #usec < 6 then usec = string.rep('0', 6 - #usec) .. usec end
  local now = t[1] .. usec
  local proposal = ARGV[8]
  local p = proposal and tonumber(proposal) or 0
  if p > 0 then
    local nowUs = tonumber(now)
    local f = nowUs
    if p > f then f = math.min(p, nowUs + window) end
    local c = redis.call('GET', KEYS[2])
    c = c and tonumber(c)
    if c then f = math.max(f, c + 1) else f = math.max(f, nowUs + window) end
    local max = ARGV[7] or maxFence
    local fence
    if f == p then fence = proposal elseif f == nowUs then fence = now else fence = string.format('%.0f', f) end
    if f > tonumber(max) then
      return redis.error_reply('ERR fencing token ' .. fence .. ' would exceed ' .. max)
    end
    redis.call('SET', KEYS[2], fence)
    redis.call('SET', KEYS[1], ARGV[1] .. fence .. ' ' .. now .. ' ' .. ARGV[3], 'PX', ARGV[2])
    return fence
  end
  local fence = now
  local prev = redis.call('GETSET', KEYS[2], now)
  if prev and (#prev > #now or (#prev == #now and prev >= now)) then
    -- Rare: the counter is at or past TIME (or not a number at all).
    local c = tonumber(prev)
    if c then fence = string.format('%.0f', c + 1) end
  end
  local max = ARGV[7] or maxFence
  if #fence > #max or (#fence == #max and fence > max) then
    -- Refused: the counter goes back to what it was.
    if prev then redis.call('SET', KEYS[2], prev) else redis.call('DEL', KEYS[2]) end
    return redis.error_reply('ERR fencing token ' .. fence .. ' would exceed ' .. max)
  end
  if fence ~= now then redis.call('SET', KEYS[2], fence) end
  redis.call('SET', KEYS[1], ARGV[1] .. fence .. ' ' .. now .. ' ' .. ARGV[3], 'PX', ARGV[2])
  return fence
end
