-- len(): client-go's Len, after promoting due items and reclaiming expired
-- leases. Returns {ready, delayed, processing}.
refresh(now_us())
return {redis.call('LLEN', K_READY), redis.call('ZCARD', K_DELAY), redis.call('ZCARD', K_PROC)}
