-- shut_down(): adds are ignored from now on, delayed items are dropped (as
-- client-go's delaying queue drops its heap), ready items are still handed out,
-- and blocked getters wake.
redis.call('SET', K_SHUT, '1')
redis.call('DEL', K_DELAY)
wake()
return 1
