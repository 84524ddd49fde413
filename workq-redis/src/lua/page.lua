-- page(state, from, cursor, limit, needle, budget): one page of the items in
-- one state, for operators. Changes nothing.
-- ARGV[1] = state: ready | delayed | in_flight | failing | dead
-- ARGV[2] = from: first | last (ready: next out | last in; delayed: soonest due
--           | latest; in_flight: soonest deadline | latest; dead: oldest |
--           newest; failing: hash order, `from` ignored)
-- ARGV[3] = cursor: how many entries to skip from that end ('' or 0: none);
--           for failing, an HSCAN cursor, perhaps with ':' and the item to
--           resume after (see below)
-- ARGV[4] = limit: at most this many entries
-- ARGV[5] = needle: only entries whose item (or a dead letter's error)
--           contains it, compared in lower case ('' = every entry)
-- ARGV[6] = budget: at most this many entries are looked at per call, so a
--           search of a long list never blocks the server for long
-- Returns {now, total, next cursor ('' at the end), entries}; each entry is
-- {item, a, b, c}: ready {item, priority}, delayed {item, due, priority}, in_flight
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
  -- The cursor is an HSCAN cursor, and after a ':' the item the last page ended
  -- with when it filled up inside that cursor's reply: the next page reads that
  -- reply again and starts after it (from the reply's start if it is gone).
  -- So a page never holds more than `limit`, although HSCAN hands out whole
  -- buckets (a small hash, all of it at once).
  local cursor, after = ARGV[3], nil
  local colon = string.find(cursor, ':', 1, true)
  if colon then
    after = string.sub(cursor, colon + 1)
    cursor = string.sub(cursor, 1, colon - 1)
  end
  if cursor == '' then
    cursor = '0'
  end
  local looked, next_cursor = 0, ''
  repeat
    local r = redis.call('HSCAN', K_FAIL, cursor, 'COUNT', 100)
    local fields = r[2]
    local start = 1
    if after then
      for i = 1, #fields, 2 do
        if fields[i] == after then
          start = i + 2
          break
        end
      end
      after = nil
    end
    local full = false
    for i = start, #fields, 2 do
      if #out >= limit then
        next_cursor = cursor .. ':' .. out[#out][1]
        full = true
        break
      end
      looked = looked + 1
      if matches(fields[i]) then
        table.insert(out, {fields[i], fields[i + 1]})
      end
    end
    if full then
      break
    end
    cursor = r[1]
    if cursor == '0' then
      next_cursor = ''
      break
    end
    next_cursor = cursor
  until #out >= limit or looked >= budget
  return {int(now), redis.call('HLEN', K_FAIL), next_cursor, out}
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
if state == 'ready' and flow_on() then
  -- With flow control the hand-out order is the groups' turns, which no page
  -- can foresee: the ready items are listed group by group, the groups with
  -- the most ready items first, each group's by priority (highest first) and
  -- then in its own order; from the last end, the exact reverse. A page walks
  -- the groups before it by their counts (`fready`), CHUNK at a time.
  total = flow_ready_count()
  local first = from ~= 'last'
  slice = function(i, n)
    local got, base, offset = {}, 0, 0
    while #got < n do
      local r
      if first then
        r = redis.call('ZRANGE', K_FREADY, offset, offset + CHUNK - 1, 'REV', 'WITHSCORES')
      else
        r = redis.call('ZRANGE', K_FREADY, offset, offset + CHUNK - 1, 'WITHSCORES')
      end
      if #r == 0 then
        break
      end
      for k = 1, #r, 2 do
        local g, len = r[k], tonumber(r[k + 1])
        if len > 0 and i < base + len and #got < n then
          local h = redis.call('HGETALL', fgroup(g))
          local ps = {}
          for f = 1, #h, 2 do
            if string.sub(h[f], 1, 2) == 'q:' then
              table.insert(ps, tonumber(string.sub(h[f], 3)))
            end
          end
          table.sort(ps, function(a, b)
            if first then
              return a > b
            end
            return a < b
          end)
          local at = base
          for _, p in ipairs(ps) do
            local key = flane(p, g)
            local ll = redis.call('LLEN', key)
            if i < at + ll and #got < n then
              local start = math.max(0, i - at)
              for _, x in ipairs(list_slice(key, start, math.min(n - #got, ll - start))) do
                table.insert(got, {x, int(p)})
              end
              i = at + ll
            end
            at = at + ll
          end
        end
        base = base + len
        if #got >= n then
          break
        end
      end
      offset = offset + CHUNK
    end
    return got
  end
elseif state == 'ready' then
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
        table.insert(got, {r[k], r[k + 1], redis.call('HGET', K_PRIO, r[k]) or '0'})
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
