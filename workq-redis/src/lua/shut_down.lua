-- shut_down(): shuts the queue down for every process until resume: adds are
-- ignored, delayed items wait (kept for the resume), ready items are still
-- handed out, and blocked getters wake. Returns 1 if the queue was running.
local was = redis.call('EXISTS', K_SHUT)
redis.call('SET', K_SHUT, '1')
wake()
return 1 - was
