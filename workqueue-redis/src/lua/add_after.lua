-- add_after(item, delay): ARGV[1] = item, ARGV[2] = delay in microseconds.
-- Returns {outcome, seq}.
local now = now_us()
if redis.call('EXISTS', K_SHUT) == 1 then
  return {IGNORED, 0}
end
local seq = next_seq(now)
local delay = tonumber(ARGV[2])
if delay <= 0 then
  return {add_now(ARGV[1]), seq}
end
return {add_at(ARGV[1], now + delay), seq}
