-- done_get(flags, lease, max_stalls, cap, max, forget, item, token, ...):
-- `done` of each holder's item in turn (and client-go's Forget of it when
-- `forget` is 1 and the done was accepted: the worker succeeded), then `get`
-- up to `max` times, in one call: a worker's loop finishes its items and
-- takes the next ones in one round trip and one script run. `flags` as for done; `lease`, `max_stalls` and
-- `cap` as for get. The hand-outs stop at the first that finds nothing.
-- Returns {{done's reply, ...}, {get's reply for each item handed out, ...}}.
local flags = ARGV[1]
local lease, max_stalls = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, max = tonumber(ARGV[4]) or 0, tonumber(ARGV[5])
local forget = ARGV[6] == '1'
local finished = {}
for i = 7, #ARGV - 1, 2 do
  local outcome = finish(ARGV[i], ARGV[i + 1], flags)
  -- Only the holder's done forgets: a stale holder changes nothing, not even
  -- the failure count the item's new holder may be counting on.
  if forget and (outcome == 1 or outcome == 2) then
    redis.call('HDEL', K_FAIL, ARGV[i])
  end
  finished[#finished + 1] = outcome
end
local now = now_us()
local taken = {}
while #taken < max do
  local reply = take(now, lease, max_stalls, cap)
  if reply[1] ~= 1 then
    break
  end
  taken[#taken + 1] = reply
end
return {finished, taken}
