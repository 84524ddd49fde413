-- summary(): a queue's figures for a listing of many queues, pipelined one
-- call per queue (see figures.lua). Changes nothing.
-- Returns {now, figures}.
local now = now_us()
return {int(now), figures(now)}
