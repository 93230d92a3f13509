-- lease.lua: the value of a mutex lease's lock key. Prepended to every script
-- that reads or writes it (scripts.go).
--
-- A held lock key's value is the whole lease, so that taking, renewing and
-- releasing it each touch one key:
--   <length of owner>:<owner> <fence> <acquired us> <holder>
-- The owner token comes first, behind its length, so that "is this key held
-- by owner" is one prefix comparison whatever bytes the token and the holder
-- contain. That prefix, "<length of owner>:<owner> ", is the owner's tag: the
-- scripts are given the tag, built by the client (leaseTag in redis.go), and
-- not the owner, so that no script formats a number on the common path.

-- ownerOf returns the owner token of tag (the scripts that also need the bare
-- token: the queues hold owners).
local function ownerOf(tag)
  local at = string.find(tag, ':', 1, true)
  return string.sub(tag, at + 1, -2)
end

-- holds tells whether v, the value of a lock key (or nil), is a lease of the
-- owner whose tag is tag. The one definition of "held by" every script uses.
local function holds(v, tag)
  return v ~= nil and v ~= false and string.sub(v, 1, #tag) == tag
end

-- leaseOf splits a lock key's value into owner, fence, acquired and holder
-- (strings), or returns nil when the value is not a lease.
local function leaseOf(v)
  local len, at = string.match(v, '^(%d+):()')
  if not len then return nil end
  local stop = at + tonumber(len)
  local fence, acquired, holder = string.match(v, '^ (%d+) (%d+) (.*)$', stop)
  if not fence then return nil end
  return string.sub(v, at, stop - 1), fence, acquired, holder
end

-- leaseFields returns the fence, acquired and holder of the lease v: '0', '0'
-- and '' for a value that is not a lease.
local function leaseFields(v)
  local _, fence, acquired, holder = leaseOf(v)
  if fence then return fence, acquired, holder end
  return '0', '0', ''
end

-- heldToken returns the fencing token (a number) of v when it is a lease of
-- the owner whose tag is tag, or nil.
local function heldToken(v, tag)
  if not holds(v, tag) then return nil end
  return tonumber(string.match(v, '^(%d+) ', #tag + 1))
end

-- heldUpTo tells whether v is a lease of the owner whose tag is tag with a
-- fencing token of at most upTo (a number). The
-- renew and release scripts of one acquisition pass its token: a later
-- acquisition of the same owner (a restarted operator: same owner token) has
-- a larger one and is not theirs to extend or delete. "At most", not "equal":
-- in Redlock mode a node whose fence write-back failed holds the acquisition
-- with a lower token than the lease's (raise.lua).
local function heldUpTo(v, tag, upTo)
  local f = heldToken(v, tag)
  return f ~= nil and f <= upTo
end

-- releaseHeld deletes the lock key lk when the owner whose tag is tag holds
-- it with a token of at most upTo (heldUpTo), and returns the lease's
-- fence; it returns nil and changes nothing otherwise.
local function releaseHeld(lk, tag, upTo)
  local v = redis.call('GET', lk)
  if not heldUpTo(v, tag, upTo) then return nil end
  redis.call('DEL', lk)
  return string.match(v, '^(%d+) ', #tag + 1) or '0'
end
