-- len(): client-go's Len, after promoting due items and reclaiming expired
-- leases. ARGV[1] = max stalls (0: no limit), ARGV[2] = dead-letter cap.
-- Returns {ready, delayed, processing}.
refresh(now_us(), tonumber(ARGV[1]), tonumber(ARGV[2]) or 0)
return {ready_count(), redis.call('ZCARD', K_DELAY), redis.call('ZCARD', K_PROC)}
