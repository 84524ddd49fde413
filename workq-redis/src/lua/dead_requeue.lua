-- dead_requeue(entry, max): moves dead letters back to the queue as fresh
-- items (no failures, no stalls), with the trace links the letter kept (in
-- front of those of adds made since; links that are not traceparents are
-- not restored). ARGV[1] = the exact entry to requeue, or ''
-- for the oldest ones; ARGV[2] = how many at most (for '').
-- Returns how many were requeued, or -1 while the queue is shut down for every
-- process: adds are ignored then, so nothing is requeued (the letters stay).
if redis.call('EXISTS', K_SHUT) == 1 then
  return -1
end
local function requeue(entry)
  local ok, letter = pcall(cjson.decode, entry)
  if not ok or type(letter) ~= 'table' or type(letter.item) ~= 'string' then
    return 0
  end
  local x = letter.item
  redis.call('HDEL', K_FAIL, x)
  redis.call('HDEL', K_STALLS, x)
  -- With flow control, the letter keeps the item's group.
  local group = nil
  if type(letter.group) == 'string' then
    group = letter.group
  end
  add_now(x, nil, group)
  local kept = {}
  if type(letter.links) == 'table' then
    for _, tp in ipairs(letter.links) do
      if type(tp) == 'string' and traceparent_arg(tp) then
        kept[#kept + 1] = tp
      end
    end
  end
  local dropped = math.max(0, math.floor(tonumber(letter.links_dropped) or 0))
  if #kept > 0 then
    links_in_front(x, kept, dropped)
  end
  return 1
end
if ARGV[1] ~= '' then
  if redis.call('LREM', K_DEAD, 1, ARGV[1]) == 0 then
    return 0
  end
  return requeue(ARGV[1])
end
local n = 0
for _ = 1, tonumber(ARGV[2]) do
  local entry = redis.call('LPOP', K_DEAD)
  if not entry then
    break
  end
  n = n + requeue(entry)
end
return n
