-- workqueue-postgres, schema version 2: a worker's step from one item to the next in one call.

-- done_get(queue, item, token, forget, mutations, lease in microseconds, max stalls,
-- dead-letter cap): forgets the item's failures when `forget` (client-go's Forget after a
-- success), then workqueue_done of the lease (the same fencing and re-queue of a re-added
-- item), then, if the done was accepted, workqueue_get without waiting. One statement, so one
-- round trip and one commit for the done and the next hand-out. `done` is workqueue_done's
-- answer; kind, item, token and priority are workqueue_get's (kind 0 when nothing was handed
-- out, also when the done was refused).
CREATE OR REPLACE FUNCTION workqueue_done_get(q text, x text, tok bigint, forget boolean,
    mutations integer, lease_us bigint, max_stalls integer, dead_cap integer,
    OUT done integer, OUT kind integer, OUT item text, OUT token bigint, OUT priority integer)
LANGUAGE plpgsql AS $$
DECLARE
    g record;
BEGIN
    IF forget THEN
        DELETE FROM workqueue_failures f WHERE f.queue = q AND f.item = x;
    END IF;
    done := workqueue_done(q, x, tok, false, mutations);
    kind := 0;
    IF done NOT IN (1, 2) THEN
        RETURN;
    END IF;
    SELECT * INTO g FROM workqueue_get(q, lease_us, max_stalls, dead_cap);
    kind := g.kind;
    item := g.item;
    token := g.token;
    priority := g.priority;
END $$;
