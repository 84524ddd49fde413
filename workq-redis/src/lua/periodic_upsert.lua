-- periodic_upsert: creates a periodic schedule's record if it is missing, sets
-- what the caller gives, and returns the record (workq::Queue::upsert_schedule).
-- KEYS[18] = the queue's schedules (see periodic_tick.lua).
-- ARGV[1] = schedule, ARGV[2] = the caller's now (ms), ARGV[3] = '1' to set the
-- spec to ARGV[4], ARGV[5] = next tick ('': unchanged), ARGV[6] = '1' pause,
-- '0' resume, '': unchanged. A resume of a paused schedule moves `since` to now,
-- so the ticks skipped while it was paused are never caught up.
-- Returns the record's JSON.
local K_PERIODIC = KEYS[18]
local raw = redis.call('HGET', K_PERIODIC, ARGV[1])
local rec
if raw then
  rec = cjson.decode(raw)
else
  rec = {spec = '', since = ARGV[2], last = '', next = '', paused = false}
end
if ARGV[3] == '1' then
  rec.spec = ARGV[4]
end
if ARGV[5] ~= '' then
  rec.next = ARGV[5]
end
if ARGV[6] == '1' then
  rec.paused = true
elseif ARGV[6] == '0' and rec.paused then
  rec.paused = false
  if tonumber(rec.since) < tonumber(ARGV[2]) then
    rec.since = ARGV[2]
  end
end
local out = cjson.encode(rec)
redis.call('HSET', K_PERIODIC, ARGV[1], out)
return out
