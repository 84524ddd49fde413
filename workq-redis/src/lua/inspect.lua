-- inspect(item, dead_scan): everything the queue knows about one item, for
-- operators. Changes nothing.
-- ARGV[1] = item, ARGV[2] = how many of the newest dead letters to look
-- through for this item.
-- Returns {now, dirty, processing deadline or '', since or '', token or '',
--          delayed due or '', priority given or '', lease priority or '',
--          failures, stalls, lane or '', position or -1, dead entries}.
local x = ARGV[1]
local now = now_us()
local dirty = redis.call('SISMEMBER', K_DIRTY, x)
local deadline = redis.call('ZSCORE', K_PROC, x)
local due = redis.call('ZSCORE', K_DELAY, x)
local lane_of, position = '', -1
if dirty == 1 and not deadline and flow_on() then
  -- Queued in its group: its place in the hand-out order depends on the turns
  -- of every group, which no bounded look tells.
  lane_of = int(prio_of(x))
elseif dirty == 1 and not deadline then
  -- Queued: its place in the hand-out order, counting the lanes before its own
  -- (positive priorities highest first, then 0, then negative ones).
  local p = prio_of(x)
  local before = 0
  for _, q in ipairs(redis.call('ZRANGE', K_LANES, 0, -1, 'REV')) do
    local n = tonumber(q)
    if n > p then
      before = before + redis.call('LLEN', lane(n))
    end
  end
  if p < 0 then
    before = before + redis.call('LLEN', K_READY)
  end
  local at = redis.call('LPOS', lane(p), x, 'MAXLEN', 100000)
  lane_of = int(p)
  if at then
    position = before + at
  end
end
local dead = {}
local scan = tonumber(ARGV[2]) or 0
if scan > 0 then
  for _, e in ipairs(redis.call('LRANGE', K_DEAD, -scan, -1)) do
    local ok, letter = pcall(cjson.decode, e)
    if ok and type(letter) == 'table' and letter.item == x then
      table.insert(dead, e)
    end
  end
end
return {
  int(now),
  dirty,
  deadline or '',
  redis.call('HGET', K_SINCE, x) or '',
  redis.call('HGET', K_LEASE, x) or '',
  due or '',
  redis.call('HGET', K_PRIO, x) or '',
  redis.call('HGET', K_LPRIO, x) or '',
  tonumber(redis.call('HGET', K_FAIL, x)) or 0,
  tonumber(redis.call('HGET', K_STALLS, x)) or 0,
  lane_of,
  position,
  dead,
}
