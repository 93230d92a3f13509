-- acquire.lua: take every key of one lease for one owner, or none of them.
--
-- KEYS: ten per lock key, in this order, and then one shared key:
--   lock       string  the lease (lease.lua), with the lease TTL
--   counter    string  last fencing token issued for the key (no TTL)
--   queue      zset    waiting owner -> rank: arrival less head start (queue order)
--   deadlines  zset    waiting owner -> heartbeat deadline (server milliseconds)
--   waiters    hash    waiting owner -> "<since microseconds> <holder>", since
--                      being its arrival (ticket); a semaphore waiter asking
--                      for more slots writes "<since microseconds>:<weight> <holder>"
--   slots      zset    semaphore holder -> expiry (server milliseconds); see semacquire.lua
--   slotfences zset    semaphore holder -> fencing token (acquisition order)
--   slotmeta   hash    semaphore holder -> "<fence> <acquired us> <limit> <holder>",
--                      or "... <limit>:<weight> <holder>" for a weight above 1
--   replaced   zset    owner a newer request dropped from the queue -> until
--                      (server milliseconds); see queue.lua's replaceOlder
--   preempted  string  largest fencing token a request with Preempt stopped
--                      (TTL: the longest-lived holding it stopped)
--   KEYS[#KEYS] string ticket counter shared by every key under the prefix
-- ARGV:
--   1 the owner's tag (lease.lua)   2 lease TTL in milliseconds   3 holder identity
--   4 "0": do not join the queues; "1": join them when not acquired; "2":
--     join them and replace the older waiters (Request.Replace); "3": also
--     preempt the holders (Request.Preempt)
--   5 waiter TTL in milliseconds
--   6 ticket to queue with: the client's ticket for this owner (Redlock), 0
--     when it has none (standalone and Sentinel mode, a first join, or a
--     waiter whose place the client knows has expired)
--   7 largest fencing token allowed (valid tokens are 1 to this, inclusive)
--   8 proposed fencing token, a canonical decimal integer (0: none, as in
--     standalone and Sentinel mode). Redlock clients always propose, the same
--     value to every node (their clock in microseconds plus a lead), so that
--     the nodes issue the same token.
-- ARGV 4 to 8 may be left out together (a standalone or Sentinel request that
-- does not queue): then 4 is "0", 6 and 8 are 0 and 7 is maxFence
-- (acquirefast.lua).
-- A waiter's ticket is its arrival, and its rank (its score in queue) the
-- arrival less its head start (ARGV 9): ranks order a key's queue, so that
-- equal head starts are served in arrival order (ties: by owner). Where the
-- owner is queued, it keeps its arrival and rank (the arrival raised to
-- ARGV[6] when that is larger, so that the nodes converge on the client's
-- ticket; then the rank is the new arrival less the head start). Where it is
-- not, it takes ARGV[6] (a node that missed the join or restarted empty
-- learns the place the other nodes gave it), unless this very call pruned its
-- expired place: a waiter that missed its heartbeats loses its place.
-- Otherwise it draws a new arrival: this server's TIME in microseconds, made
-- monotonic by the shared counter + 1 (so that equal head starts keep exact
-- FIFO order between Lockers sharing the server) or, with a proposal
-- (Redlock), the proposal kept within TIME +- window. The proposal is the
-- client's clock, the same for every node, so the nodes an attempt reaches
-- give the same ticket, whatever joins each of them saw or missed before and
-- in whatever order a slow node runs the scripts; waiters are ordered by
-- their clients' clocks, within the window. The counter is raised to every
-- ticket handed out. Request.Replace compares arrivals, not ranks. A place
-- queued by an older release (its ticket as its score: a counter value in
-- standalone and Sentinel mode, far below any arrival in microseconds, or a
-- proposal in Redlock mode) keeps its score as its rank and its ticket.
-- The fencing token is the largest of: every key's counter + 1; this server's
-- TIME in microseconds; the proposal, capped at TIME + window. With a
-- proposal, a key without a counter (never used, or lost in an empty restart)
-- counts as TIME + window, so that a restarted node still issues more than any
-- token it capped before (see docs/safety.md, "Fencing tokens").
-- Returns the fencing token (a string) when every key was taken, otherwise
--   {0, busy key index (1-based), holder, holder fence, position (-1: not queued),
--    queue length, holder PTTL in milliseconds, ticket, holder count}.
--   or {2, key index} when a newer request with Replace dropped the owner from
--   that key's queue less than two waiter TTLs ago (it joins nothing).
-- A key with a live semaphore holder (slots) is busy: a mutex needs it whole.
-- Replace drops the older waiters before the keys are looked at, so that a
-- request finding them free once they are gone takes them; Preempt raises the
-- preemption mark of every key to its other holders' tokens. The owner of a
-- preempted lease is refused its own key while others wait for it.
--
-- The common call (one free key, nobody queued, no semaphore holder) is
-- taken by acquirefast.lua, which runs first; this is the general path.
local tag = ARGV[1]
local owner = ownerOf(tag)
local n = (#KEYS - 1) / stride
local proposal = tonumber(ARGV[8]) or 0
local policy = tonumber(ARGV[4]) or 0

local nowUs, nowUsStr = serverNow()
-- '(' .. now in milliseconds: an exclusive lower bound of live entries (only
-- where a queue or slots exist).
local afterNowMs

-- queued[i]: key i has a queue or slots (nil when no key has).
local queued
-- The fencing token, and fenceStr, the same as a string when it is known
-- without formatting.
local fence, fenceStr = nowUs, nowUsStr

-- Prune waiters that missed their heartbeat. A key whose queue and slot keys
-- do not exist has nobody to prune, no queue head, no semaphore holder and
-- nothing to clean up below: one EXISTS per key.
-- prunedSelf: this call found the owner's own place expired (it missed its heartbeats).
local prunedSelf = false
-- The replaced marks come with them: a key with marks is looked at too.
for i = 1, n do
  local b = (i - 1) * stride
  local e = redis.call('EXISTS', KEYS[b + 3], KEYS[b + 4], KEYS[b + 5], KEYS[b + 6], KEYS[b + 9])
  if e > 0 then
    queued = queued or {}
    queued[i] = true
    afterNowMs = afterNowMs or ('(' .. string.sub(nowUsStr, 1, -4))
    if isReplaced(b, owner, math.floor(nowUs / 1000)) then return {2, i} end
    if pruneWaiters(b, owner, afterNowMs) then prunedSelf = true end
  end
end

if policy >= 2 then
  local nowMs = math.floor(nowUs / 1000)
  if queued then
    local ticket = 0
    if not prunedSelf then ticket = tonumber(ARGV[6]) or 0 end
    replaceOlder(n, queued, owner, ticket, nowMs, tonumber(ARGV[5]))
  end
  if policy >= 3 then preemptHolders(n, tag, owner, nowMs) end
end

-- The fencing token, if every key is free: the largest of this server's
-- clock, the proposal kept within TIME + window, and every key's counter + 1
-- (with a proposal, a key without a counter counts as TIME + window).
if proposal > nowUs then
  if proposal <= nowUs + window then
    fence, fenceStr = proposal, ARGV[8]
  else
    fence, fenceStr = nowUs + window, nil
  end
end

-- Find the first key held by another owner, or whose queue has someone else
-- at its head; read each key's counter with its lock in the same MGET.
local busy, bHolder, bFence, bPttl, bHolders = 0, '', 0, 0, 0
for i = 1, n do
  local b = (i - 1) * stride
  local got = redis.call('MGET', KEYS[b + 1], KEYS[b + 2], KEYS[b + 10])
  local cur = got[1]
  local mine = holds(cur, tag)
  -- The owner's own lease, preempted, while others wait: refused as anyone.
  local stopped = mine and got[3] and queued and queued[i] and heldToken(cur, tag) <= (tonumber(got[3]) or 0)
  if stopped then
    stopped = false
    for _, w in ipairs(redis.call('ZRANGE', KEYS[b + 3], 0, 1)) do
      if w ~= owner then stopped = true end
    end
  end
  if (cur and not mine) or stopped then
    busy, bHolders = i, 1
    local f, _, h = leaseFields(cur)
    bHolder, bFence = h, tonumber(f)
    bPttl = redis.call('PTTL', KEYS[b + 1])
    break
  end
  if queued and queued[i] then
    local slots = 0
    if not cur then slots = redis.call('ZCOUNT', KEYS[b + 6], afterNowMs, '+inf') end
    if slots > 0 then
      -- Semaphore holders (expired ones are pruned by the semaphore scripts
      -- only: skip them here). Report the oldest live one.
      busy, bHolders = i, slots
      local nowMs = math.floor(nowUs / 1000)
      for _, o in ipairs(redis.call('ZRANGE', KEYS[b + 7], 0, -1)) do
        local e = tonumber(redis.call('ZSCORE', KEYS[b + 6], o) or '0')
        if e > nowMs then
          local f, _, _, h = string.match(redis.call('HGET', KEYS[b + 8], o) or '', '^(%d+) (%d+) ([%d:]+) (.*)$')
          bHolder, bFence = h or '', tonumber(f or '0')
          break
        end
      end
      local first = redis.call('ZRANGEBYSCORE', KEYS[b + 6], afterNowMs, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if first[2] then bPttl = tonumber(first[2]) - nowMs end
      break
    end
    if not mine then
      local head = redis.call('ZRANGE', KEYS[b + 3], 0, 0)
      if head[1] and head[1] ~= owner then
        busy = i
        break
      end
    end
  end
  local c = counterFloor(got[2], proposal, nowUs)
  if c > fence then fence, fenceStr = c, nil end
end

if busy > 0 then
  local tk = 0
  if policy >= 1 then
    tk = joinQueues(n, owner, ARGV[3], tonumber(ARGV[6]), proposal, prunedSelf, nowUs, nowUsStr, tonumber(ARGV[5]), tonumber(ARGV[9]) or 0)
  end
  local qk = KEYS[(busy - 1) * stride + 3]
  local position = redis.call('ZRANK', qk, owner)
  if not position then position = -1 end
  return {0, busy, bHolder, int(bFence), position, redis.call('ZCARD', qk), bPttl, int(tk), bHolders}
end

maxFence = ARGV[7] or maxFence
if fence > tonumber(maxFence) then
  return redis.error_reply('ERR fencing token ' .. int(fence) .. ' would exceed ' .. maxFence)
end
fenceStr = fenceStr or int(fence)
local lease = tag .. fenceStr .. ' ' .. nowUsStr .. ' ' .. ARGV[3]
local ttl = ARGV[2]
for i = 1, n do
  local b = (i - 1) * stride
  redis.call('SET', KEYS[b + 1], lease, 'PX', ttl)
  redis.call('SET', KEYS[b + 2], fenceStr)
  if queued and queued[i] then
    redis.call('ZREM', KEYS[b + 3], owner)
    redis.call('ZREM', KEYS[b + 4], owner)
    redis.call('HDEL', KEYS[b + 5], owner)
  end
end
return fenceStr
