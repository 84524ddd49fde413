-- finish(item, token, flags): client-go's Done, fenced by the lease's token
-- (`flags`: test mutations, see mutated()). Shared by `done` and `done_get`.
-- Returns 1 when done, 2 when done and queued again (it was re-added while
-- processing), 0 when another holder has the item now, -1 when nobody does.
-- A stale holder changes nothing.
local function finish(x, token, flags)
  local holder = redis.call('HGET', K_LEASE, x)
  if not holds(holder, token, flags) then
    if holder then
      return 0
    end
    return -1
  end
  redis.call('ZREM', K_PROC, x)
  redis.call('HDEL', K_LEASE, x)
  redis.call('HDEL', K_SINCE, x)
  redis.call('HDEL', K_LPRIO, x)
  redis.call('HINCRBY', K_META, 'done', 1)
  -- Processed to the end: whatever stalled it before is not fatal.
  redis.call('HDEL', K_STALLS, x)
  if redis.call('SISMEMBER', K_DIRTY, x) == 1 then
    if mutated(flags, NO_DIRTY_REQUEUE) then
      -- Test mutation only: the re-add while processing is lost.
      redis.call('SREM', K_DIRTY, x)
      redis.call('HDEL', K_PRIO, x)
      return 1
    end
    -- At the tail of the highest priority its re-adds gave (0 if none did),
    -- behind the delayed items that came due before.
    promote_due(now_us())
    enqueue(x, false)
    wake()
    return 2
  end
  return 1
end
