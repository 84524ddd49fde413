-- stats(limit): a consistent snapshot for operators. Changes nothing.
-- ARGV[1] = how many in-flight items and failure counts to list.
-- Returns {now, ready, delayed, processing, dirty, failures, stalls, dead, shut,
--          in_flight = {item, since, deadline, token, ...},
--          failing = {item, count, ...}, next_delayed, dead_dropped}.
local now = now_us()
local limit = tonumber(ARGV[1])
local inflight = {}
local proc = redis.call('ZRANGE', K_PROC, 0, limit - 1, 'WITHSCORES')
for i = 1, #proc, 2 do
  local x = proc[i]
  table.insert(inflight, x)
  table.insert(inflight, redis.call('HGET', K_SINCE, x) or '0')
  table.insert(inflight, proc[i + 1])
  table.insert(inflight, redis.call('HGET', K_LEASE, x) or '0')
end
local failing = {}
local cursor, n = '0', 0
repeat
  local r = redis.call('HSCAN', K_FAIL, cursor, 'COUNT', 100)
  cursor = r[1]
  for i = 1, #r[2], 2 do
    if n < limit then
      table.insert(failing, r[2][i])
      table.insert(failing, r[2][i + 1])
      n = n + 1
    end
  end
until cursor == '0' or n >= limit
local next_delayed = '-1'
local d = redis.call('ZRANGE', K_DELAY, 0, 0, 'WITHSCORES')
if d[2] then
  next_delayed = d[2]
end
return {
  int(now),
  ready_count(),
  redis.call('ZCARD', K_DELAY),
  redis.call('ZCARD', K_PROC),
  redis.call('SCARD', K_DIRTY),
  redis.call('HLEN', K_FAIL),
  redis.call('HLEN', K_STALLS),
  redis.call('LLEN', K_DEAD),
  redis.call('EXISTS', K_SHUT),
  inflight,
  failing,
  next_delayed,
  tonumber(redis.call('HGET', K_META, 'dead_dropped')) or 0,
}
