-- figures(now): a queue's figures, as a listing of many queues (summary) and
-- one queue's stats show them, so that the two agree on every count. Changes
-- nothing; bounded work whatever the queue's size (the sums read at most
-- 1,000 leases and 1,000 failure counts).
-- Returns {ready, delayed, processing, dirty, failing, stalled, dead, shut,
--          paused, dead_dropped, adds, done, failures, oldest lease start or
--          '', sum of the leases' ages, leases summed, sum of failure counts,
--          how many of the queue's keys exist (its flow control settings
--          among them)}.
local function figures(now)
  local meta = redis.call('HMGET', K_META, 'paused', 'dead_dropped', 'adds', 'done', 'failures')
  local nproc = redis.call('ZCARD', K_PROC)
  local oldest, age_sum, summed = '', 0, 0
  local starts
  if nproc <= 1000 then
    starts = redis.call('HVALS', K_SINCE)
  else
    starts = {}
    for _, x in ipairs(redis.call('ZRANGE', K_PROC, 0, 999)) do
      table.insert(starts, redis.call('HGET', K_SINCE, x) or now)
    end
  end
  local min
  for _, s in ipairs(starts) do
    local t = tonumber(s)
    if t then
      age_sum = age_sum + math.max(0, now - t)
      summed = summed + 1
      if not min or t < min then
        min = t
      end
    end
  end
  if min then
    oldest = int(min)
  end
  local fail_sum = 0
  local nfail = redis.call('HLEN', K_FAIL)
  if nfail <= 1000 then
    for _, n in ipairs(redis.call('HVALS', K_FAIL)) do
      fail_sum = fail_sum + (tonumber(n) or 0)
    end
  else
    local r = redis.call('HSCAN', K_FAIL, '0', 'COUNT', 1000)
    for i = 2, #r[2], 2 do
      fail_sum = fail_sum + (tonumber(r[2][i]) or 0)
    end
  end
  return {
    ready_count(),
    redis.call('ZCARD', K_DELAY),
    nproc,
    redis.call('SCARD', K_DIRTY),
    nfail,
    redis.call('HLEN', K_STALLS),
    redis.call('LLEN', K_DEAD),
    redis.call('EXISTS', K_SHUT),
    meta[1] and 1 or 0,
    tonumber(meta[2]) or 0,
    tonumber(meta[3]) or 0,
    tonumber(meta[4]) or 0,
    tonumber(meta[5]) or 0,
    oldest,
    int(age_sum),
    summed,
    fail_sum,
    redis.call('EXISTS', K_FLOW, unpack(KEYS)),
  }
end
