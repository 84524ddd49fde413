-- flow_set(json, field, value, ...): gives the queue the flow control
-- settings of a handle built with some (see flow.lua for the fields), for
-- every process: the last handle built wins. `json` is the settings as
-- workq::flow::FlowLimits in JSON, which is compared with the queue's: the
-- same settings change nothing.
--
-- New settings replace the old ones whole and take a new generation (a
-- sequence number). The groups are brought in line with them: every group
-- with ready items or leases out is at its limit or not by the new limits,
-- and takes its turns again if it may; parked groups wait for their token at
-- their next turn; groups kept only for a refilling bucket are forgotten.
-- O(groups with work), once per change.
--
-- A queue that had no flow control gets it here: the items it holds join the
-- group '' (the ready ones in their order, at their priorities; the leased
-- ones count as its leases out), since no group function ran at their adds.
-- O(items), once.
--
-- Returns {changed (1 or 0), generation, the previous JSON ('' for none)}.
local now = now_us()
local old = redis.call('HGET', K_FLOW, 'json')
local gen = redis.call('HGET', K_FLOW, 'gen') or '0'
if old == ARGV[1] then
  return {0, gen, old}
end
if old then
  local h = redis.call('HGETALL', K_FLOW)
  local fields = {}
  for i = 1, #h, 2 do
    fields[#fields + 1] = h[i]
  end
  redis.call('HDEL', K_FLOW, unpack(fields))
end
gen = int(next_seq(now))
local pairs_ = {'json', ARGV[1], 'gen', gen}
for i = 2, #ARGV do
  pairs_[#pairs_ + 1] = ARGV[i]
end
redis.call('HSET', K_FLOW, unpack(pairs_))
flow_is_on = true

if not old then
  -- The items the queue holds join the group ''.
  local G = fgroup('')
  local prios = {}
  for _, p in ipairs(redis.call('ZRANGE', K_LANES, 0, -1, 'REV')) do
    prios[#prios + 1] = tonumber(p)
  end
  prios[#prios + 1] = 0
  local total = 0
  for _, p in ipairs(prios) do
    local moved = 0
    while true do
      local xs = redis.call('LPOP', lane(p), 1000)
      if not xs then
        break
      end
      redis.call('RPUSH', flane(p, ''), unpack(xs))
      local groups, times = {}, {}
      for _, x in ipairs(xs) do
        groups[#groups + 1] = x
        groups[#groups + 1] = ''
        times[#times + 1] = x
        times[#times + 1] = int(now)
      end
      redis.call('HSET', K_FGR, unpack(groups))
      redis.call('HSET', K_FRT, unpack(times))
      moved = moved + #xs
    end
    if p ~= 0 then
      redis.call('ZREM', K_LANES, int(p))
    end
    if moved > 0 then
      redis.call('HSET', G, 'q:' .. int(p), 1)
      total = total + moved
    end
  end
  for _, key in ipairs({K_DELAY, K_PROC}) do
    local at = 0
    while true do
      local xs = redis.call('ZRANGE', key, at, at + 999)
      if #xs == 0 then
        break
      end
      local groups = {}
      for _, x in ipairs(xs) do
        groups[#groups + 1] = x
        groups[#groups + 1] = ''
      end
      redis.call('HSET', K_FGR, unpack(groups))
      at = at + #xs
    end
  end
  local leased = redis.call('ZCARD', K_PROC)
  if leased > 0 then
    redis.call('HSET', G, 'f', leased)
  end
  if total > 0 then
    redis.call('HSET', K_FSTATE, 'n', total)
  end
  if total > 0 or leased > 0 then
    redis.call('ZADD', K_FREADY, total, '')
  end
end

-- Parked groups wait for their token at their next turn instead.
for _, g in ipairs(redis.call('ZRANGE', K_FPARK, 0, -1)) do
  redis.call('HDEL', fgroup(g), 'k')
  redis.call('ZREM', K_FPARK, g)
end
-- Groups kept for a bucket only: forgotten (their rate may be another now).
for _, g in ipairs(redis.call('ZRANGE', K_FIDLE, 0, -1)) do
  redis.call('ZREM', K_FIDLE, g)
  local G = fgroup(g)
  local h = redis.call('HGETALL', G)
  local fields = {}
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) ~= 'r:' then
      fields[#fields + 1] = h[i]
    end
  end
  if #fields > 0 then
    redis.call('HDEL', G, unpack(fields))
  end
end
-- The groups with work, by the new limits.
for _, g in ipairs(redis.call('ZRANGE', K_FREADY, 0, -1)) do
  local G = fgroup(g)
  if saturated(gset(g), tonumber(redis.call('HGET', G, 'f')) or 0) then
    redis.call('SADD', K_FSAT, g)
  else
    redis.call('SREM', K_FSAT, g)
    rejoin(g, G)
  end
end
wake()
return {1, gen, old or ''}
