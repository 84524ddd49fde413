-- add_rate_limited(item): the delay is the larger of the item's exponential
-- backoff and the shared token bucket's wait, both computed here so that two
-- processes never read the same failure count.
-- ARGV[1] = item, ARGV[2] = base delay (us), ARGV[3] = max delay (us),
-- ARGV[4] = bucket rate (tokens per second, 0 = no bucket), ARGV[5] = burst,
-- ARGV[6] = a delay of the caller's (us, 0 or absent: none; the shorter of it
-- and the limiter's wins), ARGV[7] = priority ('' or absent: none given).
-- Returns {outcome, seq, delay in us}.
local x = ARGV[1]
local base, max = tonumber(ARGV[2]), tonumber(ARGV[3])
local qps, burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local after = tonumber(ARGV[6]) or 0
local p = priority_arg(ARGV[7])
local now = now_us()

-- client-go's ItemExponentialFailureRateLimiter: read the count, then count.
local exp = redis.call('HINCRBY', K_FAIL, x, 1) - 1
redis.call('HINCRBY', K_META, 'failures', 1)
local delay = base * math.pow(2, exp)
if delay ~= delay or delay > max then
  delay = max
end

-- rate.Limiter.Reserve: refill since the last reservation, take one token,
-- and wait for it if the bucket is in debt.
if qps > 0 then
  local b = redis.call('HMGET', K_BUCKET, 'tokens', 'last')
  local tokens = tonumber(b[1]) or burst
  local last = tonumber(b[2]) or now
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  tokens = math.min(burst, tokens + elapsed / 1000000 * qps) - 1
  redis.call('HSET', K_BUCKET, 'tokens', string.format('%.17g', tokens), 'last', int(now))
  if tokens < 0 then
    local wait = -tokens / qps * 1000000
    if wait > delay then
      delay = wait
    end
  end
end
if after > 0 and after < delay then
  delay = after
end
delay = math.ceil(delay)

-- As in client-go, the limiter counts even when the add itself is ignored.
if redis.call('EXISTS', K_SHUT) == 1 then
  return {IGNORED, 0, delay}
end
promote_due(now)
local seq = next_seq(now)
if delay <= 0 then
  return {add_now(x, p), seq, delay}
end
return {add_at(x, now + delay, p), seq, delay}
