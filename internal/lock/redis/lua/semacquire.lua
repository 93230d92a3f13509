-- semacquire.lua: take the slots of a counting semaphore (one, or the
-- request's weight) on every key of one lease for one owner, or none of them.
--
-- KEYS: ten per lock key (as acquire.lua), and then one shared key:
--   lock       string  a mutex holder's lease (Limit 1; lease.lua)
--   counter    string  last fencing token issued for the key (no TTL; shared with the mutex)
--   queue      zset    waiting owner -> rank (queue order; acquire.lua)
--   deadlines  zset    waiting owner -> heartbeat deadline (server milliseconds)
--   waiters    hash    waiting owner -> "<since microseconds> <holder>", or
--                      "<since microseconds>:<weight> <holder>" for a weight above 1
--   slots      zset    holding owner -> expiry (server milliseconds)
--   slotfences zset    holding owner -> fencing token (acquisition order)
--   slotmeta   hash    holding owner -> "<fence> <acquired us> <limit> <holder>", or
--                      "<fence> <acquired us> <limit>:<weight> <holder>" for a weight above 1
--   replaced   zset    owner a newer request dropped from the queue -> until
--   preempted  string  largest token a request with Preempt stopped (unused here)
--   KEYS[#KEYS] string ticket counter shared by every key under the prefix
-- The three slot keys live as long as their longest-lived holder; a holder
-- past its expiry is pruned by the next semaphore script that sees it.
-- An entry without a weight (weight 1, or written by an older release)
-- weighs 1: a key where nobody asks for more slots is stored as before.
-- ARGV: 1-8 as acquire.lua (tickets too), but 1 is the owner token itself, and
--   9 limit: how many holders the key admits (at least 2)
--   10 head start in the queue (Request.Boost) in microseconds; may be left
--   out (0). ARGV 4 is at most "2" (join and replace): a semaphore request
--   does not preempt.
--   11 weight: how many slots the request takes (Request.Weight, 1 to the
--   limit); may be left out (1), and then ARGV 10 too.
-- A key is free for the owner when it holds a slot already, or when no mutex
-- holds it and used + ahead + weight is at most the smallest limit of the
-- request and of the live holders, where used is the sum of the live
-- holders' weights and ahead the sum of the weights of the live waiters
-- queued ahead of the owner (every live waiter when it is not queued) that
-- hold no slot of the key (a Redlock waiter granted here keeps its place
-- until it holds the lease: keepPlace below). So a
-- request with a larger limit never takes a key past the bound a holder
-- acquired with, and admission is strict FIFO by weight: a heavy waiter at
-- the head is not passed by lighter ones behind it while slots are free.
-- A grant removes the owner from the queues, but for a Redlock waiter
-- (ARGV 6 and 8 set, with a join), which keeps its place (keepPlace below).
-- Returns the fencing token (a string) when every key was taken, otherwise
--   {0, busy key index, oldest holder, its fence, position (-1: not queued),
--    queue length, PTTL ms of the first slot to expire, ticket, holder count
--    (holders, not their weights)},
--   or {2, key index} when the owner was replaced there (acquire.lua).
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local holder = ARGV[3]
local policy = tonumber(ARGV[4]) or 0
local join = policy >= 1
local waiterTTL = tonumber(ARGV[5])
local ticket = tonumber(ARGV[6])
local maxFence = tonumber(ARGV[7])
local proposal = tonumber(ARGV[8]) or 0
local limit = tonumber(ARGV[9])
local weight = tonumber(ARGV[11]) or 1
-- keepPlace: a Redlock waiter (a proposal, and the ticket the client holds
-- for it) keeps its place in the queues when granted here: its attempt may
-- still fail on too many other nodes, and then this grant is released; had
-- the grant taken its place, the waiters behind it would be admitted here
-- and refused where it still waits, each in turn (with weights, or a
-- semaphore of N slots on N + 1 nodes, whose quorum is every node, the
-- attempts could go on failing so for seconds). The client leaves these
-- queues once it holds the lease (attempt in acquire.go).
local keepPlace = join and proposal > 0 and ticket > 0
local n = (#KEYS - 1) / stride

local function key(i, j) return KEYS[(i - 1) * stride + j] end

local nowUs, nowUsStr = serverNow()
local nowMsStr = string.sub(nowUsStr, 1, -4)
local nowMs = tonumber(nowMsStr)

-- Prune waiters that missed their heartbeat and holders past their expiry.
local queued = {}
-- prunedSelf: this call found the owner's own place expired (it missed its heartbeats).
local prunedSelf = false
for i = 1, n do
  if redis.call('EXISTS', key(i, 3), key(i, 4), key(i, 5), key(i, 9)) > 0 then
    queued[i] = true
    if isReplaced((i - 1) * stride, owner, nowMs) then return {2, i} end
    if pruneWaiters((i - 1) * stride, owner, '(' .. nowMsStr) then prunedSelf = true end
  end
  local gone = redis.call('ZRANGEBYSCORE', key(i, 6), '-inf', nowMsStr)
  for _, o in ipairs(gone) do
    redis.call('ZREM', key(i, 6), o)
    redis.call('ZREM', key(i, 7), o)
    redis.call('HDEL', key(i, 8), o)
  end
end

if policy >= 2 then
  local tk = 0
  if not prunedSelf then tk = ticket end
  replaceOlder(n, queued, owner, tk, nowMs, waiterTTL)
end

local busy, bHolder, bFence, bPttl, bHolders = 0, '', 0, 0, 0
local mine = {}
for i = 1, n do
  local cur = redis.call('GET', key(i, 1))
  if cur then
    -- A mutex holder occupies the key whole.
    busy, bHolders = i, 1
    local f, _, h = leaseFields(cur)
    bHolder, bFence = h, tonumber(f)
    bPttl = redis.call('PTTL', key(i, 1))
    break
  end
  if redis.call('ZSCORE', key(i, 6), owner) then
    mine[i] = true
  else
    local count = redis.call('ZCARD', key(i, 6))
    -- Every holder keeps its own bound: the key admits no more slots taken
    -- than the smallest limit among the request and the live holders.
    -- used: the live holders' weights (a holder without one weighs 1).
    local eff, used = limit, count
    if count > 0 then
      for _, v in ipairs(redis.call('HVALS', key(i, 8))) do
        local l, w = string.match(v, '^%d+ %d+ (%d+):?(%d*) ')
        l, w = tonumber(l or ''), tonumber(w or '')
        if l and l < eff then eff = l end
        if w and w > 1 then used = used + w - 1 end
      end
    end
    -- Strict FIFO by weight: the weights of the waiters ahead count too
    -- (weightsAhead: not those holding a slot here, at most count of
    -- them). Each weighs at least 1, so their number alone may refuse the
    -- request; otherwise there are fewer than the limit and the holders to
    -- read.
    local pos = 0
    if queued[i] then
      pos = redis.call('ZRANK', key(i, 3), owner) or redis.call('ZCARD', key(i, 3))
    end
    local ahead = pos - count
    if used + ahead + weight <= eff then ahead = weightsAhead((i - 1) * stride, pos) end
    if used + ahead + weight > eff then
      busy, bHolders = i, count
      local first = redis.call('ZRANGE', key(i, 7), 0, 0)
      if first[1] then
        local f, _, _, h = string.match(redis.call('HGET', key(i, 8), first[1]) or '', '^(%d+) (%d+) ([%d:]+) (.*)$')
        bHolder, bFence = h or '', tonumber(f or '0')
        local e = redis.call('ZRANGE', key(i, 6), 0, 0, 'WITHSCORES')
        if e[2] then bPttl = tonumber(e[2]) - nowMs end
      end
      break
    end
  end
end

if busy > 0 then
  local tk = 0
  if join then
    tk = joinQueues(n, owner, holder, ticket, proposal, prunedSelf, nowUs, nowUsStr, waiterTTL, tonumber(ARGV[10]) or 0, weight)
  end
  local position = redis.call('ZRANK', key(busy, 3), owner)
  if not position then position = -1 end
  return {0, busy, bHolder, int(bFence), position, redis.call('ZCARD', key(busy, 3)), bPttl, int(tk), bHolders}
end

-- The fencing token, as in acquire.lua: one counter per key for every holder.
local fence = nowUs
if proposal > nowUs then fence = math.min(proposal, nowUs + window) end
for i = 1, n do
  local c = counterFloor(redis.call('GET', key(i, 2)), proposal, nowUs)
  if c > fence then fence = c end
end
if fence > maxFence then
  return redis.error_reply('ERR fencing token ' .. int(fence) .. ' would exceed ' .. ARGV[7])
end
local fenceStr = int(fence)
local expiry = int(nowMs + ttl)
local limitStr = ARGV[9]
if weight > 1 then limitStr = limitStr .. ':' .. ARGV[11] end
local info = fenceStr .. ' ' .. nowUsStr .. ' ' .. limitStr .. ' ' .. holder
for i = 1, n do
  redis.call('ZADD', key(i, 6), expiry, owner)
  redis.call('ZADD', key(i, 7), fenceStr, owner)
  redis.call('HSET', key(i, 8), owner, info)
  if redis.call('PTTL', key(i, 6)) < ttl then
    for j = 6, 8 do redis.call('PEXPIRE', key(i, j), ARGV[2]) end
  end
  redis.call('SET', key(i, 2), fenceStr)
  if queued[i] and not keepPlace then
    redis.call('ZREM', key(i, 3), owner)
    redis.call('ZREM', key(i, 4), owner)
    redis.call('HDEL', key(i, 5), owner)
  end
end
return fenceStr
