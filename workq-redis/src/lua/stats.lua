-- stats(limit): a consistent snapshot for operators: the figures a listing
-- shows (figures.lua) with the leases nearest their deadline and some failure
-- counts. Changes nothing.
-- ARGV[1] = how many in-flight items and failure counts to list.
-- Returns {now, figures, in_flight = {item, since, deadline, token, ...},
--          failing = {item, count, ...}, next_delayed}.
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
return {int(now), figures(now), inflight, failing, next_delayed}
