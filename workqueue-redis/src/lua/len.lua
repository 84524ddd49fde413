-- len(): client-go's Len, after promoting due items and reclaiming expired
-- leases. ARGV[1] = max stalls (0: no limit). Returns {ready, delayed, processing}.
refresh(now_us(), tonumber(ARGV[1]))
return {redis.call('LLEN', K_READY), redis.call('ZCARD', K_DELAY), redis.call('ZCARD', K_PROC)}
