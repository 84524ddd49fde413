-- Adds the trace links `found` (lease_links: {field, drops}, or nil) to the
-- reply of a hand-out.
local function with_links(reply, found)
  if found then
    reply[5] = reply[5] or false
    reply[6] = found[1]
    reply[7] = found[2]
  end
end

-- take(now, lease, max_stalls, cap): hands out the next ready item under a
-- new lease of `lease` microseconds, after promotion and reclaim (max stalls
-- 0: no limit; dead-letter cap 0: none). Shared by `get` and `done_get`.
-- Returns {1, item, token, priority} for an item ({1, item, token, priority,
-- gen} with flow control: gen is the settings' generation; {1, item, token,
-- priority, gen or false, links, drops} when the item's pending adds left
-- trace links, which its lease takes: see lease_links), {2} when the queue
-- is shut down and has nothing ready, or {0, wait} when nothing is handed out:
-- `wait` is the time in us until the next delayed item, lease deadline or
-- (flow control) hand-out token is due, or -1 if none is. With flow control,
-- items may be ready and still not be handed out (a limit, a token): that is
-- {0, wait}, also after a shut down, until they are.
local function take(now, lease, max_stalls, cap)
  refresh(now, max_stalls, cap)
  if redis.call('HEXISTS', K_META, 'paused') == 1 then
    -- Paused (pause.rs): hand out nothing; wait for the resume's wake-up.
    if redis.call('EXISTS', K_SHUT) == 1 then wake() return {2} end
    return {0, -1}
  end
  local x, p, wait = pop_ready(now)
  if not x then
    if redis.call('EXISTS', K_SHUT) == 1 and (not flow_is_on or flow_ready_count() == 0) then
      -- Pass the news on to the next blocked getter.
      wake()
      return {2}
    end
    wait = wait or -1
    local d = redis.call('ZRANGE', K_DELAY, 0, 0, 'WITHSCORES')
    if d[2] then
      local w = tonumber(d[2]) - now
      if wait < 0 or w < wait then
        wait = w
      end
    end
    local l = redis.call('ZRANGE', K_PROC, 0, 0, 'WITHSCORES')
    if l[2] then
      local w = tonumber(l[2]) - now
      if wait < 0 or w < wait then
        wait = w
      end
    end
    if wait == 0 then
      wait = 1
    end
    return {0, wait}
  end
  redis.call('SREM', K_DIRTY, x)
  -- Re-adds while processing give the next priority afresh.
  redis.call('HDEL', K_PRIO, x)
  if p ~= 0 then
    redis.call('HSET', K_LPRIO, x, int(p))
  end
  local token = next_seq(now)
  redis.call('ZADD', K_PROC, now + lease, x)
  redis.call('HSET', K_LEASE, x, int(token))
  redis.call('HSET', K_SINCE, x, int(now))
  local reply = {1, x, token, p}
  if flow_is_on then
    if flow_more() then
      -- Another hand-out may go: wake the next blocked getter.
      wake()
    end
    reply[5] = flow_gen()
  elseif any_ready() then
    -- More work: wake the next blocked getter (a chain, not a herd).
    wake()
  end
  with_links(reply, lease_links({x})[1])
  return reply
end

-- take_many(now, lease, max_stalls, cap, max): take() up to `max` times, stopping at the
-- first that finds nothing; returns the replies of the items handed out. While no priority
-- is in use and the queue is not paused, the items come from one LPOP of up to `max` and
-- their leases are written with one call per structure; the tokens are the ones take()
-- would have handed out one after the other.
local function take_many(now, lease, max_stalls, cap, max)
  local taken = {}
  if max <= 0 then
    return taken
  end
  refresh(now, max_stalls, cap)
  -- No priority in use, no flow control (one check for both, which also tells
  -- whether the queue holds trace links), not paused.
  local plain = exists_and_links(K_LANES, K_FLOW) == 0
  if plain then
    flow_is_on = false
  end
  if plain and redis.call('HEXISTS', K_META, 'paused') == 0 then
    local xs = redis.call('LPOP', K_READY, max)
    if xs then
      redis.call('SREM', K_DIRTY, unpack(xs))
      -- Re-adds while processing give the next priority afresh.
      redis.call('HDEL', K_PRIO, unpack(xs))
      -- next_seq() once per item: the larger of the counter plus one and the clock.
      local base = tonumber(redis.call('GET', K_SEQ)) or 0
      if base < now - 1 then
        base = now - 1
      end
      local deadlines, holders, since = {}, {}, {}
      for i, x in ipairs(xs) do
        local token = base + i
        deadlines[#deadlines + 1] = now + lease
        deadlines[#deadlines + 1] = x
        holders[#holders + 1] = x
        holders[#holders + 1] = int(token)
        since[#since + 1] = x
        since[#since + 1] = int(now)
        taken[i] = {1, x, token, 0}
      end
      redis.call('SET', K_SEQ, int(base + #xs))
      redis.call('ZADD', K_PROC, unpack(deadlines))
      redis.call('HSET', K_LEASE, unpack(holders))
      redis.call('HSET', K_SINCE, unpack(since))
      local found = lease_links(xs)
      for i = 1, #xs do
        with_links(taken[i], found[i])
      end
      if any_ready() then
        -- More work: wake the next blocked getter (a chain, not a herd).
        wake()
      end
      return taken
    end
  end
  while #taken < max do
    local reply = take(now, lease, max_stalls, cap)
    if reply[1] ~= 1 then
      break
    end
    taken[#taken + 1] = reply
  end
  return taken
end
