-- release(item, token): the holder lets go of the item without finishing it
-- (its lease was dropped). The item is queued again at the head of its
-- priority at once, as a reclaim would do it but without counting a stall; a
-- re-add while processing folds into this one hand-out (and may raise it).
-- ARGV[1] = item, ARGV[2] = token.
-- Returns 1 when released, 0 when the lease is not this holder's.
local x = ARGV[1]
if not holds(redis.call('HGET', K_LEASE, x), ARGV[2]) then
  return 0
end
redis.call('ZREM', K_PROC, x)
redis.call('HDEL', K_LEASE, x)
redis.call('HDEL', K_SINCE, x)
-- Its work is still to do: sooner than any delayed add of it.
redis.call('ZREM', K_DELAY, x)
requeue_head(x)
if flow_on() then
  flow_lease_ended(x)
  flow_freed(1)
end
wake()
return 1
