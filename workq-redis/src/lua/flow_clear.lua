-- flow_clear(): takes flow control off the queue, for every process: the
-- ready items go back to the ready lists of their priorities in the order
-- they became ready (each group's own order kept), and every flow control
-- key is deleted. The queue is then as one built without flow control; a
-- handle built with flow settings afterwards sets them again. O(items log
-- items), once. Returns 1 if the queue had flow control, else 0.
--
-- The groups' lists at one priority are merged by the time each item became
-- ready (`frt`). A group's list is not always in that order (an item handed
-- back goes to its head, with the time it came back), so each item is merged
-- by the earliest time among it and the items behind it in its list: the
-- list's order stays, and a group's items go where its oldest one belongs.
if not flow_on() then
  return 0
end
-- Per priority, the lists of the groups with ready items there.
local lists = {}
for _, g in ipairs(redis.call('ZRANGE', K_FREADY, 0, -1)) do
  local h = redis.call('HGETALL', fgroup(g))
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'q:' then
      local p = tonumber(string.sub(h[i], 3))
      lists[p] = lists[p] or {}
      table.insert(lists[p], flane(p, g))
    end
  end
end
for p, keys in pairs(lists) do
  local entries = {}
  for li, key in ipairs(keys) do
    local xs = redis.call('LRANGE', key, 0, -1)
    local times = {}
    for from = 1, #xs, 1000 do
      local part = redis.call('HMGET', K_FRT, unpack(xs, from, math.min(from + 999, #xs)))
      for _, t in ipairs(part) do
        times[#times + 1] = tonumber(t) or 0
      end
    end
    local earliest = math.huge
    for i = #xs, 1, -1 do
      earliest = math.min(earliest, times[i])
      entries[#entries + 1] = {earliest, li, i, xs[i]}
    end
    redis.call('DEL', key)
  end
  table.sort(entries, function(a, b)
    if a[1] ~= b[1] then
      return a[1] < b[1]
    end
    if a[2] ~= b[2] then
      return a[2] < b[2]
    end
    return a[3] < b[3]
  end)
  for from = 1, #entries, 1000 do
    local xs = {}
    for i = from, math.min(from + 999, #entries) do
      xs[#xs + 1] = entries[i][4]
    end
    redis.call('RPUSH', lane(p), unpack(xs))
  end
  if p ~= 0 and #entries > 0 then
    redis.call('ZADD', K_LANES, p, int(p))
  end
end
flow_delete_all()
wake()
return 1
