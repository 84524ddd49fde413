-- page(state, from, cursor, limit, needle, budget): one page of the items in
-- one state, for operators. Changes nothing.
-- ARGV[1] = state: ready | delayed | in_flight | failing | dead
-- ARGV[2] = from: first | last (ready: next out | last in; delayed: soonest due
--           | latest; in_flight: soonest deadline | latest; dead: oldest |
--           newest; failing: hash order, `from` ignored)
-- ARGV[3] = cursor: how many entries to skip from that end ('' or 0: none);
--           for failing, an HSCAN cursor
-- ARGV[4] = limit: at most this many entries
-- ARGV[5] = needle: only entries whose item (or a dead letter's error)
--           contains it, compared in lower case ('' = every entry)
-- ARGV[6] = budget: at most this many entries are looked at per call, so a
--           search of a long list never blocks the server for long
-- Returns {now, total, next cursor ('' at the end), entries}; each entry is
-- {item, a, b, c}: ready {item, priority}, delayed {item, due}, in_flight
-- {item, deadline, since, token}, failing {item, count}, dead {entry}.
local now = now_us()
local state, from = ARGV[1], ARGV[2]
local limit = math.max(1, tonumber(ARGV[4]) or 50)
local needle = ARGV[5] or ''
local budget = math.max(limit, tonumber(ARGV[6]) or 10000)
local CHUNK = 500

local function matches(text)
  return needle == '' or string.find(string.lower(text), needle, 1, true) ~= nil
end

local out = {}

if state == 'failing' then
  local cursor = ARGV[3]
  if cursor == '' then
    cursor = '0'
  end
  local looked, found = 0, 0
  repeat
    local r = redis.call('HSCAN', K_FAIL, cursor, 'COUNT', 100)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      looked = looked + 1
      if matches(r[2][i]) then
        -- HSCAN hands out whole buckets: a page may hold a few more than `limit`.
        table.insert(out, {r[2][i], r[2][i + 1]})
        found = found + 1
      end
    end
  until cursor == '0' or found >= limit or looked >= budget
  if cursor == '0' then
    cursor = ''
  end
  return {int(now), redis.call('HLEN', K_FAIL), cursor, out}
end

-- The lanes of the ready lists in hand-out order: positive priorities highest
-- first, then priority 0, then negative ones highest first (see pop_ready).
local function ready_lanes()
  local lanes, neg = {}, {}
  for _, p in ipairs(redis.call('ZRANGE', K_LANES, 0, -1, 'REV')) do
    local n = tonumber(p)
    if n > 0 then
      table.insert(lanes, n)
    else
      table.insert(neg, n)
    end
  end
  table.insert(lanes, 0)
  for _, n in ipairs(neg) do
    table.insert(lanes, n)
  end
  return lanes
end

-- A list's entries at positions i .. i + n - 1 counted from `from`'s end.
local function list_slice(key, i, n)
  if from == 'last' then
    local r = redis.call('LRANGE', key, -(i + n), -(i + 1))
    local rev = {}
    for k = #r, 1, -1 do
      table.insert(rev, r[k])
    end
    return rev
  end
  return redis.call('LRANGE', key, i, i + n - 1)
end

-- The entries at positions i .. i + n - 1 (from `from`'s end) and the total.
local slice, total
if state == 'ready' then
  local lanes = ready_lanes()
  if from == 'last' then
    local rev = {}
    for k = #lanes, 1, -1 do
      table.insert(rev, lanes[k])
    end
    lanes = rev
  end
  local lens = {}
  total = 0
  for k, p in ipairs(lanes) do
    lens[k] = redis.call('LLEN', lane(p))
    total = total + lens[k]
  end
  slice = function(i, n)
    local got, base = {}, 0
    for k, p in ipairs(lanes) do
      local len = lens[k]
      if i < base + len and #got < n then
        local start = math.max(0, i - base)
        for _, x in ipairs(list_slice(lane(p), start, math.min(n - #got, len - start))) do
          table.insert(got, {x, int(p)})
        end
        i = base + len
      end
      base = base + len
    end
    return got
  end
elseif state == 'dead' then
  total = redis.call('LLEN', K_DEAD)
  slice = function(i, n)
    local got = {}
    for _, e in ipairs(list_slice(K_DEAD, i, n)) do
      table.insert(got, {e})
    end
    return got
  end
elseif state == 'delayed' or state == 'in_flight' then
  local key = state == 'delayed' and K_DELAY or K_PROC
  total = redis.call('ZCARD', key)
  slice = function(i, n)
    local r
    if from == 'last' then
      r = redis.call('ZRANGE', key, i, i + n - 1, 'REV', 'WITHSCORES')
    else
      r = redis.call('ZRANGE', key, i, i + n - 1, 'WITHSCORES')
    end
    local got = {}
    for k = 1, #r, 2 do
      if state == 'delayed' then
        table.insert(got, {r[k], r[k + 1]})
      else
        local x = r[k]
        table.insert(got, {x, r[k + 1], redis.call('HGET', K_SINCE, x) or '0',
          redis.call('HGET', K_LEASE, x) or '0'})
      end
    end
    return got
  end
else
  return redis.error_reply('ERR unknown item state ' .. tostring(state))
end

local pos = math.max(0, tonumber(ARGV[3]) or 0)
local looked = 0
while #out < limit and looked < budget and pos < total do
  local want = needle == '' and (limit - #out) or CHUNK
  local got = slice(pos, math.min(want, budget - looked))
  if #got == 0 then
    break
  end
  for _, e in ipairs(got) do
    pos = pos + 1
    looked = looked + 1
    -- A dead letter is matched on its stored entry: the item (as escaped JSON)
    -- and the error.
    if matches(e[1]) then
      table.insert(out, e)
      if #out >= limit then
        break
      end
    end
  end
end
local next_cursor = ''
if pos < total then
  next_cursor = int(pos)
end
return {int(now), total, next_cursor, out}
