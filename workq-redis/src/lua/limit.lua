-- limited_delay(x, base, max, qps, burst, now): the rate limiter of a rate-limited add
-- of `x`, on the server so that two processes never read the same failure count. Counts
-- one failure of `x`, and returns the delay in microseconds (not rounded): the larger of
-- the item's exponential backoff (`base` * 2^failures before this one, at most `max`) and
-- the wait for a token of the queue's bucket (`qps` tokens per second, at most `burst`;
-- `qps` 0: no bucket). Shared by `add_rate_limited` and `retry_done`.
local function limited_delay(x, base, max, qps, burst, now)
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
  return delay
end

-- The delay of a rate-limited add: the limiter's (see limited_delay()), or `after` if
-- that is shorter (0: no delay of the caller's), in whole microseconds.
local function rate_limited_delay(x, base, max, qps, burst, after, now)
  local delay = limited_delay(x, base, max, qps, burst, now)
  if after > 0 and after < delay then
    delay = after
  end
  return math.ceil(delay)
end
