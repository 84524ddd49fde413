-- add_many(item, delay, priority, group, ..., [traceparent]): `add_after` of
-- each item in turn, in one call (the adds apply in order, each by the rules
-- of one add). Delays are in microseconds (0: add now); a priority of '' means
-- none given; the group is the item's, for a queue with flow control (''
-- otherwise). A last argument after the groups of four is the traceparent of
-- the span the batch was added in, the trace link of every add (absent: none).
-- Returns {{outcome, seq}, ...}, one per add.
--
-- A batch of adds now without priorities (the common batch) takes the calls of
-- add_now() over the whole batch: one read each of which items are being
-- processed, queued and given a priority before, then one write per structure.
-- With flow control, each item joins its group: the adds go one by one.
local now = now_us()
local n = (#ARGV - #ARGV % 4) / 4
local tp = nil
if #ARGV % 4 == 1 then
  tp = traceparent_arg(ARGV[#ARGV])
end
local replies = {}
if redis.call('EXISTS', K_SHUT) == 1 then
  for i = 1, n do
    replies[i] = {IGNORED, 0}
  end
  return replies
end
promote_due(now)
-- One sequence number per add, read and written back once (see next_seq()).
local seq = next_seq(now)

-- Whether every add is an add now without a priority, on a queue without flow
-- control.
local plain = n > 1 and not flow_on()
for i = 1, n do
  if tonumber(ARGV[4 * i - 2]) > 0 or priority_arg(ARGV[4 * i - 1]) ~= nil then
    plain = false
    break
  end
end

-- add_now(x, nil) of each item, batched: what each item is decides its outcome
-- as add_now() would, an item named again in the batch being dirty by then.
local function add_all_now()
  local xs = {}
  for i = 1, n do
    xs[i] = ARGV[4 * i - 3]
  end
  -- Every add is accepted (the queue is not shut down): each keeps the link.
  record_links(xs, tp)
  local busy = redis.call('ZMSCORE', K_PROC, unpack(xs))
  local dirty = redis.call('SMISMEMBER', K_DIRTY, unpack(xs))
  local given = redis.call('HMGET', K_PRIO, unpack(xs))
  local now_dirty, moot, queued, lanes = {}, {}, {}, {}
  local counted = 0
  for i = 1, n do
    local x = xs[i]
    local outcome
    if busy[i] then
      -- Re-added while processing: a pending delayed add is moot now.
      moot[#moot + 1] = x
      if dirty[i] == 1 or now_dirty[x] then
        outcome = DUPLICATE
      else
        outcome = DEFERRED
        now_dirty[x] = true
        counted = counted + 1
      end
    elseif dirty[i] == 1 or now_dirty[x] then
      outcome = DUPLICATE
    else
      -- New, or waiting for a delay: ready now, and the delayed add goes.
      outcome = QUEUED
      now_dirty[x] = true
      counted = counted + 1
      moot[#moot + 1] = x
      local p = tonumber(given[i]) or 0
      if p == 0 then
        queued[#queued + 1] = x
      else
        lanes[#lanes + 1] = x
      end
    end
    replies[i] = {outcome, seq + i - 1}
  end
  if counted == 0 then
    return
  end
  local added = {}
  for x in pairs(now_dirty) do
    added[#added + 1] = x
  end
  redis.call('SADD', K_DIRTY, unpack(added))
  redis.call('HINCRBY', K_META, 'adds', counted)
  if #moot > 0 then
    redis.call('ZREM', K_DELAY, unpack(moot))
  end
  if #queued > 0 then
    redis.call('RPUSH', K_READY, unpack(queued))
  end
  for _, x in ipairs(lanes) do
    enqueue(x, false)
  end
  if #queued + #lanes > 0 then
    wake()
  end
end

if plain then
  add_all_now()
  redis.call('SET', K_SEQ, int(seq + n - 1))
  return replies
end
for i = 1, n do
  local x, delay = ARGV[4 * i - 3], tonumber(ARGV[4 * i - 2])
  local p, g = priority_arg(ARGV[4 * i - 1]), ARGV[4 * i]
  local outcome
  if delay <= 0 then
    outcome = add_now(x, p, g, tp)
  else
    outcome = add_at(x, now + delay, p, g, tp)
  end
  replies[i] = {outcome, seq + i - 1}
end
if n > 1 then
  redis.call('SET', K_SEQ, int(seq + n - 1))
end
return replies
