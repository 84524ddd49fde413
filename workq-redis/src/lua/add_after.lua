-- add_after(item, delay, priority, group, traceparent): ARGV[1] = item,
-- ARGV[2] = delay in microseconds, ARGV[3] = priority ('' or absent: none
-- given), ARGV[4] = the item's group (with flow control; absent: ''), ARGV[5]
-- = the adding span's traceparent (absent: none; see traceparent_arg).
-- Returns {outcome, seq}.
local now = now_us()
if redis.call('EXISTS', K_SHUT) == 1 then
  return {IGNORED, 0}
end
promote_due(now)
local seq = next_seq(now)
local delay = tonumber(ARGV[2])
local p, tp = priority_arg(ARGV[3]), traceparent_arg(ARGV[5])
if delay <= 0 then
  return {add_now(ARGV[1], p, ARGV[4], tp), seq}
end
return {add_at(ARGV[1], now + delay, p, ARGV[4], tp), seq}
