-- acquirefast.lua: acquire.lua's common call, run before anything else in
-- the script (scripts.go puts it first). KEYS and ARGV are acquire.lua's.
--
-- One free key that nobody waits for and no semaphore holds, without a
-- proposal (standalone and Sentinel mode): the lease is taken here with four
-- calls and returns; every other call falls through to the general path
-- below, which decides everything again from its own reads. This code comes
-- before the definitions of lease.lua and queue.lua on purpose: Redis runs
-- the whole script on every call, so each function defined above the return
-- would be built (and collected) once per acquisition, on Redis's one thread
-- (see docs/benchmarks.md, "Where the time goes").
--
-- It issues what the general path would: the largest of this server's TIME
-- and the key's counter + 1. The counter is written with the token in the
-- same call that reads it: GETSET, which Redis calls deprecated in favour of
-- SET ... GET, but which every Redis from 5.0 has (SET ... GET needs 6.2;
-- see docs/backends.md, "Redis requirements"). The counter is the last token
-- issued, so it is below TIME unless the clock stepped back; then the token
-- is the counter + 1 and the counter is written again, so that it never goes
-- down. A counter that is not a number counts as none, as in the general
-- path (counterFloor): TIME is then the floor, as after an empty restart.
-- Tokens and TIME are canonical decimal integers, compared here as strings
-- (by length, then bytewise): cheaper than converting them.

-- The largest fencing token when ARGV[7] is left out (also acquire.lua's).
-- Must match maxToken in acquire.go.
local maxFence = '9007199254740990'

if #KEYS == 9 and (ARGV[8] or '0') == '0'
  and redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) == 0 then
  local t = redis.call('TIME')
  local usec = t[2]
  if #usec < 6 then usec = string.rep('0', 6 - #usec) .. usec end
  local now = t[1] .. usec
  local fence = now
  local prev = redis.call('GETSET', KEYS[2], now)
  local max = ARGV[7]
  if prev and (#prev > #now or (#prev == #now and prev >= now)) then
    -- Rare: the counter is at or past TIME (or not a number at all).
    local p = tonumber(prev)
    if p then
      local limit = tonumber(max or maxFence)
      if p + 1 > limit then
        redis.call('SET', KEYS[2], prev)
        return redis.error_reply('ERR fencing token ' .. string.format('%.0f', p + 1) .. ' would exceed ' .. (max or maxFence))
      end
      fence = string.format('%.0f', p + 1)
      redis.call('SET', KEYS[2], fence)
    end
  elseif max and (#now > #max or (#now == #max and now > max)) then
    if prev then redis.call('SET', KEYS[2], prev) else redis.call('DEL', KEYS[2]) end
    return redis.error_reply('ERR fencing token ' .. now .. ' would exceed ' .. max)
  end
  redis.call('SET', KEYS[1], ARGV[1] .. fence .. ' ' .. now .. ' ' .. ARGV[3], 'PX', ARGV[2])
  return fence
end
