-- add_rate_limited(item): the delay is the larger of the item's exponential
-- backoff and the shared token bucket's wait (see limited_delay()).
-- ARGV[1] = item, ARGV[2] = base delay (us), ARGV[3] = max delay (us),
-- ARGV[4] = bucket rate (tokens per second, 0 = no bucket), ARGV[5] = burst,
-- ARGV[6] = a delay of the caller's (us, 0 or absent: none; the shorter of it
-- and the limiter's wins), ARGV[7] = priority ('' or absent: none given),
-- ARGV[8] = the item's group (with flow control; absent: ''), ARGV[9] = the
-- adding span's traceparent (absent: none; see traceparent_arg).
-- Returns {outcome, seq, delay in us}.
local x = ARGV[1]
local p, tp = priority_arg(ARGV[7]), traceparent_arg(ARGV[9])
local now = now_us()
local delay = rate_limited_delay(x, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), tonumber(ARGV[6]) or 0, now)

-- As in client-go, the limiter counts even when the add itself is ignored.
if redis.call('EXISTS', K_SHUT) == 1 then
  return {IGNORED, 0, delay}
end
promote_due(now)
local seq = next_seq(now)
if delay <= 0 then
  return {add_now(x, p, ARGV[8], tp), seq, delay}
end
return {add_at(x, now + delay, p, ARGV[8], tp), seq, delay}
