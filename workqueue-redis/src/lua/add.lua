-- add(item, priority): ARGV[1] = item, ARGV[2] = priority ('' or absent: none
-- given). Returns {outcome, seq}.
local now = now_us()
if redis.call('EXISTS', K_SHUT) == 1 then
  return {IGNORED, 0}
end
local seq = next_seq(now)
return {add_now(ARGV[1], priority_arg(ARGV[2])), seq}
