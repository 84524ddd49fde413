-- retry_now(item): an operator's "run it now" for an item that waits for a
-- delay or carries a failure count. As client-go's Add (add_now): a delayed
-- item is queued at once (its delay goes), one being processed is queued
-- again when its lease ends; a queued item stays where it is. Its failure
-- count is kept (forget clears it). Changes nothing for an item the queue
-- does not know, and nothing while the queue is shut down for every process.
-- ARGV[1] = item, ARGV[2] = its group (with flow control, for an item the
-- queue does not hold: one known only by its failure count; '' or absent:
-- the group '').
-- Returns 'queued', 'deferred' (queued when its lease ends), 'already_queued',
-- 'in_flight' (leased, no pending add to bring forward), 'shut_down' or
-- 'unknown'.
local x = ARGV[1]
if redis.call('EXISTS', K_SHUT) == 1 then
  return 'shut_down'
end
local delayed = redis.call('ZSCORE', K_DELAY, x) ~= false
local failing = redis.call('HEXISTS', K_FAIL, x) == 1
local dirty = redis.call('SISMEMBER', K_DIRTY, x) == 1
if dirty then
  return 'already_queued'
end
if is_processing(x) and not delayed then
  return 'in_flight'
end
if not delayed and not failing then
  return 'unknown'
end
local outcome = add_now(x, nil, ARGV[2])
if outcome == QUEUED then
  return 'queued'
elseif outcome == DEFERRED then
  return 'deferred'
end
return 'already_queued'
