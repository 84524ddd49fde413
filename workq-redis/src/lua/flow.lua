-- Flow control on the server: groups taking turns, concurrency limits and
-- hand-out rates, the rules of the in-memory queue's state machine
-- (workq/src/state/flow.rs) kept in keys of the queue's hash tag. Every
-- script is common.lua, then this file, then the operation: the functions
-- below run inside the one script run of each decision, and only on a queue
-- whose `flow` hash exists (common.lua's flow_on()).
--
-- Keys (K_BASE is `prefix:{name}:`; G stands for a group's name, P for a
-- priority as a decimal integer):
--   flow     HASH  the settings every process applies (written at build by a
--                  handle built with flow settings, see flow_set.lua):
--                  json (workq::flow::FlowLimits as JSON, for operators),
--                  gen (changes with every new setting), max (leases out at
--                  most), pg (per group), ri/rb (the queue's hand-out rate: us
--                  between tokens, burst), gri/grb (every group's), ov ('1'
--                  when some group has settings of its own), gr ('1' when
--                  some group has a rate), and per group l:G (limit), w:G
--                  (weight), r:G ('us-between-tokens burst')
--   fstate   HASH  n (ready items, all groups), t (the queue's bucket: the
--                  theoretical arrival time of its next token, us)
--   fgr      HASH  item -> its group, for every item the queue holds (queued,
--                  delayed, leased, re-added while leased): the group an add
--                  gave when the queue did not hold the item; fixed while held
--   frt      HASH  item -> when it became ready (us), for the queued items
--   fq:P:G   LIST  group G's ready items at priority P, head first (the ready
--                  lists of common.lua stay empty)
--   fg:G     HASH  group G: f (its leases out), c (turns left in its current
--                  visit, deficit round robin; absent is 0), t (its bucket's
--                  arrival time, us), k (present while parked: waiting for a
--                  token), q:P (present while fq:P:G is non-empty), r:P
--                  (present while G has an entry in ring P)
--   fr:P     LIST  ring P: the groups taking turns at priority P, front first
--   frings   ZSET  P -> P for each ring that may be non-empty (pruned when
--                  found empty)
--   fready   ZSET  G -> its ready items, for the groups with ready items or
--                  leases out (the operator's top groups, and the count of
--                  groups with ready work)
--   fsat     SET   groups at their in-flight limit
--   fpark    ZSET  G -> when its next token is due, for parked groups
--   fidle    ZSET  G -> when its bucket is full, for groups that hold nothing
--                  but a refilling bucket (forgotten then, a few per get)
--
-- A hand-out (flow_pop): the queue-wide limit (ZCARD proc) and the queue's
-- bucket; then the highest priority whose ring has a group that may hand out
-- now; that ring's front group hands out its oldest ready item at that
-- priority, and goes to the back of the ring once it used up its weight in
-- turns. A group that may not hand out (at its limit, or parked) is dropped
-- from a ring when it comes to its front; it joins again at the back of every
-- ring where it has items when a lease of it ends (flow_lease_ended) or its
-- token comes due (unpark). Rings are lazy: an entry whose lane emptied meanwhile
-- (a raise, an operator's remove) stays until it comes to the front, and r:P
-- keeps one entry per group and ring. So each decision costs O(1) commands in
-- the number of groups (amortised: a ring entry is dropped once), plus
-- O(log n) in the sorted sets.
--
-- Why these structures: a list per group and priority gives FIFO inside a group
-- with O(1) pushes and pops (and the head for a released item), as the ready
-- lists do; a ring is a list too, rotated with one LPOP and RPUSH, and pruned
-- only at its front, so that no decision walks or LREMs through the groups
-- (an entry that went stale in the middle waits for its turn to be dropped,
-- as in memory); the item -> group hash is what lets a done, a release or a
-- reclaim, which only name the item, find the group's counts; the sorted set
-- of ready counts is kept with one ZADD INCR per change so that the operator's
-- top groups and the count of groups with work cost O(log n), not a scan; the
-- group hash holds every per-group field in one key, read with one HMGET per
-- decision.
--
-- A group's state is forgotten (its hash emptied, so Redis deletes it) once it
-- has no ready item, no lease out, no ring entry and no park, and its bucket
-- is full: at once, or through `fidle` when its bucket still refills.
--
-- Leases count in their group from hand-out to the end of the lease (done,
-- release, reclaim of an expired lease, dead letter). Every process's leases
-- count, since every decision reads the counts on the server.
--
-- Buckets are GCRA (virtual scheduling): one arrival time per bucket, on the
-- server's clock (TIME, us): the next token is there at t - (burst - 1) *
-- interval; taking it sets t to max(t, now) + interval.

local K_FSTATE = K_BASE .. 'fstate'
local K_FGR = K_BASE .. 'fgr'
local K_FRT = K_BASE .. 'frt'
local K_FRINGS = K_BASE .. 'frings'
local K_FREADY = K_BASE .. 'fready'
local K_FSAT = K_BASE .. 'fsat'
local K_FPARK = K_BASE .. 'fpark'
local K_FIDLE = K_BASE .. 'fidle'

-- Group `g`'s ready list at priority `p`.
local function flane(p, g)
  return K_BASE .. 'fq:' .. int(p) .. ':' .. g
end

-- The ring of priority `p`.
local function fring(p)
  return K_BASE .. 'fr:' .. int(p)
end

-- Group `g`'s hash.
local function fgroup(g)
  return K_BASE .. 'fg:' .. g
end

-- A bucket's time (a float: intervals need not be whole microseconds).
local function num(x)
  return string.format('%.17g', x)
end

-- The server's clock, read once per script run by the flow functions.
local flow_time = nil
local function flow_now()
  if not flow_time then
    flow_time = now_us()
  end
  return flow_time
end

-- The settings, read once per script run.
local settings = nil
local function flow_settings()
  if not settings then
    local s = redis.call('HMGET', K_FLOW, 'max', 'pg', 'ri', 'rb', 'gri', 'grb', 'ov', 'gr', 'gen')
    settings = {
      max = tonumber(s[1]),
      per_group = tonumber(s[2]),
      ri = tonumber(s[3]),
      rb = tonumber(s[4]) or 1,
      gri = tonumber(s[5]),
      grb = tonumber(s[6]) or 1,
      overrides = s[7] == '1',
      group_rates = s[8] == '1',
      gen = s[9] or '0',
    }
  end
  return settings
end

-- Group `g`'s settings (limit, weight, rate), read once per script run.
local group_memo = {}
local function gset(g)
  local c = group_memo[g]
  if not c then
    local s = flow_settings()
    c = {limit = s.per_group, weight = 1, ri = s.gri, rb = s.grb}
    if s.overrides then
      local o = redis.call('HMGET', K_FLOW, 'l:' .. g, 'w:' .. g, 'r:' .. g)
      if o[1] then
        c.limit = tonumber(o[1])
      end
      if o[2] then
        c.weight = tonumber(o[2])
      end
      if o[3] then
        local ri, rb = string.match(o[3], '^(%S+) (%S+)$')
        c.ri, c.rb = tonumber(ri), tonumber(rb)
      end
    end
    group_memo[g] = c
  end
  return c
end

-- Whether a group of settings `gs` with `f` leases out is at its limit.
local function saturated(gs, f)
  return gs.limit ~= nil and f >= gs.limit
end

-- When a bucket of arrival time `t` (a string or false) has its next token.
local function token_at(t, ri, rb)
  return (tonumber(t) or 0) - (rb - 1) * ri
end

-- Puts group `g` at the back of the ring of priority `p`.
local function ring_join(g, G, p)
  redis.call('HSET', G, 'r:' .. int(p), 1)
  if redis.call('RPUSH', fring(p), g) == 1 then
    redis.call('ZADD', K_FRINGS, p, int(p))
  end
end

-- Group `g` has no ready item and no lease out: out of `fready`, and its hash
-- emptied, unless a ring entry or a park still names it (forgotten when they
-- go) or its bucket still refills (forgotten through `fidle`).
local function idle(g, G)
  redis.call('ZREM', K_FREADY, g)
  local h = redis.call('HGETALL', G)
  local fields, t = {}, nil
  for i = 1, #h, 2 do
    local k = h[i]
    if k == 'k' or string.sub(k, 1, 2) == 'r:' then
      return
    end
    if k == 't' then
      t = tonumber(h[i + 1])
    end
    fields[#fields + 1] = k
  end
  if t and t > flow_now() then
    redis.call('ZADD', K_FIDLE, num(t), g)
    return
  end
  if #fields > 0 then
    redis.call('HDEL', G, unpack(fields))
  end
end

-- Whether group `g` holds nothing: no lease out (`f`) and no ready item.
local function empty_group(g, f)
  return f == 0 and (tonumber(redis.call('ZSCORE', K_FREADY, g)) or 0) <= 0
end

-- Group `g` may hand out again: its turn is over (credit 0), and it joins the
-- back of every ring where it has ready items and no entry. Returns whether
-- it has ready items.
local function rejoin(g, G)
  local h = redis.call('HGETALL', G)
  local lanes, ringed = {}, {}
  for i = 1, #h, 2 do
    local kind, p = string.sub(h[i], 1, 2), string.sub(h[i], 3)
    if kind == 'q:' then
      lanes[#lanes + 1] = p
    elseif kind == 'r:' then
      ringed[p] = true
    end
  end
  redis.call('HDEL', G, 'c')
  for _, p in ipairs(lanes) do
    if not ringed[p] then
      ring_join(g, G, tonumber(p))
    end
  end
  return #lanes > 0
end

-- Queues `x` in group `g` at priority `p` (at the head or the tail), joining
-- the group to that ring if it may hand out and has no entry there. `counted`:
-- a new ready item (not one moved between priorities).
local function push(x, g, p, head, counted)
  local G = fgroup(g)
  local ps = int(p)
  local st = redis.call('HMGET', G, 'f', 'k', 'r:' .. ps, 'q:' .. ps)
  redis.call(head and 'LPUSH' or 'RPUSH', flane(p, g), x)
  if not st[4] then
    redis.call('HSET', G, 'q:' .. ps, 1)
  end
  local f = tonumber(st[1]) or 0
  if counted then
    local n = tonumber(redis.call('ZADD', K_FREADY, 'INCR', 1, g))
    if n == 1 and f == 0 then
      -- Back from idle: not to be forgotten.
      redis.call('ZREM', K_FIDLE, g)
    end
    redis.call('HINCRBY', K_FSTATE, 'n', 1)
    redis.call('HSET', K_FRT, x, int(flow_now()))
  end
  if not st[2] and not st[3] and not saturated(gset(g), f) then
    ring_join(g, G, p)
  end
end

-- enqueue() with flow control: `x` joins its group's list at its priority. Its
-- group is the one the queue holds it in, else `given` (an add's), else ''.
flow_enqueue = function(x, head, given)
  local g = redis.call('HGET', K_FGR, x)
  if not g then
    g = given or ''
    redis.call('HSET', K_FGR, x, g)
  end
  push(x, g, prio_of(x), head, true)
end

-- raise() with flow control: the queued `x` moves from priority `old` to the
-- tail of priority `new` in its group (its prio is set already). Its ring
-- entry at `old` stays if the lane emptied: dropped when it comes up.
flow_move = function(x, old, new)
  local g = redis.call('HGET', K_FGR, x) or ''
  local key = flane(old, g)
  redis.call('LREM', key, 1, x)
  if redis.call('EXISTS', key) == 0 then
    redis.call('HDEL', fgroup(g), 'q:' .. int(old))
  end
  push(x, g, new, false, false)
end

-- The queued `x` at priority `p` leaves its group's list without a hand-out
-- (an operator's remove). Returns 1 if it was there.
local function flow_unqueue(x, p)
  local g = redis.call('HGET', K_FGR, x) or ''
  local G = fgroup(g)
  local key = flane(p, g)
  if redis.call('LREM', key, 1, x) == 0 then
    return 0
  end
  if redis.call('EXISTS', key) == 0 then
    redis.call('HDEL', G, 'q:' .. int(p))
  end
  redis.call('HINCRBY', K_FSTATE, 'n', -1)
  redis.call('HDEL', K_FRT, x)
  if tonumber(redis.call('ZADD', K_FREADY, 'INCR', -1, g)) <= 0
    and (tonumber(redis.call('HGET', G, 'f')) or 0) == 0 then
    idle(g, G)
  end
  return 1
end

-- The queue no longer holds `x` (not queued, leased or delayed): it forgets
-- its group.
local function flow_drop(x)
  redis.call('HDEL', K_FGR, x)
end

-- `x` goes to the dead letters: returns its group (for the letter) and
-- forgets it.
flow_letter = function(x)
  local g = redis.call('HGET', K_FGR, x)
  redis.call('HDEL', K_FGR, x)
  if g then
    return g
  end
  return nil
end

-- The lease of `x` ended (done, released, reclaimed or dead-lettered) and, if
-- it was queued again, after it was: its group has one lease fewer. A group
-- that was at its limit takes its turns again and wakes a getter. (Every
-- leased item has its group and counts in it: flow_set.lua gives the ones
-- leased when flow control comes on the group ''. The guards below only keep
-- a count that went wrong some other way from going wrong further.)
flow_lease_ended = function(x)
  local g = redis.call('HGET', K_FGR, x)
  if not g then
    return
  end
  local G = fgroup(g)
  local f = redis.call('HINCRBY', G, 'f', -1)
  if f < 0 then
    redis.call('HSET', G, 'f', 0)
    f = 0
  end
  local gs = gset(g)
  if gs.limit and f == gs.limit - 1 then
    redis.call('SREM', K_FSAT, g)
    if redis.call('HEXISTS', G, 'k') == 0 and rejoin(g, G) then
      wake()
    end
  end
  if empty_group(g, f) then
    idle(g, G)
  end
end

-- `k` leases ended in this run: if they took the queue off its limit, a
-- getter held back by it wakes.
flow_freed = function(k)
  local s = flow_settings()
  if s.max then
    local out = redis.call('ZCARD', K_PROC)
    if out < s.max and out + k >= s.max then
      wake()
    end
  end
end

-- How many items are ready.
flow_ready_count = function()
  return tonumber(redis.call('HGET', K_FSTATE, 'n')) or 0
end

-- Whether another hand-out may be possible now (a hand-out wakes the next
-- getter then).
local function flow_more()
  if redis.call('EXISTS', K_FRINGS) == 0 then
    return false
  end
  local s = flow_settings()
  return not s.max or redis.call('ZCARD', K_PROC) < s.max
end

-- The settings' generation, sent with each hand-out: a process whose own
-- settings were replaced by another's learns of it.
local function flow_gen()
  return flow_settings().gen
end

-- Parked groups whose token is due take their turns again.
local function unpark(now)
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', K_FPARK, '-inf', num(now), 'LIMIT', 0, BATCH)) do
    redis.call('ZREM', K_FPARK, g)
    local G = fgroup(g)
    redis.call('HDEL', G, 'k')
    local f = tonumber(redis.call('HGET', G, 'f')) or 0
    if not saturated(gset(g), f) then
      rejoin(g, G)
    end
    if empty_group(g, f) then
      idle(g, G)
    end
  end
end

-- Forgets up to four groups whose buckets are full again and that hold
-- nothing: amortised O(1) per hand-out, so that a queue that sees a million
-- groups over its life keeps only the live ones.
local function sweep(now)
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', K_FIDLE, '-inf', num(now), 'LIMIT', 0, 4)) do
    redis.call('ZREM', K_FIDLE, g)
    local G = fgroup(g)
    if empty_group(g, tonumber(redis.call('HGET', G, 'f')) or 0) then
      idle(g, G)
    end
  end
end

-- pop_ready() with flow control: finds who hands out next (pruning the rings
-- and parking groups out of tokens on the way), and takes that group's oldest
-- ready item at that priority. Returns the item and its priority, or false, 0
-- and the time in us until a token is due (-1: none is; a lease's end or an
-- add wakes the getters).
flow_pop = function(now)
  local s = flow_settings()
  if s.group_rates then
    unpark(now)
    sweep(now)
  end
  if s.max and redis.call('ZCARD', K_PROC) >= s.max then
    return false, 0, -1
  end
  local qt = nil
  if s.ri then
    qt = redis.call('HGET', K_FSTATE, 't')
    local at = token_at(qt, s.ri, s.rb)
    if at > now then
      return false, 0, math.ceil(at - now)
    end
  end
  while true do
    local top = redis.call('ZRANGE', K_FRINGS, -1, -1)[1]
    if not top then
      break
    end
    local p = tonumber(top)
    local ring = fring(p)
    while true do
      local g = redis.call('LRANGE', ring, 0, 0)[1]
      if not g then
        break
      end
      local G = fgroup(g)
      local st = redis.call('HMGET', G, 'f', 'k', 'c', 't', 'q:' .. top)
      local gs = gset(g)
      local f = tonumber(st[1]) or 0
      local x = false
      if not st[5] or st[2] or saturated(gs, f) then
        -- Its lane emptied, or it may not hand out: out of this ring.
        redis.call('LPOP', ring)
        if st[5] then
          redis.call('HDEL', G, 'r:' .. top)
        else
          redis.call('HDEL', G, 'r:' .. top, 'c')
          if empty_group(g, f) then
            idle(g, G)
          end
        end
      elseif gs.ri and token_at(st[4], gs.ri, gs.rb) > now then
        -- Out of tokens: parked until the next one is due.
        redis.call('LPOP', ring)
        redis.call('HDEL', G, 'r:' .. top, 'c')
        redis.call('HSET', G, 'k', 1)
        redis.call('ZADD', K_FPARK, num(token_at(st[4], gs.ri, gs.rb)), g)
      else
        local key = flane(p, g)
        x = redis.call('LPOP', key)
        if not x then
          -- Not expected (q:P names a list that is gone): mended, and on.
          redis.call('HDEL', G, 'q:' .. top)
        end
      end
      if x then
        -- The hand-out: tokens, the lease count, the turn.
        if s.ri then
          redis.call('HSET', K_FSTATE, 't', num(math.max(tonumber(qt) or 0, now) + s.ri))
        end
        local fields = {'f', f + 1}
        if gs.ri then
          fields[#fields + 1] = 't'
          fields[#fields + 1] = num(math.max(tonumber(st[4]) or 0, now) + gs.ri)
        end
        local full = saturated(gs, f + 1)
        if full then
          redis.call('SADD', K_FSAT, g)
        end
        local credit = tonumber(st[3]) or 0
        if credit == 0 then
          credit = gs.weight
        end
        credit = credit - 1
        redis.call('ZADD', K_FREADY, 'INCR', -1, g)
        redis.call('HINCRBY', K_FSTATE, 'n', -1)
        redis.call('HDEL', K_FRT, x)
        if redis.call('EXISTS', flane(p, g)) == 0 then
          -- Its last item here: out of this ring, its turn over.
          redis.call('LPOP', ring)
          redis.call('HDEL', G, 'q:' .. top, 'r:' .. top, 'c')
        elseif credit == 0 or full then
          redis.call('LPOP', ring)
          if full then
            redis.call('HDEL', G, 'r:' .. top, 'c')
          else
            redis.call('RPUSH', ring, g)
            redis.call('HDEL', G, 'c')
          end
        else
          fields[#fields + 1] = 'c'
          fields[#fields + 1] = credit
        end
        redis.call('HSET', G, unpack(fields))
        return x, p, -1
      end
    end
    redis.call('ZREM', K_FRINGS, top)
  end
  -- Nothing may be handed out now: wait for the first parked group's token.
  local first = redis.call('ZRANGE', K_FPARK, 0, 0, 'WITHSCORES')
  if first[2] then
    return false, 0, math.max(1, math.ceil(tonumber(first[2]) - now))
  end
  return false, 0, -1
end

-- Every flow control key of the queue is deleted (delete.lua, flow_clear.lua):
-- the groups' lists and hashes, the rings, and the rest.
local function flow_delete_all()
  local groups, seen = {}, {}
  local function note(g)
    if not seen[g] then
      seen[g] = true
      groups[#groups + 1] = g
    end
  end
  for _, key in ipairs({K_FREADY, K_FIDLE, K_FPARK}) do
    for _, g in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      note(g)
    end
  end
  for _, p in ipairs(redis.call('ZRANGE', K_FRINGS, 0, -1)) do
    for _, g in ipairs(redis.call('LRANGE', fring(tonumber(p)), 0, -1)) do
      note(g)
    end
    redis.call('DEL', fring(tonumber(p)))
  end
  for _, g in ipairs(groups) do
    local G = fgroup(g)
    local h = redis.call('HGETALL', G)
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'q:' then
        redis.call('DEL', flane(tonumber(string.sub(h[i], 3)), g))
      end
    end
    redis.call('DEL', G)
  end
  redis.call('DEL', K_FLOW, K_FSTATE, K_FGR, K_FRT, K_FRINGS, K_FREADY, K_FSAT, K_FPARK, K_FIDLE)
end
