-- stats(limit): a consistent snapshot for operators: the figures a listing
-- shows (figures.lua) with the leases nearest their deadline and some failure
-- counts. Changes nothing.
-- ARGV[1] = how many in-flight items, failure counts and groups to list.
-- Returns {now, figures, in_flight = {item, since, deadline, token, ...},
--          failing = {item, count, ...}, next_delayed, flow}: `flow` is empty
-- without flow control, else {settings as JSON, groups with ready items,
-- groups at their limit, groups kept, top groups}, the top groups being the
-- ones with the most ready items (then by name), each {group, ready, leases
-- out, in-flight limit or '', when its oldest ready item became ready (us) or
-- ''}. Bounded work: the top groups are read from `fready`, and each one's
-- oldest ready item is the earliest of the first two of each of its lists
-- (a released item goes back to the head of its list, ahead of older ones).
local now = now_us()
local limit = tonumber(ARGV[1])
local inflight = {}
local proc = redis.call('ZRANGE', K_PROC, 0, limit - 1, 'WITHSCORES')
for i = 1, #proc, 2 do
  local x = proc[i]
  table.insert(inflight, x)
  table.insert(inflight, redis.call('HGET', K_SINCE, x) or '0')
  table.insert(inflight, proc[i + 1])
  table.insert(inflight, redis.call('HGET', K_LEASE, x) or '0')
end
local failing = {}
local cursor, n = '0', 0
repeat
  local r = redis.call('HSCAN', K_FAIL, cursor, 'COUNT', 100)
  cursor = r[1]
  for i = 1, #r[2], 2 do
    if n < limit then
      table.insert(failing, r[2][i])
      table.insert(failing, r[2][i + 1])
      n = n + 1
    end
  end
until cursor == '0' or n >= limit
local next_delayed = '-1'
local d = redis.call('ZRANGE', K_DELAY, 0, 0, 'WITHSCORES')
if d[2] then
  next_delayed = d[2]
end
local flow = {}
if flow_on() then
  local top = {}
  local ranked = redis.call('ZRANGE', K_FREADY, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit,
    'WITHSCORES')
  for i = 1, #ranked, 2 do
    local g = ranked[i]
    local h = redis.call('HGETALL', fgroup(g))
    local out, oldest = 0, nil
    for k = 1, #h, 2 do
      if h[k] == 'f' then
        out = tonumber(h[k + 1]) or 0
      elseif string.sub(h[k], 1, 2) == 'q:' then
        local heads = redis.call('LRANGE', flane(tonumber(string.sub(h[k], 3)), g), 0, 1)
        if #heads > 0 then
          for _, t in ipairs(redis.call('HMGET', K_FRT, unpack(heads))) do
            t = tonumber(t)
            if t and (not oldest or t < oldest) then
              oldest = t
            end
          end
        end
      end
    end
    local cap = gset(g).limit
    table.insert(top, {g, ranked[i + 1], out, cap and int(cap) or '', oldest and int(oldest) or ''})
  end
  flow = {
    redis.call('HGET', K_FLOW, 'json') or '',
    redis.call('ZCOUNT', K_FREADY, '(0', '+inf'),
    redis.call('SCARD', K_FSAT),
    redis.call('ZCARD', K_FREADY) + redis.call('ZCARD', K_FIDLE),
    top,
  }
end
return {int(now), figures(now), inflight, failing, next_delayed, flow}
