-- queue.lua: what acquire.lua and semacquire.lua share (prepended to both,
-- after lease.lua): the server's clock, the FIFO queues of lock keys, and
-- the fencing token's rule per key. Each lock key has eight Redis keys, in
-- acquire.lua's order; b is the index before a lock key's first one:
-- (i - 1) * 8 for the i-th.

-- How far ahead of this server's clock (microseconds) a proposed token or
-- ticket may be. Must match fenceWindow in acquire.go.
local window = 20000

-- Lua 5.1 prints numbers with 14 significant digits: format integers
-- explicitly (off the fast path; the common values are built from strings
-- instead).
local function int(x) return string.format('%.0f', x) end

-- serverNow reads this server's clock: microseconds since the epoch as a
-- number and as its decimal string (16 digits until the year 2286: exact in
-- a double). The string is what leases and queues store, so that the common
-- values need no formatting.
local function serverNow()
  local t = redis.call('TIME')
  local usec = t[2]
  if #usec < 6 then usec = string.rep('0', 6 - #usec) .. usec end
  local s = t[1] .. usec
  return tonumber(s), s
end

-- counterFloor is the smallest fencing token a lock key's counter c (its
-- value, or nil; a value that is not a number counts as none) allows: c + 1;
-- with a proposal (Redlock), TIME + window for a key without a counter (never
-- used, or lost in an empty restart), above anything this node could have
-- issued before; otherwise 0. The token is the
-- largest of every key's floor, TIME and the proposal kept within TIME +
-- window (see acquire.lua's header).
local function counterFloor(c, proposal, nowUs)
  local v = c and tonumber(c)
  if v then return v + 1 end
  if proposal > 0 then return nowUs + window end
  return 0
end

-- pruneWaiters removes the waiters of the lock key at b whose heartbeat
-- deadline is before afterNowMs ('(' .. now in milliseconds), and tells
-- whether owner was one of them (it missed its heartbeats: it loses its place).
local function pruneWaiters(b, owner, afterNowMs)
  local self = false
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[b + 4], '-inf', afterNowMs)) do
    if w == owner then self = true end
    redis.call('ZREM', KEYS[b + 3], w)
    redis.call('ZREM', KEYS[b + 4], w)
    redis.call('HDEL', KEYS[b + 5], w)
  end
  return self
end

-- joinQueues puts owner, refused, in the queue of each of the n lock keys
-- (or refreshes its place and heartbeat deadline there) and returns its
-- ticket: its place where it is queued (raised to the client's ticket, so
-- that the nodes converge on it), the client's ticket where it is not (a
-- node that missed the join or restarted empty learns the place the other
-- nodes gave it) unless this call pruned its expired place, and otherwise a
-- new one at the back: the counter (KEYS[#KEYS]) + 1, and above every ticket
-- queued on its keys (so that a counter that is new, was reset, or holds no
-- number orders nobody ahead of those already waiting), or, with a proposal
-- (Redlock), the proposal kept within TIME +- window. The counter is raised
-- to every ticket handed out. See acquire.lua's header.
local function joinQueues(n, owner, holder, ticket, proposal, prunedSelf, nowUs, nowUsStr, waiterTTL)
  local have = 0
  for i = 1, n do
    local s = redis.call('ZSCORE', KEYS[(i - 1) * 8 + 3], owner)
    if s and tonumber(s) > have then have = tonumber(s) end
  end
  local c = tonumber(redis.call('GET', KEYS[#KEYS]) or '0')
  if not c or c < 0 or c >= 2 ^ 53 then c = 0 end
  local tk
  if have > 0 then
    tk = math.max(have, ticket)
  elseif ticket > 0 and not prunedSelf then
    tk = ticket
  elseif proposal > 0 then
    tk = math.min(math.max(proposal, nowUs - window), nowUs + window)
  else
    local last = c
    for i = 1, n do
      local top = redis.call('ZRANGE', KEYS[(i - 1) * 8 + 3], -1, -1, 'WITHSCORES')
      local v = tonumber(top[2])
      if v and v > last and v < 2 ^ 53 then last = v end
    end
    tk = last + 1
  end
  if c < tk then redis.call('SET', KEYS[#KEYS], int(tk)) end
  local deadline = int(math.floor(nowUs / 1000) + waiterTTL)
  for i = 1, n do
    local b = (i - 1) * 8
    if not redis.call('ZSCORE', KEYS[b + 3], owner) then
      redis.call('HSET', KEYS[b + 5], owner, nowUsStr .. ' ' .. holder)
    end
    redis.call('ZADD', KEYS[b + 3], int(tk), owner)
    redis.call('ZADD', KEYS[b + 4], deadline, owner)
    -- A queue nobody refreshes disappears on its own.
    for j = 3, 5 do redis.call('PEXPIRE', KEYS[b + j], int(waiterTTL * 2)) end
  end
  return tk
end
