-- retry_done(item, token, forget, limited, delay, priority, base, max, qps, burst, group,
-- traceparent): a failed item's step, fenced by the lease's token as its `done` is. If the
-- lease is no longer the caller's, nothing changes. Otherwise the item's failures are
-- forgotten if `forget` is '1', the item is added again as `add_after` (`limited` '0': after
-- `delay` us, 0 for now) or `add_rate_limited` (`limited` '1': the limiter's delay from
-- `base`, `max`, `qps` and `burst`, or `delay` if that is shorter and not 0) would add it,
-- with priority `priority` ('': none given), group `group` (with flow control; absent: '')
-- and the worker's span's `traceparent` (absent: none), and the lease is finished as `done`
-- finishes it (its links go): the re-add was made while the item was processed, so it is
-- queued (or waits for its delay) once the lease ends, linked to the attempt that failed.
-- One script run: a stale holder counts no failure, forgets nothing and re-adds nothing.
-- Returns {done, outcome, seq, delay}: `done` is finish()'s reply (0: another holder has the
-- item, -1: nobody does; then nothing changed), or 3 when the queue is shut down for every
-- process (the re-add is refused: nothing changed, and the lease is still held).
local x, token = ARGV[1], ARGV[2]
local holder = redis.call('HGET', K_LEASE, x)
if not holds(holder, token) then
  if holder then
    return {0, IGNORED, 0, 0}
  end
  return {-1, IGNORED, 0, 0}
end
if redis.call('EXISTS', K_SHUT) == 1 then
  return {3, IGNORED, 0, 0}
end
local now = now_us()
if ARGV[3] == '1' then
  redis.call('HDEL', K_FAIL, x)
end
local delay = tonumber(ARGV[5])
if ARGV[4] == '1' then
  delay = rate_limited_delay(x, tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
    tonumber(ARGV[10]), delay, now)
end
local p, tp = priority_arg(ARGV[6]), traceparent_arg(ARGV[12])
promote_due(now)
local seq = next_seq(now)
local outcome
if delay <= 0 then
  outcome = add_now(x, p, ARGV[11], tp)
else
  outcome = add_at(x, now + delay, p, ARGV[11], tp)
end
return {finish(x, token), outcome, seq, delay}
