-- acquire.lua: take every key of one lease for one owner, or none of them.
--
-- KEYS: nine per lock key, in this order, and then one shared key:
--   lock       string  the lease (lease.lua), with the lease TTL
--   meta       hash    the old layout's holder, fence and acquired: read only
--                      for a lease taken before lease.lua's layout
--   counter    string  last fencing token issued for the key (no TTL)
--   queue      zset    waiting owner -> ticket (FIFO order)
--   deadlines  zset    waiting owner -> heartbeat deadline (server milliseconds)
--   waiters    hash    waiting owner -> "<since microseconds> <holder>"
--   slots      zset    semaphore holder -> expiry (server milliseconds); see semacquire.lua
--   slotfences zset    semaphore holder -> fencing token (acquisition order)
--   slotmeta   hash    semaphore holder -> "<fence> <acquired us> <limit> <holder>"
--   KEYS[#KEYS] string ticket counter shared by every key under the prefix
-- ARGV:
--   1 owner token            2 lease TTL in milliseconds   3 holder identity
--   4 "1": join the queues when not acquired, "0": do not
--   5 waiter TTL in milliseconds
--   6 ticket to queue with: the client's ticket for this owner (Redlock), 0
--     when it has none (standalone and Sentinel mode, a first join, or a
--     waiter whose place the client knows has expired)
--   7 largest fencing token allowed (valid tokens are 1 to this, inclusive)
--   8 proposed fencing token, a canonical decimal integer (0: none, as in
--     standalone and Sentinel mode). Redlock clients always propose, the same
--     value to every node (their clock in microseconds plus a lead), so that
--     the nodes issue the same token.
-- Tickets order a key's queue. Where the owner is queued, it keeps its place
-- (raised to ARGV[6] when that is larger, so that the nodes converge on the
-- client's ticket). Where it is not, it takes ARGV[6] (a node that missed the
-- join or restarted empty learns the place the other nodes gave it), unless
-- this very call pruned its expired place: a waiter that missed its
-- heartbeats loses its place. Otherwise it draws a new ticket: the shared
-- counter + 1 (the back of the queue) or, with a proposal (Redlock), the
-- proposal kept within TIME +- window. The proposal is the client's clock,
-- the same for every node, so the nodes an attempt reaches give the same
-- ticket, whatever joins each of them saw or missed before and in whatever
-- order a slow node runs the scripts; waiters are ordered by their clients'
-- clocks, within the window. The counter is raised to every ticket handed out.
-- The fencing token is the largest of: every key's counter + 1; this server's
-- TIME in microseconds; the proposal, capped at TIME + window. With a
-- proposal, a key without a counter (never used, or lost in an empty restart)
-- counts as TIME + window, so that a restarted node still issues more than any
-- token it capped before (see docs/safety.md, "Fencing tokens").
-- Returns {1, fence} when every key was taken, otherwise
--   {0, busy key index (1-based), holder, holder fence, position (-1: not queued),
--    queue length, holder PTTL in milliseconds, ticket, holder count}.
-- A key with a live semaphore holder (slots) is busy: a mutex needs it whole.
local owner = ARGV[1]
local ttl = ARGV[2]
local holder = ARGV[3]
local join = ARGV[4] == '1'
local waiterTTL = tonumber(ARGV[5])
local ticket = tonumber(ARGV[6])
local maxFence = tonumber(ARGV[7])
local proposal = tonumber(ARGV[8]) or 0
local n = (#KEYS - 1) / 9
local tag = leaseTag(owner)

-- How far ahead of this server's clock (microseconds) a proposed token may be.
-- Must match fenceWindow in acquire.go.
local window = 20000

local function key(i, j) return KEYS[(i - 1) * 9 + j] end
-- Lua 5.1 prints numbers with 14 significant digits: format integers explicitly
-- (off the fast path; the common values are built from strings instead).
local function int(x) return string.format('%.0f', x) end

local t = redis.call('TIME')
local usec = string.rep('0', 6 - #t[2]) .. t[2]
local nowUs = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowUsStr = t[1] .. usec
-- '(' .. now in milliseconds: an exclusive lower bound of live entries.
local afterNowMs = '(' .. t[1] .. string.sub(usec, 1, 3)

-- Prune waiters that missed their heartbeat. A key whose queue and slot keys
-- do not exist has nobody to prune, no queue head, no semaphore holder and
-- nothing to clean up below: one EXISTS per key on the fast path.
local queued = {}
-- prunedSelf: this call found the owner's own place expired (it missed its heartbeats).
local prunedSelf = false
for i = 1, n do
  if redis.call('EXISTS', key(i, 4), key(i, 5), key(i, 6), key(i, 7)) > 0 then
    queued[i] = true
    local dead = redis.call('ZRANGEBYSCORE', key(i, 5), '-inf', afterNowMs)
    for _, w in ipairs(dead) do
      if w == owner then prunedSelf = true end
      redis.call('ZREM', key(i, 4), w)
      redis.call('ZREM', key(i, 5), w)
      redis.call('HDEL', key(i, 6), w)
    end
  end
end

-- Find the first key held by another owner, or whose queue has someone else at its head.
local busy, bHolder, bFence, bPttl, bHolders = 0, '', 0, 0, 0
local mine = {}
-- old[i]: key i is the owner's, in the old layout (lease.lua).
local old = {}
-- counters[i]: key i's fence counter, read with its lock in one MGET.
local counters = {}
for i = 1, n do
  local got = redis.call('MGET', key(i, 1), key(i, 3))
  local cur = got[1]
  counters[i] = got[2]
  local slots = 0
  if not cur and queued[i] then slots = redis.call('ZCOUNT', key(i, 7), afterNowMs, '+inf') end
  local how = heldAs(cur, owner, tag)
  if how then
    mine[i], old[i] = true, how == 'old'
  elseif cur then
    busy, bHolders = i, 1
    local f, _, h = leaseFields(cur, key(i, 2))
    bHolder, bFence = h, tonumber(f)
    bPttl = redis.call('PTTL', key(i, 1))
    break
  elseif slots > 0 then
    -- Semaphore holders (expired ones are pruned by the semaphore scripts
    -- only: skip them here). Report the oldest live one.
    busy, bHolders = i, slots
    local nowMs = math.floor(nowUs / 1000)
    for _, o in ipairs(redis.call('ZRANGE', key(i, 8), 0, -1)) do
      local e = tonumber(redis.call('ZSCORE', key(i, 7), o) or '0')
      if e > nowMs then
        local f, _, _, h = string.match(redis.call('HGET', key(i, 9), o) or '', '^(%d+) (%d+) (%d+) (.*)$')
        bHolder, bFence = h or '', tonumber(f or '0')
        break
      end
    end
    local first = redis.call('ZRANGEBYSCORE', key(i, 7), afterNowMs, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then bPttl = tonumber(first[2]) - nowMs end
    break
  elseif queued[i] then
    local head = redis.call('ZRANGE', key(i, 4), 0, 0)
    if head[1] and head[1] ~= owner then
      busy = i
      break
    end
  end
end

if busy > 0 then
  local nowMs = math.floor(nowUs / 1000)
  local tk = 0
  if join then
    -- The ticket (see the header): the owner's place where it is queued,
    -- the client's ticket where it is not (a node that missed the join or
    -- restarted), a new one at the back otherwise.
    local have = 0
    for i = 1, n do
      local s = redis.call('ZSCORE', key(i, 4), owner)
      if s and tonumber(s) > have then have = tonumber(s) end
    end
    local c = tonumber(redis.call('GET', KEYS[#KEYS]) or '0')
    if have > 0 then
      tk = math.max(have, ticket)
    elseif ticket > 0 and not prunedSelf then
      tk = ticket
    elseif proposal > 0 then
      tk = math.min(math.max(proposal, nowUs - window), nowUs + window)
    else
      tk = c + 1
    end
    if c < tk then redis.call('SET', KEYS[#KEYS], int(tk)) end
    for i = 1, n do
      if not redis.call('ZSCORE', key(i, 4), owner) then
        redis.call('HSET', key(i, 6), owner, nowUsStr .. ' ' .. holder)
      end
      redis.call('ZADD', key(i, 4), int(tk), owner)
      redis.call('ZADD', key(i, 5), int(nowMs + waiterTTL), owner)
      -- A queue nobody refreshes disappears on its own.
      for j = 4, 6 do redis.call('PEXPIRE', key(i, j), int(waiterTTL * 2)) end
    end
  end
  local position = redis.call('ZRANK', key(busy, 4), owner)
  if not position then position = -1 end
  return {0, busy, bHolder, int(bFence), position, redis.call('ZCARD', key(busy, 4)), bPttl, int(tk), bHolders}
end

-- fenceStr is fence as a string when it is known without formatting.
local fence, fenceStr = nowUs, nowUsStr
if proposal > nowUs then
  if proposal <= nowUs + window then
    fence, fenceStr = proposal, ARGV[8]
  else
    fence, fenceStr = nowUs + window, nil
  end
end
for i = 1, n do
  local c = counters[i]
  if c then
    c = tonumber(c) + 1
  elseif proposal > 0 then
    c = nowUs + window
  else
    c = 0
  end
  if c > fence then fence, fenceStr = c, nil end
end
if fence > maxFence then
  return redis.error_reply('ERR fencing token ' .. int(fence) .. ' would exceed ' .. ARGV[7])
end
fenceStr = fenceStr or int(fence)
local lease = tag .. fenceStr .. ' ' .. nowUsStr .. ' ' .. holder
for i = 1, n do
  redis.call('SET', key(i, 1), lease, 'PX', ttl)
  if old[i] then
    -- Taken again by its owner (a rebuilt lease) that held it in the old
    -- layout: its metadata now lives in the lock key.
    redis.call('DEL', key(i, 2))
  end
  redis.call('SET', key(i, 3), fenceStr)
  if queued[i] then
    redis.call('ZREM', key(i, 4), owner)
    redis.call('ZREM', key(i, 5), owner)
    redis.call('HDEL', key(i, 6), owner)
  end
end
return {1, fenceStr}
