-- queue.lua: what acquire.lua and semacquire.lua share (prepended to both,
-- after lease.lua): the server's clock, the queues of lock keys (ordered by
-- rank: arrival less Request.Boost), the fencing token's rule per key, and
-- the queue rules of Request.Replace and Request.Preempt. Each lock key has ten Redis keys (stride), in acquire.lua's
-- order; b is the index before a lock key's first one: (i - 1) * stride for
-- the i-th.

-- How many Redis keys each lock key has in KEYS.
local stride = 10

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

-- waiterInfo reads a waiters entry (nil when there is none): "<since us>
-- <holder>" for a waiter of weight 1 (and every entry an older release
-- wrote), "<since us>:<weight> <holder>" for a semaphore waiter asking for
-- more slots (Request.Weight). Returns its since time (nil when unreadable)
-- and its weight (1 unless written).
local function waiterInfo(info)
  local s, w = string.match(info or '', '^(%d+):?(%d*) ')
  return tonumber(s or ''), tonumber(w or '') or 1
end

-- arrivalOf is waiter w's arrival in the queue of the lock key at b, its
-- ticket: the since time of its waiters entry (waiterInfo), nil when it has
-- none.
local function arrivalOf(b, w)
  return (waiterInfo(redis.call('HGET', KEYS[b + 5], w)))
end

-- weightsAhead sums the weights (waiterInfo) of the first k waiters of the
-- queue of the lock key at b, but for those that hold a semaphore slot of
-- the key (slots): a Redlock waiter keeps its place where it is granted
-- until it holds the lease (semacquire.lua's keepPlace), and its slot
-- counts already.
local function weightsAhead(b, k)
  if k <= 0 then return 0 end
  local ws = redis.call('ZRANGE', KEYS[b + 3], 0, k - 1)
  if #ws == 0 then return 0 end
  local sum = 0
  for j, info in ipairs(redis.call('HMGET', KEYS[b + 5], unpack(ws))) do
    if not redis.call('ZSCORE', KEYS[b + 6], ws[j]) then
      local _, w = waiterInfo(info)
      sum = sum + w
    end
  end
  return sum
end

-- joinQueues puts owner, refused, in the queue of each of the n lock keys
-- (or refreshes its place and heartbeat deadline there) and returns its
-- ticket, its arrival: its arrival where it is queued (raised to the
-- client's ticket, so that the nodes converge on it), the client's ticket
-- where it is not (a node that missed the join or restarted empty learns the
-- place the other nodes gave it) unless this call pruned its expired place,
-- and otherwise a new arrival: this server's TIME in microseconds, made
-- monotonic by the counter (KEYS[#KEYS]) + 1 and above every score queued on
-- its keys (so that a counter that is new, was reset, or holds no number
-- orders nobody ahead of those already waiting), or, with a proposal
-- (Redlock), the proposal kept within TIME +- window. The counter is raised
-- to every ticket handed out.
-- A queue's score is the waiter's rank: its arrival less its head start
-- boost (Request.Boost, microseconds). A waiter that keeps its arrival keeps
-- the rank it joined with (that of its latest arrival among its keys); a new
-- or raised arrival ranks at arrival - boost. The arrival is the since time of
-- the waiters entry (waiterInfo), which also records the request's weight
-- (Request.Weight; nil: 1), written again when it changes. See acquire.lua's
-- header.
local function joinQueues(n, owner, holder, ticket, proposal, prunedSelf, nowUs, nowUsStr, waiterTTL, boost, weight)
  weight = weight or 1
  local have, rank = 0, 0
  local arrived, weighed = {}, {}
  for i = 1, n do
    local b = (i - 1) * stride
    local s = tonumber(redis.call('ZSCORE', KEYS[b + 3], owner) or '')
    if s then
      -- A place queued by an older release has its ticket as its score.
      local since, w = waiterInfo(redis.call('HGET', KEYS[b + 5], owner))
      local a = since or s
      arrived[i], weighed[i] = a, w
      if a > have then have, rank = a, s end
    end
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
    local last = math.max(c, nowUs - 1)
    for i = 1, n do
      local top = redis.call('ZRANGE', KEYS[(i - 1) * stride + 3], -1, -1, 'WITHSCORES')
      local v = tonumber(top[2])
      if v and v > last and v < 2 ^ 53 then last = v end
    end
    tk = last + 1
  end
  if tk > have then rank = tk - boost end
  if c < tk then redis.call('SET', KEYS[#KEYS], int(tk)) end
  local tkStr = nowUsStr
  if tk ~= nowUs then tkStr = int(tk) end
  local info = tkStr .. ' ' .. holder
  if weight > 1 then info = tkStr .. ':' .. weight .. ' ' .. holder end
  local rankStr = int(rank)
  local deadline = int(math.floor(nowUs / 1000) + waiterTTL)
  for i = 1, n do
    local b = (i - 1) * stride
    if arrived[i] ~= tk or weighed[i] ~= weight then
      redis.call('HSET', KEYS[b + 5], owner, info)
    end
    redis.call('ZADD', KEYS[b + 3], rankStr, owner)
    redis.call('ZADD', KEYS[b + 4], deadline, owner)
    -- A queue nobody refreshes disappears on its own.
    for j = 3, 5 do redis.call('PEXPIRE', KEYS[b + j], int(waiterTTL * 2)) end
  end
  return tk
end

-- isReplaced tells whether owner's place in the queue of the lock key at b was
-- taken by a newer request with Replace, less than its mark's lifetime ago:
-- its member in the replaced zset scores past nowMs.
local function isReplaced(b, owner, nowMs)
  local mark = redis.call('ZSCORE', KEYS[b + 9], owner)
  return mark and tonumber(mark) > nowMs
end

-- replaceOlder applies Request.Replace for owner: on each of the n lock keys
-- with a queue (queued[i]), the waiters that arrived before it (a smaller
-- ticket, arrivalOf, than its own: its arrival where it is queued, else the
-- client's ticket, else every waiter), whatever their rank, leave the queue
-- and are marked replaced for two waiter TTLs (replaced zset: owner -> until,
-- server milliseconds), so that their next calls learn it instead of joining
-- again. A place queued by an older release has its ticket as its score.
-- The replaced zset lives as long as its latest mark.
local function replaceOlder(n, queued, owner, ticket, nowMs, waiterTTL)
  local mine = 0
  for i = 1, n do
    if queued[i] then
      local b = (i - 1) * stride
      local s = tonumber(redis.call('ZSCORE', KEYS[b + 3], owner) or '')
      local a = s and (arrivalOf(b, owner) or s) or 0
      if a > mine then mine = a end
    end
  end
  if mine == 0 then mine = ticket end
  local mark = int(nowMs + 2 * waiterTTL)
  for i = 1, n do
    if queued[i] then
      local b = (i - 1) * stride
      local dropped = false
      local ws = redis.call('ZRANGE', KEYS[b + 3], 0, -1, 'WITHSCORES')
      for j = 1, #ws, 2 do
        local w = ws[j]
        if w ~= owner and (mine <= 0 or (arrivalOf(b, w) or tonumber(ws[j + 1])) < mine) then
          redis.call('ZREM', KEYS[b + 3], w)
          redis.call('ZREM', KEYS[b + 4], w)
          redis.call('HDEL', KEYS[b + 5], w)
          redis.call('ZADD', KEYS[b + 9], mark, w)
          dropped = true
        end
      end
      if dropped then
        -- Marks past their time go (with the commands of the minimal ACL:
        -- no ZREMRANGEBYSCORE), and the zset lives as long as its latest
        -- mark: never shortened by a Locker with a shorter waiter TTL.
        for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[b + 9], '-inf', int(nowMs))) do
          redis.call('ZREM', KEYS[b + 9], w)
        end
        if redis.call('PTTL', KEYS[b + 9]) < 2 * waiterTTL then
          redis.call('PEXPIRE', KEYS[b + 9], int(2 * waiterTTL))
        end
      end
    end
  end
end

-- preemptUpTo raises the preemption mark of the lock key at b (its preempted
-- key: the largest fencing token a request with Preempt stopped) to fence, for
-- a holding that lives pttl more milliseconds: the mark lives as long as the
-- longest-lived holding it stops. A holding whose token is at or below the
-- mark is not renewed (renew.lua, semrenew.lua).
local function preemptUpTo(b, fence, pttl)
  if pttl <= 0 then return end
  local pk = KEYS[b + 10]
  local old = tonumber(redis.call('GET', pk) or '0') or 0
  local left = redis.call('PTTL', pk)
  if old >= fence and left >= pttl then return end
  redis.call('SET', pk, int(math.max(old, fence)), 'PX', int(math.max(left, pttl)))
end

-- preemptHolders applies Request.Preempt for the owner whose tag is tag: on
-- each of the n lock keys, the mutex lease and the live semaphore slots of
-- other owners are preempted (preemptUpTo).
local function preemptHolders(n, tag, owner, nowMs)
  for i = 1, n do
    local b = (i - 1) * stride
    local cur = redis.call('GET', KEYS[b + 1])
    if cur and not holds(cur, tag) then
      local f = leaseFields(cur)
      preemptUpTo(b, tonumber(f), redis.call('PTTL', KEYS[b + 1]))
    end
    local live = redis.call('ZRANGEBYSCORE', KEYS[b + 6], '(' .. int(nowMs), '+inf', 'WITHSCORES')
    for j = 1, #live, 2 do
      if live[j] ~= owner then
        local f = tonumber(redis.call('ZSCORE', KEYS[b + 7], live[j]) or '0') or 0
        preemptUpTo(b, f, tonumber(live[j + 1]) - nowMs)
      end
    end
  end
end
