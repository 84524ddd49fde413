-- remove(item): an operator takes an item out of the queue. A queued item
-- leaves its ready list, a delayed one its delay; an item being processed
-- keeps its lease (its holder may still finish it), but a re-add pending for
-- when that lease ends, and any delayed add, are dropped. An item no longer
-- under a lease also loses its failure and stall counts. Dead letters are
-- not touched (see dead_delete). The trace links of the pending adds go with
-- them; a lease keeps its own.
-- ARGV[1] = item.
-- Returns {queued, delayed, readd, counts, leased}: 1 for each part that was
-- removed, and 1 in `leased` when the item is under a lease (which stays).
local x = ARGV[1]
local processing = is_processing(x)
local queued, readd = 0, 0
if redis.call('SREM', K_DIRTY, x) == 1 then
  if processing then
    readd = 1
  else
    local p = prio_of(x)
    if flow_on() then
      queued = flow_unqueue(x, p)
    else
      queued = redis.call('LREM', lane(p), 1, x)
      drop_lane_if_empty(p)
    end
  end
end
local delayed = redis.call('ZREM', K_DELAY, x)
redis.call('HDEL', K_PRIO, x)
forget_pending_links(x)
local counts = 0
if not processing then
  counts = redis.call('HDEL', K_FAIL, x) + redis.call('HDEL', K_STALLS, x)
  if counts > 0 then
    counts = 1
  end
  if flow_on() then
    -- No longer held: its group is forgotten.
    flow_drop(x)
  end
end
return {queued, delayed, readd, counts, processing and 1 or 0}
