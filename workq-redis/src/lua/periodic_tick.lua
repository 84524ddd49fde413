-- periodic_tick: takes one tick of a periodic schedule and adds its item, in one
-- run, so that runners of the schedule in any number of processes add one item
-- per tick between them (workq::Queue::add_on_tick).
-- KEYS[18] = the queue's schedules: HASH schedule name -> JSON record
--   {spec, since, last, next, paused}; instants are the runners' wall clock in
--   milliseconds since the Unix epoch, as decimal strings ('' for none). The
--   server's clock is never read for them: a tick is a time the schedule names.
-- ARGV[1] = schedule, ARGV[2] = spec, ARGV[3] = tick, ARGV[4] = next tick ('':
-- none), ARGV[5] = the runner's now, ARGV[6] = item, ARGV[7] = delay in
-- microseconds, ARGV[8] = priority ('': none given), ARGV[9] = the item's
-- group (with flow control; absent: ''), ARGV[10] = the runner's span's
-- traceparent (absent: none; see traceparent_arg).
-- Returns {outcome, add outcome, seq}: outcome 1 added, 2 already taken,
-- 3 paused (taken without an add), 0 shut down (nothing changed).
local K_PERIODIC = KEYS[18]
if redis.call('EXISTS', K_SHUT) == 1 then
  return {0, IGNORED, 0}
end
local raw = redis.call('HGET', K_PERIODIC, ARGV[1])
local rec
if raw then
  rec = cjson.decode(raw)
else
  rec = {spec = ARGV[2], since = ARGV[5], last = '', next = '', paused = false}
end
local tick = tonumber(ARGV[3])
if rec.last ~= '' and tonumber(rec.last) >= tick then
  return {2, IGNORED, 0}
end
rec.last = ARGV[3]
if ARGV[4] ~= '' then
  rec.next = ARGV[4]
end
redis.call('HSET', K_PERIODIC, ARGV[1], cjson.encode(rec))
if rec.paused then
  return {3, IGNORED, 0}
end
local now = now_us()
promote_due(now)
local seq = next_seq(now)
local delay = tonumber(ARGV[7])
local p, tp = priority_arg(ARGV[8]), traceparent_arg(ARGV[10])
if delay <= 0 then
  return {1, add_now(ARGV[6], p, ARGV[9], tp), seq}
end
return {1, add_at(ARGV[6], now + delay, p, ARGV[9], tp), seq}
