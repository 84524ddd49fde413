-- done_get(item, token, lease): `done` of the holder's item, then `get`, in
-- one call: a worker's loop finishes an item and takes the next in one round
-- trip and one script run.
-- ARGV[1] = item, ARGV[2] = token, ARGV[3] = test mutations (as for done),
-- ARGV[4] = lease duration (us), ARGV[5] = max stalls, ARGV[6] = dead-letter
-- cap (as for get).
-- Returns {done's reply, get's reply}.
local finished = finish(ARGV[1], ARGV[2], ARGV[3])
return {finished, take(now_us(), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]) or 0)}
