-- shut_down(): shuts the queue down for every process until resume: adds are
-- ignored, delayed items wait (kept for the resume), ready items are still
-- handed out, and blocked getters wake.
redis.call('SET', K_SHUT, '1')
wake()
return 1
