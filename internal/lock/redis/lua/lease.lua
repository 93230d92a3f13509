-- lease.lua: the value of a mutex lease's lock key. Prepended to every script
-- that reads or writes it (scripts.go).
--
-- A held lock key's value is the whole lease, so that taking, renewing and
-- releasing it each touch one key:
--   <length of owner>:<owner> <fence> <acquired us> <holder>
-- The owner token comes first, behind its length, so that "is this key held
-- by owner" is one prefix comparison (leaseTag) whatever bytes the token and
-- the holder contain.
-- Before this layout the value was the bare owner token, and fence, holder
-- and acquired were fields of a separate hash (the meta key). Such a lease,
-- taken before an upgrade, is still honoured until it is released or
-- expires: leaseOf returns nil for it and the scripts read the meta hash.

-- leaseTag is the prefix of the value of every lease owner holds.
local function leaseTag(owner) return #owner .. ':' .. owner .. ' ' end

-- heldAs tells how owner (whose leaseTag is tag) holds the lock key whose
-- value is v: 'lease' in this layout, 'old' in the old one, nil when it does
-- not. The one definition of "held by" every script uses.
local function heldAs(v, owner, tag)
  if not v then return nil end
  if string.sub(v, 1, #tag) == tag then return 'lease' end
  if v == owner then return 'old' end
  return nil
end

-- leaseOf splits a lock key's value into owner, fence, acquired and holder
-- (strings), or returns nil when the value is in the old layout.
local function leaseOf(v)
  local len, at = string.match(v, '^(%d+):()')
  if not len then return nil end
  local stop = at + tonumber(len)
  local fence, acquired, holder = string.match(v, '^ (%d+) (%d+) (.*)$', stop)
  if not fence then return nil end
  return string.sub(v, at, stop - 1), fence, acquired, holder
end

-- leaseFields returns the fence, acquired and holder of the lease v, the
-- value of a held lock key whose old-layout metadata is in the hash meta.
local function leaseFields(v, meta)
  local _, fence, acquired, holder = leaseOf(v)
  if fence then return fence, acquired, holder end
  local m = redis.call('HMGET', meta, 'fence', 'acquired', 'holder')
  return m[1] or '0', m[2] or '0', m[3] or ''
end

-- releaseHeld deletes the lock key lk (and its old-layout metadata meta) when
-- owner, whose leaseTag is tag, holds it, and returns the lease's fence; it
-- returns nil and changes nothing when owner does not hold lk.
local function releaseHeld(lk, meta, owner, tag)
  local v = redis.call('GET', lk)
  local how = heldAs(v, owner, tag)
  if how == 'lease' then
    redis.call('DEL', lk)
    return string.match(v, '^(%d+) ', #tag + 1) or '0'
  elseif how == 'old' then
    local fence = redis.call('HGET', meta, 'fence') or '0'
    redis.call('DEL', lk, meta)
    return fence
  end
  return nil
end
