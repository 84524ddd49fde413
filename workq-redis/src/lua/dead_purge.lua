-- dead_purge(): deletes every dead letter. Returns how many there were.
local n = redis.call('LLEN', K_DEAD)
redis.call('UNLINK', K_DEAD)
return n
