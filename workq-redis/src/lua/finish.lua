-- finish(item, token): client-go's Done, fenced by the lease's token. Shared
-- by `done`, `done_get` and `retry_done`.
-- Returns 1 when done, 2 when done and queued again (it was re-added while
-- processing), 0 when another holder has the item now, -1 when nobody does.
-- A stale holder changes nothing. The lease's trace links go; those of adds
-- while it was processed stay for the next hand-out.
local function finish(x, token)
  local holder = redis.call('HGET', K_LEASE, x)
  if not holds(holder, token) then
    if holder then
      return 0
    end
    return -1
  end
  -- Read first: its EXISTS also tells whether the queue holds trace links.
  local flow = flow_on()
  redis.call('ZREM', K_PROC, x)
  redis.call('HDEL', K_LEASE, x)
  redis.call('HDEL', K_SINCE, x)
  redis.call('HDEL', K_LPRIO, x)
  end_lease_links({x})
  redis.call('HINCRBY', K_META, 'done', 1)
  -- Processed to the end: whatever stalled it before is not fatal.
  redis.call('HDEL', K_STALLS, x)
  if redis.call('SISMEMBER', K_DIRTY, x) == 1 then
    -- At the tail of the highest priority its re-adds gave (0 if none did),
    -- behind the delayed items that came due before.
    promote_due(now_us())
    enqueue(x, false)
    if flow then
      flow_lease_ended(x)
      flow_freed(1)
    end
    wake()
    return 2
  end
  if flow then
    flow_lease_ended(x)
    if not redis.call('ZSCORE', K_DELAY, x) then
      flow_drop(x)
    end
    flow_freed(1)
  end
  return 1
end

-- finish_many(xs, tokens): finish() of each (xs[i], tokens[i]) in turn, with the
-- calls batched over the items: one HMGET of their holders, then one call per structure
-- for all the items held, then the re-queues of those re-added while processing, in order.
-- Returns what finish() would have returned for each. An item named twice goes the slow
-- way, one finish() at a time, so that the second sees what the first did.
local function finish_many(xs, tokens)
  local n = #xs
  local out = {}
  if n == 0 then
    return out
  end
  local seen = {}
  for i = 1, n do
    if seen[xs[i]] then
      for j = 1, n do
        out[j] = finish(xs[j], tokens[j])
      end
      return out
    end
    seen[xs[i]] = true
  end
  local holders = redis.call('HMGET', K_LEASE, unpack(xs))
  local held, at = {}, {}
  for i = 1, n do
    local holder = holders[i]
    if holds(holder, tokens[i]) then
      held[#held + 1] = xs[i]
      at[#at + 1] = i
      out[i] = 1
    elseif holder then
      out[i] = 0
    else
      out[i] = -1
    end
  end
  if #held == 0 then
    return out
  end
  -- Delayed items that are due join first, while every held item still counts as being
  -- processed: a due re-add of one of them marks it dirty, and it is queued again below in
  -- the order of the step, as one done() after another would queue it. (Promoted after the
  -- held items are let go, a due one would jump ahead of a dirty one done before it.)
  promote_due(now_us())
  local flow = flow_on()
  redis.call('ZREM', K_PROC, unpack(held))
  redis.call('HDEL', K_LEASE, unpack(held))
  redis.call('HDEL', K_SINCE, unpack(held))
  redis.call('HDEL', K_LPRIO, unpack(held))
  end_lease_links(held)
  redis.call('HINCRBY', K_META, 'done', #held)
  redis.call('HDEL', K_STALLS, unpack(held))
  local dirty = redis.call('SMISMEMBER', K_DIRTY, unpack(held))
  local delayed = {}
  if flow then
    delayed = redis.call('ZMSCORE', K_DELAY, unpack(held))
  end
  for j = 1, #held do
    if dirty[j] == 1 then
      enqueue(held[j], false)
      wake()
      out[at[j]] = 2
    end
    if flow then
      -- As finish() does it, one lease after the other.
      flow_lease_ended(held[j])
      if dirty[j] ~= 1 and not delayed[j] then
        flow_drop(held[j])
      end
    end
  end
  if flow then
    flow_freed(#held)
  end
  return out
end
