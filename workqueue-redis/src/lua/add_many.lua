-- add_many(item, delay, priority, ...): `add_after` of each item in turn, in
-- one call (the adds apply in order, each by the rules of one add). Delays
-- are in microseconds (0: add now); a priority of '' means none given.
-- Returns {{outcome, seq}, ...}, one per add.
local now = now_us()
local n = #ARGV / 3
local replies = {}
if redis.call('EXISTS', K_SHUT) == 1 then
  for i = 1, n do
    replies[i] = {IGNORED, 0}
  end
  return replies
end
promote_due(now)
-- One sequence number per add, read and written back once (see next_seq()).
local seq = next_seq(now)
for i = 1, n do
  local x, delay = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  local p = priority_arg(ARGV[3 * i])
  local outcome
  if delay <= 0 then
    outcome = add_now(x, p)
  else
    outcome = add_at(x, now + delay, p)
  end
  replies[i] = {outcome, seq + i - 1}
end
if n > 1 then
  redis.call('SET', K_SEQ, int(seq + n - 1))
end
return replies
