-- workqueue-postgres, schema version 6: periodic schedules (workq::periodic), one item per
-- tick across every process that runs a schedule.
--
-- A schedule is a row of workqueue_schedules, named within its queue. Its instants are the
-- runners' wall clock in milliseconds since the Unix epoch, as the runners send them: the
-- functions store and compare them and never read the server's clock for them, since a tick
-- is a time the schedule names, the same in every process.
--
-- A runner takes a tick with workqueue_periodic_claim and adds its item in the same
-- transaction (the client calls workqueue_add before it commits): the schedule's row is
-- locked by the claim until the commit, so two runners of one tick take turns, and the second
-- finds the tick taken. A claim whose add the queue refuses (shut down) is rolled back.
-- Additive: version 5's processes run on it.

CREATE TABLE workqueue_schedules (
    queue integer NOT NULL REFERENCES workqueue_queues (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (name <> ''),
    -- How it runs, for people: `every 5m`, `cron 0 3 * * * (Europe/Paris)`.
    spec text NOT NULL DEFAULT '',
    -- Ticks at or before this instant are never caught up: the first registration, or the
    -- last resume.
    since_ms bigint NOT NULL,
    -- The latest tick taken (added, or skipped while paused); NULL before the first.
    last_tick_ms bigint,
    -- The next tick, as the last runner that wrote the row computed it.
    next_tick_ms bigint,
    paused boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, name)
);

-- Creates schedule `s` of queue `q` if it is missing (since = now_ms), sets what is not NULL
-- (the spec, the next tick; `pause` true pauses, false resumes), and returns the row. A resume
-- of a paused schedule moves `since_ms` to `now_ms`, so that the ticks skipped while it was
-- paused are never caught up.
CREATE FUNCTION workqueue_periodic_upsert(q integer, s text, now_ms bigint, new_spec text,
    next_ms bigint, pause boolean)
RETURNS SETOF workqueue_schedules
LANGUAGE plpgsql AS $$
DECLARE
    r workqueue_schedules;
BEGIN
    INSERT INTO workqueue_schedules (queue, name, since_ms)
    VALUES (q, s, now_ms)
    ON CONFLICT (queue, name) DO NOTHING;
    SELECT * INTO r FROM workqueue_schedules WHERE queue = q AND name = s FOR UPDATE;
    r.spec := coalesce(new_spec, r.spec);
    r.next_tick_ms := coalesce(next_ms, r.next_tick_ms);
    IF pause THEN
        r.paused := true;
    ELSIF NOT pause AND r.paused THEN
        r.paused := false;
        r.since_ms := greatest(r.since_ms, now_ms);
    END IF;
    UPDATE workqueue_schedules
       SET spec = r.spec, next_tick_ms = r.next_tick_ms, paused = r.paused,
           since_ms = r.since_ms
     WHERE queue = q AND name = s;
    RETURN NEXT r;
END $$;

-- Takes tick `tick_ms` of schedule `s` of queue `q` (created with spec `new_spec` and
-- since = now_ms if missing), and writes `next_ms` (if not NULL) as its next tick. Answers
-- 0 if the queue is shut down for every process (nothing changed), 1 if the tick is this
-- caller's (its item is to be added in this transaction), 2 if it, or a later one, was taken
-- already (nothing changed), 3 if the schedule is paused (the tick is taken, and no item is
-- added). The row stays locked until the caller's transaction ends.
CREATE FUNCTION workqueue_periodic_claim(q integer, s text, new_spec text, tick_ms bigint,
    next_ms bigint, now_ms bigint)
RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    r workqueue_schedules;
BEGIN
    IF (SELECT shut_down FROM workqueue_queues WHERE id = q) THEN
        RETURN 0;
    END IF;
    INSERT INTO workqueue_schedules (queue, name, spec, since_ms)
    VALUES (q, s, new_spec, now_ms)
    ON CONFLICT (queue, name) DO NOTHING;
    SELECT * INTO r FROM workqueue_schedules WHERE queue = q AND name = s FOR UPDATE;
    IF r.last_tick_ms >= tick_ms THEN
        RETURN 2;
    END IF;
    UPDATE workqueue_schedules
       SET last_tick_ms = tick_ms, next_tick_ms = coalesce(next_ms, next_tick_ms)
     WHERE queue = q AND name = s;
    IF r.paused THEN
        RETURN 3;
    END IF;
    RETURN 1;
END $$;

-- The new functions run with the search_path of their schema (see version 3).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname LIKE 'workqueue\_periodic\_%'
               AND p.prosqlbody IS NULL
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       f, current_schema());
    END LOOP;
END $$;
