-- resume(): ends a shut down for every process: adds count again and delayed
-- items are promoted when due. Returns 1 if the queue was shut down.
local was = redis.call('DEL', K_SHUT)
wake()
return was
