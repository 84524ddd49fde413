-- renew(item, token, lease): extends the holder's lease from now.
-- ARGV[1] = item, ARGV[2] = token, ARGV[3] = lease duration in microseconds.
-- Returns 1 if renewed, 0 if the lease is no longer this holder's.
local x = ARGV[1]
if not holds(redis.call('HGET', K_LEASE, x), ARGV[2]) then
  return 0
end
-- GT: a late renewal never shortens a lease.
redis.call('ZADD', K_PROC, 'XX', 'GT', now_us() + tonumber(ARGV[3]), x)
return 1
