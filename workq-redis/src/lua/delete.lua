-- delete(): deletes every key of the queue, the ready lists of every priority,
-- the flow control keys (settings, groups, rings) and the trace links among
-- them. Returns 1.
for _, p in ipairs(redis.call('ZRANGE', K_LANES, 0, -1)) do
  redis.call('DEL', lane(tonumber(p)))
end
flow_delete_all()
redis.call('DEL', K_LINKS, K_LDROP, K_LLINKS, K_LLDROP)
redis.call('DEL', unpack(KEYS))
return 1
