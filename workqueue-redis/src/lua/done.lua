-- done(item, token): client-go's Done, fenced by the lease's token (see finish()).
-- ARGV[1] = item, ARGV[2] = token, ARGV[3] = test mutations (see mutated()).
return finish(ARGV[1], ARGV[2], ARGV[3])
