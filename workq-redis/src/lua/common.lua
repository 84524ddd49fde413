-- Shared by every script of the queue. Each script is this file followed by the
-- operation's own file, run as one EVALSHA: Redis runs it to completion with no
-- other command in between, so every rule below holds across processes.
--
-- Keys (all share one hash tag, so the queue lives in one cluster slot):
--   ready   LIST  items ready to hand out at priority 0, head first
--   ready:P LIST  (derived from `ready`, same hash tag) items ready at priority
--                 P (a non-zero integer), head first; exists only while non-empty
--   lanes   ZSET  P -> P for every non-zero priority whose list is non-empty
--   prio    HASH  item -> priority, for queued, delayed and re-added (dirty)
--                 items that were given one; absent means 0, except that for
--                 an item being processed it means no re-add gave a priority
--   lprio   HASH  item -> priority its current lease was handed out with (only
--                 when non-zero): a release or reclaim queues it there again
--   dirty   SET   items that need processing: queued, or re-added while processing
--   proc    ZSET  items being processed -> lease deadline (server clock, microseconds)
--   lease   HASH  item -> fencing token of the current holder
--   since   HASH  item -> when the current lease was handed out (microseconds)
--   delay   ZSET  items waiting for a delay -> ready time (microseconds)
--   fail    HASH  item -> failures counted by add_rate_limited (reset by forget)
--   stalls  HASH  item -> leases of the item that expired and were reclaimed
--   bucket  HASH  the shared token bucket: tokens, last
--   marker  ZSET  one member: present when a blocked getter should look again
--   seq     STRING the counter behind fencing tokens and add sequence numbers
--   shut    STRING present while the queue is shut down for every process
--   dead    LIST  dead letters (JSON entries), oldest first, capped
--   meta    HASH  counters: dead_dropped (dead letters dropped by the cap), adds,
--                 done, failures (see counters.rs); flag: paused (see pause.rs)
--
-- Invariants: an item is in a ready list exactly when it is in `dirty` and not
-- in `proc`, and then it is in one ready list once (the list of its priority)
-- and not in `delay`. A non-zero priority is in `lanes` exactly when its list
-- is non-empty, so a queue that never uses priorities only ever checks that
-- `lanes` does not exist.
--
-- Flow control (flow.lua) lives in keys of its own beside these, derived from
-- the queue's prefix (`flow`, `fgr`, `fq:P:GROUP`, ...), and only exists on a
-- queue built with a group function, a limit or a rate: the `flow` hash is
-- there exactly then. With it, the ready items live in their groups' lists
-- instead of the ready lists above (which stay empty), and every function
-- below that queues an item, takes one or ends a lease hands over to flow.lua.
-- Without it, each script run pays one EXISTS at most (and a get none: it
-- rides on the check of `lanes`).
--
-- Trace links (workq's feature `otel`; docs/tracing.md) live in four hashes of
-- their own beside these, derived from the queue's prefix like the flow keys
-- (not among KEYS, so that no call sends more key names for them):
--   links   HASH  item -> the links of its pending adds: the `traceparent`s
--                 (55 bytes each) of the first MAX_LINKS adds since it was
--                 last handed out, joined by ',', in add order
--   ldrop   HASH  item -> how many adds' links were dropped beyond those
--                 (only beside MAX_LINKS links)
--   llinks  HASH  item -> the links its current lease took at the hand-out
--   lldrop  HASH  item -> the drops its current lease took
-- An item has `links` only while an add of it is pending (queued, delayed, or
-- re-added while leased), and `llinks` only while it is leased. An add sends
-- a `traceparent` only when it was made in a recorded span, so a queue that
-- never saw one has none of these keys, and the check for them rides on the
-- EXISTS each script run makes anyway (exists_and_links).

local K_READY, K_DIRTY, K_PROC, K_LEASE, K_SINCE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_DELAY, K_FAIL, K_STALLS, K_BUCKET = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local K_MARKER, K_SEQ, K_SHUT, K_DEAD = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local K_META, K_LANES, K_PRIO, K_LPRIO = KEYS[14], KEYS[15], KEYS[16], KEYS[17]

-- The flow control keys: the queue's prefix (`prefix:{name}:`, the hash tag
-- included) and a suffix, so that they are in the queue's cluster slot; see
-- flow.lua for what each holds.
local K_BASE = string.sub(K_READY, 1, -6)
local K_FLOW = K_BASE .. 'flow'

-- The trace link hashes (see above).
local K_LINKS, K_LDROP = K_BASE .. 'links', K_BASE .. 'ldrop'
local K_LLINKS, K_LLDROP = K_BASE .. 'llinks', K_BASE .. 'lldrop'

-- Whether the queue holds trace links: known once an EXISTS asked (nil until
-- then), and true from a write of one on.
local links_are_on = nil

-- One EXISTS of `...` that also tells whether the queue holds trace links:
-- each key of `...` is named three times, so that the count splits into three
-- times how many of them exist (returned) and how many of `links` and
-- `llinks` do (0 to 2, noted in links_are_on).
local function exists_and_links(...)
  local names = {}
  for _, k in ipairs({...}) do
    names[#names + 1] = k
    names[#names + 1] = k
    names[#names + 1] = k
  end
  names[#names + 1] = K_LINKS
  names[#names + 1] = K_LLINKS
  local n = redis.call('EXISTS', unpack(names))
  links_are_on = n % 3 > 0
  return (n - n % 3) / 3
end

-- Whether the queue has flow control: read once per script run, when first
-- asked (nil until then).
local flow_is_on = nil
local function flow_on()
  if flow_is_on == nil then
    flow_is_on = exists_and_links(K_FLOW) == 1
  end
  return flow_is_on
end

-- Whether the queue holds trace links (read once per script run).
local function links_on()
  if links_are_on == nil then
    links_are_on = redis.call('EXISTS', K_LINKS, K_LLINKS) > 0
  end
  return links_are_on
end

-- The flow control functions, defined in flow.lua (which follows this file in
-- every script) and called from here only when the queue has flow control.
local flow_enqueue, flow_move, flow_pop, flow_lease_ended, flow_freed, flow_ready_count
local flow_letter

-- Items moved per call by promotion and by reclaim: keeps every call short.
local BATCH = 100

-- Integers as decimal strings (Lua's tostring would use an exponent).
local function int(x)
  return string.format('%.0f', x)
end

-- The server's clock, in microseconds. Workers never send timestamps, only
-- durations, so their clocks do not matter.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The next fencing token / sequence number: the larger of the counter plus one
-- and the server's clock in microseconds, written back. A counter that went
-- back (a restart from an older AOF or RDB, a failover to a lagging replica,
-- or a server without persistence) is overtaken by the clock, which moved on
-- since the tokens it forgot were handed out, so no token is handed out twice
-- and a later hand-out always has a larger token. Needs fewer than a million
-- hand-outs per second on average to track the clock, which Redis cannot
-- exceed; a clock stepped back only slows the tokens down to the counter.
local function next_seq(now)
  -- One read and one write, as INCR alone would be.
  local s = (tonumber(redis.call('GET', K_SEQ)) or 0) + 1
  if s < now then
    s = now
  end
  redis.call('SET', K_SEQ, int(s))
  return s
end

-- Wakes one blocked getter (it pops the marker, then calls `get`).
local function wake()
  redis.call('ZADD', K_MARKER, 0, 'm')
end

-- Whether `holder` (the item's current token, or false) is the caller's
-- `token`: the fencing check of done, renew, release and retry_done. No argument
-- of any script turns it off.
local function holds(holder, token)
  return holder == token
end

local function is_processing(x)
  return redis.call('ZSCORE', K_PROC, x) ~= false
end

-- The ready list of priority `p`.
local function lane(p)
  if p == 0 then
    return K_READY
  end
  return K_READY .. ':' .. int(p)
end

-- The priority `x` is queued (or delayed) with: 0 unless it was given one.
local function prio_of(x)
  return tonumber(redis.call('HGET', K_PRIO, x)) or 0
end

-- Queues `x` (in `dirty`, not processing) at its priority: at the tail, or at
-- the head for work that was handed out before. `g` is the group an add gave
-- (nil for none); with flow control the item joins its group's list (flow.lua).
local function enqueue(x, head, g)
  if flow_on() then
    return flow_enqueue(x, head, g)
  end
  local p = prio_of(x)
  redis.call(head and 'LPUSH' or 'RPUSH', lane(p), x)
  if p ~= 0 then
    redis.call('ZADD', K_LANES, p, int(p))
  end
end

-- Forgets priority `p`'s list in `lanes` once it is empty.
local function drop_lane_if_empty(p)
  if p ~= 0 and redis.call('LLEN', lane(p)) == 0 then
    redis.call('ZREM', K_LANES, int(p))
  end
end

-- Takes the next ready item: the head of the highest priority's list.
-- Returns the item (or false) and its priority; with flow control, the item
-- (or false), its priority and the time until something may change (flow_pop).
-- A queue without priorities and flow control finds out with the one EXISTS it
-- always made (which also tells whether it holds trace links).
local function pop_ready(now)
  local p = 0
  if exists_and_links(K_LANES, K_FLOW) == 0 then
    flow_is_on = false
  else
    if flow_on() then
      return flow_pop(now)
    end
    p = tonumber(redis.call('ZRANGE', K_LANES, -1, -1, 'WITHSCORES')[2]) or 0
    if p < 0 and redis.call('LLEN', K_READY) > 0 then
      p = 0
    end
  end
  local x = redis.call('LPOP', lane(p))
  drop_lane_if_empty(p)
  return x, p
end

-- Whether any item is ready.
local function any_ready()
  return redis.call('LLEN', K_READY) > 0 or redis.call('EXISTS', K_LANES) == 1
end

-- How many items are ready, at every priority.
local function ready_count()
  if flow_on() then
    return flow_ready_count()
  end
  local n = redis.call('LLEN', K_READY)
  for _, p in ipairs(redis.call('ZRANGE', K_LANES, 0, -1)) do
    n = n + redis.call('LLEN', lane(tonumber(p)))
  end
  return n
end

-- Records priority `p` (nil: none given) of an add of `x`, which is not
-- queued: delayed or new (`base` 0), or being processed (`base` nil: the
-- first priority a re-add gives counts, even a negative one). The highest
-- priority given wins.
local function give(x, p, base)
  if p == nil then
    return
  end
  local cur = tonumber(redis.call('HGET', K_PRIO, x)) or base
  if cur == nil or p > cur then
    redis.call('HSET', K_PRIO, x, int(p))
  end
end

-- A queued `x` is added again with priority `p` (nil: none given): a higher
-- priority moves it to the tail of that priority's list; a lower one, or
-- none, changes nothing.
local function raise(x, p)
  if p == nil then
    return
  end
  local old = prio_of(x)
  if p <= old then
    return
  end
  if flow_on() then
    redis.call('HSET', K_PRIO, x, int(p))
    return flow_move(x, old, p)
  end
  redis.call('LREM', lane(old), 1, x)
  drop_lane_if_empty(old)
  redis.call('HSET', K_PRIO, x, int(p))
  enqueue(x, false)
end

-- Trace links (see the keys above). A link is the `traceparent` an add sent;
-- the links of an item are kept joined by ',' in one field, each 55 bytes.
local MAX_LINKS = 4
local TP_LEN = 55
-- The length of MAX_LINKS links joined: a field this long is full.
local FULL = MAX_LINKS * (TP_LEN + 1) - 1
local HEX = '[0-9a-f]'
local TP_SHAPE = '^' .. string.rep(HEX, 2) .. '%-' .. string.rep(HEX, 32) .. '%-'
  .. string.rep(HEX, 16) .. '%-' .. string.rep(HEX, 2) .. '$'

-- The `traceparent` argument of an add (nil or '': none): a W3C traceparent
-- of 55 bytes (a version of two lowercase hex digits but ff, a trace id and a
-- span id of lowercase hex not all zeros, two hex digits of trace options,
-- dashes between), else nil: anything else a client sends is not stored.
local function traceparent_arg(a)
  if a == nil or #a ~= TP_LEN or not string.find(a, TP_SHAPE)
    or string.sub(a, 1, 2) == 'ff'
    or string.sub(a, 4, 35) == string.rep('0', 32)
    or string.sub(a, 37, 52) == string.rep('0', 16) then
    return nil
  end
  return a
end

-- The links of a field `v` (false: none), as a list.
local function split_links(v)
  local list = {}
  if v then
    for i = 1, #v, TP_LEN + 1 do
      list[#list + 1] = string.sub(v, i, i + TP_LEN - 1)
    end
  end
  return list
end

-- The links of the list `front`, then of the list `back`, the first MAX_LINKS
-- kept: returns them as a field (false for none) and the drops (`drops`, the
-- ones counted before, and those beyond MAX_LINKS here).
local function join_links(front, back, drops)
  local kept = {}
  for _, list in ipairs({front, back}) do
    for _, tp in ipairs(list) do
      if #kept < MAX_LINKS then
        kept[#kept + 1] = tp
      else
        drops = drops + 1
      end
    end
  end
  if #kept == 0 then
    return false, drops
  end
  return table.concat(kept, ','), drops
end

-- The drops counted beside the field `v` of `x` in `key` (only a full field
-- has any).
local function drops_of(key, x, v)
  if v and #v >= FULL then
    return tonumber(redis.call('HGET', key, x)) or 0
  end
  return 0
end

-- Puts the links of the list `front` (with `drops` counted) in front of the
-- links of `x`'s pending adds, at most MAX_LINKS, the rest counted: links
-- that were taken earlier (by a lease, a dead letter) come back.
local function links_in_front(x, front, drops)
  local pending = redis.call('HGET', K_LINKS, x)
  local v, d = join_links(front, split_links(pending), drops + drops_of(K_LDROP, x, pending))
  if not v then
    return
  end
  redis.call('HSET', K_LINKS, x, v)
  links_are_on = true
  if d > 0 then
    redis.call('HSET', K_LDROP, x, int(d))
  end
end

-- Keeps the link `tp` (nil: none) of an accepted add of each of `xs` (an item
-- may come more than once): behind the links of its pending adds while they
-- are fewer than MAX_LINKS, the rest counted in `ldrop`.
local function record_links(xs, tp)
  if tp == nil then
    return
  end
  local times, order = {}, {}
  for _, x in ipairs(xs) do
    if not times[x] then
      times[x] = 0
      order[#order + 1] = x
    end
    times[x] = times[x] + 1
  end
  local fields = redis.call('HMGET', K_LINKS, unpack(order))
  local writes = {}
  for i, x in ipairs(order) do
    local list = split_links(fields[i])
    local n, room = times[x], MAX_LINKS - #list
    if room > 0 then
      for _ = 1, math.min(n, room) do
        list[#list + 1] = tp
      end
      writes[#writes + 1] = x
      writes[#writes + 1] = table.concat(list, ',')
    end
    if n > room then
      redis.call('HINCRBY', K_LDROP, x, n - math.max(room, 0))
    end
  end
  if #writes > 0 then
    redis.call('HSET', K_LINKS, unpack(writes))
  end
  links_are_on = true
end

-- The hand-out of `xs` (each once): the links of their pending adds become
-- their leases'. Returns, by index in `xs`, {field, drops} for each item that
-- had links.
local function lease_links(xs)
  local found = {}
  if not links_on() then
    return found
  end
  local fields = redis.call('HMGET', K_LINKS, unpack(xs))
  local moved, taken = {}, {}
  for i, x in ipairs(xs) do
    local v = fields[i]
    if v then
      local d = drops_of(K_LDROP, x, v)
      if d > 0 then
        redis.call('HDEL', K_LDROP, x)
        redis.call('HSET', K_LLDROP, x, int(d))
      end
      found[i] = {v, d}
      moved[#moved + 1] = x
      taken[#taken + 1] = x
      taken[#taken + 1] = v
    end
  end
  if #moved > 0 then
    redis.call('HDEL', K_LINKS, unpack(moved))
    redis.call('HSET', K_LLINKS, unpack(taken))
  end
  return found
end

-- The leases of `xs` are done: their links go.
local function end_lease_links(xs)
  if links_on() then
    redis.call('HDEL', K_LLINKS, unpack(xs))
    redis.call('HDEL', K_LLDROP, unpack(xs))
  end
end

-- The lease of `x` ended unprocessed (a release, a reclaim): its links go
-- back to its pending adds, in front of the links of the adds made since, at
-- most MAX_LINKS (the rest counted), so that the next hand-out links to them.
local function restore_links(x)
  if not links_on() then
    return
  end
  local v = redis.call('HGET', K_LLINKS, x)
  if not v then
    return
  end
  local d = drops_of(K_LLDROP, x, v)
  redis.call('HDEL', K_LLINKS, x)
  if d > 0 then
    redis.call('HDEL', K_LLDROP, x)
  end
  links_in_front(x, split_links(v), d)
end

-- The pending adds of `x` are forgotten (an operator's remove): their links go.
local function forget_pending_links(x)
  if links_on() then
    redis.call('HDEL', K_LINKS, x)
    redis.call('HDEL', K_LDROP, x)
  end
end

-- `x` leaves the queue for the dead letters: returns its lease's links, then
-- its pending adds', at most MAX_LINKS, as a list (nil for none), and the
-- drops; the four hashes forget it.
local function bury_links(x)
  if not links_on() then
    return nil, 0
  end
  local leased = redis.call('HGET', K_LLINKS, x)
  local pending = redis.call('HGET', K_LINKS, x)
  local d = drops_of(K_LLDROP, x, leased) + drops_of(K_LDROP, x, pending)
  redis.call('HDEL', K_LLINKS, x)
  redis.call('HDEL', K_LLDROP, x)
  redis.call('HDEL', K_LINKS, x)
  redis.call('HDEL', K_LDROP, x)
  local v, drops = join_links(split_links(leased), split_links(pending), d)
  if not v then
    return nil, drops
  end
  return split_links(v), drops
end

-- `x`'s lease ended without done (released, or reclaimed): it is queued again
-- at the head of the higher of the priority it was handed out with and the
-- ones its re-adds gave since, with its lease's links (restore_links).
local function requeue_head(x)
  local p = tonumber(redis.call('HGET', K_LPRIO, x)) or 0
  local given = tonumber(redis.call('HGET', K_PRIO, x))
  if given and given > p then
    p = given
  end
  redis.call('HDEL', K_LPRIO, x)
  if p ~= 0 then
    redis.call('HSET', K_PRIO, x, int(p))
  else
    redis.call('HDEL', K_PRIO, x)
  end
  redis.call('SADD', K_DIRTY, x)
  enqueue(x, true)
  restore_links(x)
end

-- The priority argument of an add: nil when none was given ('').
local function priority_arg(a)
  if a == nil or a == '' then
    return nil
  end
  return tonumber(a)
end

-- Outcomes of an add, as the client decodes them.
local IGNORED, QUEUED, DUPLICATE, DEFERRED, DELAYED = 0, 1, 2, 3, 4

-- client-go's Add, with priority `p` (nil: none given), group `g` (nil: none
-- given; used only with flow control, by an item the queue does not hold) and
-- trace link `tp` (nil: none; see traceparent_arg). Called only while the
-- queue is not shut down: the add is accepted.
local function add_now(x, p, g, tp)
  record_links({x}, tp)
  if is_processing(x) then
    -- Re-added while processing: queued again when its lease ends. A pending
    -- delayed add is moot now: this one is sooner.
    redis.call('ZREM', K_DELAY, x)
    give(x, p, nil)
    if redis.call('SADD', K_DIRTY, x) == 1 then
      redis.call('HINCRBY', K_META, 'adds', 1)
      return DEFERRED
    end
    return DUPLICATE
  end
  if redis.call('SADD', K_DIRTY, x) == 0 then
    raise(x, p)
    return DUPLICATE
  end
  -- New, or waiting for a delay: ready now, and the delayed add goes.
  redis.call('HINCRBY', K_META, 'adds', 1)
  if redis.call('ZREM', K_DELAY, x) == 1 then
    give(x, p, 0)
  else
    give(x, p, nil)
  end
  enqueue(x, false, g)
  wake()
  return QUEUED
end

-- client-go's AddAfter with a positive delay: `at` is the ready time, `p` the
-- priority (nil: none given), `g` the group and `tp` the trace link (as for
-- add_now).
local function add_at(x, at, p, g, tp)
  record_links({x}, tp)
  local busy = is_processing(x)
  if redis.call('SISMEMBER', K_DIRTY, x) == 1 then
    -- Queued, or due for a re-add when its lease ends: nothing is sooner, but
    -- a higher priority counts.
    if busy then
      give(x, p, nil)
    else
      raise(x, p)
    end
    return DUPLICATE
  end
  if busy then
    give(x, p, nil)
  elseif redis.call('ZSCORE', K_DELAY, x) then
    give(x, p, 0)
  else
    if p ~= nil and p ~= 0 then
      redis.call('HSET', K_PRIO, x, int(p))
    end
    if flow_on() then
      -- Held from now on (delayed): its group is fixed while the queue holds it.
      redis.call('HSETNX', K_BASE .. 'fgr', x, g or '')
    end
  end
  -- LT inserts a new member and only ever lowers an existing score: the
  -- earliest ready time wins.
  redis.call('ZADD', K_DELAY, 'LT', at, x)
  local head = redis.call('ZRANGE', K_DELAY, 0, 0)
  if head[1] == x then
    -- A sleeping getter may be waiting for a later time: let it look again.
    wake()
  end
  return DELAYED
end

-- Moves delayed items that are due to the ready list (or marks them dirty if
-- they are being processed). Returns how many it queued, and how many due
-- items it took (at most BATCH).
local function promote(now)
  local due = redis.call('ZRANGEBYSCORE', K_DELAY, '-inf', now, 'LIMIT', 0, BATCH)
  local pushed = 0
  local added = 0
  for _, x in ipairs(due) do
    redis.call('ZREM', K_DELAY, x)
    if redis.call('SADD', K_DIRTY, x) == 1 then
      added = added + 1
      if not is_processing(x) then
        enqueue(x, false)
        pushed = pushed + 1
      end
    end
  end
  if added > 0 then
    redis.call('HINCRBY', K_META, 'adds', added)
  end
  return pushed, #due
end

-- Due delayed items join the ready lists before anything an add or a done
-- queues now, so that ready items come out in the order they became ready
-- (their due time, or their add), whether or not a get ran in between, as in
-- memory. Up to ten batches per call; a longer backlog of due items is
-- promoted by the gets. Nothing is promoted while the queue is shut down.
local function promote_due(now)
  if redis.call('EXISTS', K_SHUT) == 1 then
    return
  end
  local pushed, taken, rounds = 0, BATCH, 0
  while taken == BATCH and rounds < 10 do
    local p
    p, taken = promote(now)
    pushed = pushed + p
    rounds = rounds + 1
  end
  if pushed > 0 then
    wake()
  end
end

-- Dead letters keep the newest `cap` entries (0: no cap); older ones are
-- dropped and counted in meta.dead_dropped.
local function trim_dead(cap)
  if cap > 0 then
    local over = redis.call('LLEN', K_DEAD) - cap
    if over > 0 then
      redis.call('LTRIM', K_DEAD, over, -1)
      redis.call('HINCRBY', K_META, 'dead_dropped', over)
    end
  end
end

-- Moves item `x` (not under a lease any more) to the dead letters with
-- `reason` and its history, and forgets everything else about it: it is not
-- queued, delayed, failing or stalled any more.
local function bury(x, reason, now, cap, token)
  local stalls = tonumber(redis.call('HGET', K_STALLS, x)) or 0
  local failures = tonumber(redis.call('HGET', K_FAIL, x)) or 0
  -- With flow control, the letter keeps the item's group for a requeue.
  local group = nil
  if flow_on() then
    group = flow_letter(x)
  end
  redis.call('SREM', K_DIRTY, x)
  redis.call('ZREM', K_DELAY, x)
  redis.call('HDEL', K_FAIL, x)
  redis.call('HDEL', K_STALLS, x)
  redis.call('HDEL', K_PRIO, x)
  redis.call('HDEL', K_LPRIO, x)
  -- The letter keeps the links of the adds that queued the item, so that a
  -- requeue restores them.
  local links, dropped = bury_links(x)
  if dropped == 0 then
    dropped = nil
  end
  redis.call('RPUSH', K_DEAD, cjson.encode({
    item = x,
    error = string.sub(reason, 1, 1000),
    at_ms = math.floor(now / 1000),
    stalls = stalls,
    failures = failures,
    token = int(token),
    group = group,
    links = links,
    links_dropped = dropped,
  }))
  trim_dead(cap)
end

-- Ends leases whose deadline passed: their holders are presumed dead. The item
-- goes back to the head of its priority's ready list (it was the oldest
-- work), once. An item whose leases expired `max_stalls` times in a row (0: no
-- limit) is taken to be what kills its workers and goes to the dead letters
-- instead.
local function reclaim(now, max_stalls, cap)
  local expired = redis.call('ZRANGEBYSCORE', K_PROC, '-inf', now, 'LIMIT', 0, BATCH)
  for i = #expired, 1, -1 do
    local x = expired[i]
    local token = tonumber(redis.call('HGET', K_LEASE, x)) or 0
    redis.call('ZREM', K_PROC, x)
    redis.call('HDEL', K_LEASE, x)
    redis.call('HDEL', K_SINCE, x)
    redis.call('ZREM', K_DELAY, x)
    local stalls = redis.call('HINCRBY', K_STALLS, x, 1)
    if max_stalls > 0 and stalls >= max_stalls then
      if flow_on() then
        flow_lease_ended(x)
      end
      bury(x, 'its lease expired ' .. stalls .. ' times in a row (the worker died or stalled each time)', now, cap, token)
    else
      requeue_head(x)
      if flow_on() then
        -- Its slot is free once it is queued again (see flow_lease_ended).
        flow_lease_ended(x)
      end
    end
  end
  if #expired > 0 and flow_on() then
    flow_freed(#expired)
  end
  return #expired
end

-- Promotion and reclaim, as every reader of the ready list runs them first.
-- While the queue is shut down for every process, delayed items wait (they are
-- kept, and promoted once it resumes).
local function refresh(now, max_stalls, cap)
  local moved = reclaim(now, max_stalls, cap)
  if redis.call('EXISTS', K_SHUT) == 0 then
    moved = moved + promote(now)
  end
  if moved > 0 then
    wake()
  end
end
