-- done(item, token): client-go's Done, fenced by the lease's token (see finish()).
-- ARGV[1] = item, ARGV[2] = token.
return finish(ARGV[1], ARGV[2])
