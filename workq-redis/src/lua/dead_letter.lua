-- dead_letter(item, token, error): the holder could not read the item; move it
-- to the dead-letter list with the error instead of handing it out forever.
-- ARGV[1] = item, ARGV[2] = token, ARGV[3] = error message, ARGV[4] = cap.
-- Returns 1 when moved, 0 when the lease is not this holder's.
local x = ARGV[1]
if redis.call('HGET', K_LEASE, x) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', K_PROC, x)
redis.call('HDEL', K_LEASE, x)
redis.call('HDEL', K_SINCE, x)
if flow_on() then
  flow_lease_ended(x)
  flow_freed(1)
end
bury(x, ARGV[3], now_us(), tonumber(ARGV[4]) or 0, tonumber(ARGV[2]) or 0)
return 1
