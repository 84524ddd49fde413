-- dead_letter(item, token, error): the holder could not read the item; move it
-- to the dead-letter list with the error instead of handing it out forever.
-- ARGV[1] = item, ARGV[2] = token, ARGV[3] = error message.
-- Returns 1 when moved, 0 when the lease is not this holder's.
local x = ARGV[1]
if redis.call('HGET', K_LEASE, x) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', K_PROC, x)
redis.call('HDEL', K_LEASE, x)
redis.call('HDEL', K_SINCE, x)
redis.call('SREM', K_DIRTY, x)
redis.call('ZREM', K_DELAY, x)
redis.call('HDEL', K_FAIL, x)
redis.call('HDEL', K_STALLS, x)
local now = now_us()
redis.call('RPUSH', K_DEAD, cjson.encode({item = x, error = ARGV[3], at_ms = math.floor(now / 1000)}))
return 1
