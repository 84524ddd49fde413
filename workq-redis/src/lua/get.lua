-- get(lease): hands out the next ready item under a new lease (see take()).
-- ARGV[1] = lease duration in microseconds, ARGV[2] = max stalls (0: no limit),
-- ARGV[3] = dead-letter cap (0: none).
return take(now_us(), tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]) or 0)
