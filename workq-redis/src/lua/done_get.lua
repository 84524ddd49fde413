-- done_get(lease, max_stalls, cap, max, forget, item, token, ...):
-- `done` of each holder's item (and client-go's Forget of it where `forget` says so and the
-- done was accepted: the worker succeeded), then `get` up to `max` times, in one call: a
-- worker's loop, or several workers' loops at once, finish their items and take the next
-- ones in one round trip and one script run. `lease`, `max_stalls` and `cap` as for get.
-- `forget` is '1' (forget every item), '0' (none), or one '1' or '0' per item. The dones and
-- the hand-outs are batched over the items (finish_many, take_many), with the replies one
-- done and one get per item would give; the hand-outs stop at the first that finds nothing.
-- Only a holder's accepted done forgets: a stale holder changes nothing, not even the
-- failure count the item's new holder may be counting on.
-- Returns {{done's reply, ...}, {get's reply for each item handed out, ...}}.
local lease, max_stalls = tonumber(ARGV[1]), tonumber(ARGV[2])
local cap, max = tonumber(ARGV[3]) or 0, tonumber(ARGV[4])
local forget = ARGV[5]
local xs, tokens = {}, {}
for i = 6, #ARGV - 1, 2 do
  xs[#xs + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local finished = finish_many(xs, tokens)
if #xs > 0 and forget ~= '0' then
  local per_item = #forget == #xs and #xs > 1
  local forgotten = {}
  for i = 1, #xs do
    local asked = forget == '1' or (per_item and string.sub(forget, i, i) == '1')
    if asked and (finished[i] == 1 or finished[i] == 2) then
      forgotten[#forgotten + 1] = xs[i]
    end
  end
  if #forgotten > 0 then
    redis.call('HDEL', K_FAIL, unpack(forgotten))
  end
end
return {finished, take_many(now_us(), lease, max_stalls, cap, max)}
