-- dead_purge(): deletes every dead letter. Returns how many there were.
local n = redis.call('LLEN', K_DEAD)
redis.call('DEL', K_DEAD)
return n
