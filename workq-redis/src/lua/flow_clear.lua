-- flow_clear(): takes flow control off the queue, for every process: the
-- ready items go back to the ready lists of their priorities (group after
-- group, the groups with the most ready items first, each in its order), and
-- every flow control key is deleted. The queue is then as one built without
-- flow control; a handle built with flow settings afterwards sets them again.
-- O(items), once. Returns 1 if the queue had flow control, else 0.
if not flow_on() then
  return 0
end
for _, g in ipairs(redis.call('ZRANGE', K_FREADY, 0, -1, 'REV')) do
  local h = redis.call('HGETALL', fgroup(g))
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'q:' then
      local p = tonumber(string.sub(h[i], 3))
      local key = flane(p, g)
      while true do
        local xs = redis.call('LPOP', key, 1000)
        if not xs then
          break
        end
        redis.call('RPUSH', lane(p), unpack(xs))
        if p ~= 0 then
          redis.call('ZADD', K_LANES, p, int(p))
        end
      end
    end
  end
end
flow_delete_all()
wake()
return 1
