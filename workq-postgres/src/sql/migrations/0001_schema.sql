-- workqueue-postgres, schema version 1: one table set for every queue (a `queue` column).
--
-- Every operation is one call of a function below, so it is one statement, atomic, and runs
-- inside whatever transaction the caller has open (transactional enqueue). Times are the
-- server's clock (clock_timestamp(): the moment of the call, not the transaction's start).

-- Add order, lease tokens and the order of everything else: one counter, so a lease whose
-- token is larger than an add's sequence number was handed out after that add.
CREATE SEQUENCE IF NOT EXISTS workqueue_seq;

-- One row per queue: the fleet-wide shut down, the token bucket, counters.
CREATE TABLE IF NOT EXISTS workqueue_queues (
    name text PRIMARY KEY,
    shut_down boolean NOT NULL DEFAULT false,
    -- The token bucket's theoretical arrival time (GCRA); NULL: full.
    bucket_tat timestamptz,
    dead_dropped bigint NOT NULL DEFAULT 0
);

-- One row per item the queue knows: queued, delayed, leased (and maybe re-added while leased).
-- A row leaves the table when its item is done and nothing is pending for it.
CREATE TABLE IF NOT EXISTS workqueue_items (
    queue text NOT NULL,
    -- The item's JSON text: its identity for dedup.
    item text NOT NULL,
    -- Waiting to be handed out (client-go's queue).
    ready boolean NOT NULL DEFAULT false,
    -- Order within a priority (smaller first); a released item gets a negative one (the head).
    seq bigint NOT NULL,
    -- The priority the pending adds gave (NULL: none gave one); never NULL while ready.
    priority integer,
    -- A pending delayed add: when it is due (earliest wins).
    due timestamptz,
    -- The lease: its fencing token, deadline, start and the priority it was handed out with.
    token bigint,
    lease_until timestamptz,
    leased_at timestamptz,
    lease_priority integer NOT NULL DEFAULT 0,
    -- Re-added while leased: queued again when the lease is done (client-go's dirty set).
    dirty boolean NOT NULL DEFAULT false,
    -- Leases of this item that expired in a row (its workers died or stalled).
    stalls integer NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, item)
);

CREATE INDEX IF NOT EXISTS workqueue_items_ready
    ON workqueue_items (queue, priority DESC, seq) WHERE ready;
CREATE INDEX IF NOT EXISTS workqueue_items_due
    ON workqueue_items (queue, due) WHERE due IS NOT NULL;
CREATE INDEX IF NOT EXISTS workqueue_items_leased
    ON workqueue_items (queue, lease_until) WHERE token IS NOT NULL;

-- The rate limiter's failure counts (client-go's NumRequeues); kept after an item is done,
-- until it is forgotten.
CREATE TABLE IF NOT EXISTS workqueue_failures (
    queue text NOT NULL,
    item text NOT NULL,
    failures integer NOT NULL,
    PRIMARY KEY (queue, item)
);

-- Items given up on: too many expired leases in a row, or text that does not deserialize.
CREATE TABLE IF NOT EXISTS workqueue_dead (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    item text NOT NULL,
    reason text NOT NULL,
    stalls integer NOT NULL,
    failures integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS workqueue_dead_queue ON workqueue_dead (queue, id);

-- Moves an item's row to the dead letters, keeping at most `cap` (0: no cap) per queue.
CREATE OR REPLACE FUNCTION workqueue_bury(q text, x text, why text, cap integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    n_stalls integer;
    n_failures integer;
    dropped bigint;
BEGIN
    DELETE FROM workqueue_items WHERE queue = q AND item = x RETURNING stalls INTO n_stalls;
    DELETE FROM workqueue_failures WHERE queue = q AND item = x RETURNING failures INTO n_failures;
    INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
        VALUES (q, x, why, coalesce(n_stalls, 0), coalesce(n_failures, 0));
    IF cap > 0 THEN
        WITH old AS (
            DELETE FROM workqueue_dead WHERE queue = q AND id <= (
                SELECT id FROM workqueue_dead WHERE queue = q ORDER BY id DESC OFFSET cap LIMIT 1
            ) RETURNING 1
        )
        SELECT count(*) INTO dropped FROM old;
        IF dropped > 0 THEN
            UPDATE workqueue_queues SET dead_dropped = dead_dropped + dropped WHERE name = q;
        END IF;
    END IF;
END $$;

-- add(queue, item, priority or NULL, delay in microseconds): client-go's Add / AddAfter with
-- priorities. Returns the outcome ('ignored', 'queued', 'duplicate', 'deferred', 'delayed')
-- and the add's place in the queue's order (0 when ignored).
CREATE OR REPLACE FUNCTION workqueue_add(q text, x text, p integer, delay_us bigint,
    OUT kind text, OUT seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r workqueue_items%ROWTYPE;
    np integer;
    at timestamptz := clock_timestamp() + make_interval(secs => greatest(delay_us, 0) / 1e6);
    tries integer := 0;
BEGIN
    seq := 0;
    IF EXISTS (SELECT 1 FROM workqueue_queues WHERE name = q AND shut_down) THEN
        kind := 'ignored';
        RETURN;
    END IF;
    LOOP
        SELECT * INTO r FROM workqueue_items i WHERE i.queue = q AND i.item = x FOR UPDATE;
        IF NOT FOUND THEN
            -- A new item. A concurrent add of the same one may win the insert: then look again.
            IF delay_us <= 0 THEN
                INSERT INTO workqueue_items (queue, item, ready, seq, priority)
                    VALUES (q, x, true, nextval('workqueue_seq'), coalesce(p, 0))
                    ON CONFLICT DO NOTHING;
                kind := 'queued';
            ELSE
                INSERT INTO workqueue_items (queue, item, ready, seq, priority, due)
                    VALUES (q, x, false, nextval('workqueue_seq'), p, at)
                    ON CONFLICT DO NOTHING;
                kind := 'delayed';
            END IF;
            IF FOUND THEN
                EXIT;
            END IF;
            tries := tries + 1;
            IF tries > 8 THEN
                RAISE EXCEPTION 'workqueue_add: the row of % keeps changing (isolation above READ COMMITTED?)', x;
            END IF;
            CONTINUE;
        END IF;
        -- A priority raises the pending one and never lowers it; no priority keeps it.
        np := CASE WHEN p IS NULL THEN r.priority
                   WHEN r.priority IS NULL THEN p
                   ELSE greatest(r.priority, p) END;
        IF r.ready THEN
            -- Queued: any add only raises its priority (to the tail of the new one).
            IF np > r.priority THEN
                UPDATE workqueue_items i SET priority = np, seq = nextval('workqueue_seq')
                    WHERE i.queue = q AND i.item = x;
            END IF;
            kind := 'duplicate';
        ELSIF r.token IS NOT NULL THEN
            -- Leased: queued again after done (at once, or when the delay is due).
            IF r.dirty THEN
                UPDATE workqueue_items i SET priority = np WHERE i.queue = q AND i.item = x;
                kind := 'duplicate';
            ELSIF delay_us <= 0 THEN
                UPDATE workqueue_items i SET dirty = true, priority = np, due = NULL
                    WHERE i.queue = q AND i.item = x;
                kind := 'deferred';
            ELSE
                UPDATE workqueue_items i SET priority = np, due = least(coalesce(i.due, at), at)
                    WHERE i.queue = q AND i.item = x;
                kind := 'delayed';
            END IF;
        ELSE
            -- Delayed only.
            IF delay_us <= 0 THEN
                UPDATE workqueue_items i SET ready = true, due = NULL, priority = coalesce(np, 0),
                    seq = nextval('workqueue_seq')
                    WHERE i.queue = q AND i.item = x;
                kind := 'queued';
            ELSE
                UPDATE workqueue_items i SET priority = np, due = least(i.due, at)
                    WHERE i.queue = q AND i.item = x;
                kind := 'delayed';
            END IF;
        END IF;
        EXIT;
    END LOOP;
    -- Taken after the row is locked: a lease of this item with a larger token was handed out
    -- after this add.
    seq := nextval('workqueue_seq');
    IF kind IN ('queued', 'delayed') THEN
        -- Delivered when the caller's transaction commits; never if it rolls back.
        PERFORM pg_notify('workqueue', q);
    END IF;
END $$;

-- The rate limiter: counts a failure of the item and returns the delay its retry waits, in
-- microseconds: exponential per item (base * 2^(failures-1), capped), and, when
-- `bucket_interval_us` > 0, no sooner than the queue's token bucket allows.
CREATE OR REPLACE FUNCTION workqueue_backoff(q text, x text, base_us bigint, max_us bigint,
    bucket_interval_us bigint, burst integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    wait double precision;
    now_ timestamptz := clock_timestamp();
    tat timestamptz;
    bucket_wait double precision := 0;
BEGIN
    INSERT INTO workqueue_failures AS f (queue, item, failures) VALUES (q, x, 1)
        ON CONFLICT (queue, item) DO UPDATE SET failures = f.failures + 1
        RETURNING failures INTO n;
    wait := least(base_us::double precision * power(2::double precision, least(n - 1, 62)),
                  max_us::double precision);
    IF bucket_interval_us > 0 THEN
        -- GCRA: each retry takes one interval; up to `burst` go at once.
        UPDATE workqueue_queues SET bucket_tat = greatest(coalesce(bucket_tat, now_), now_)
                + make_interval(secs => bucket_interval_us / 1e6)
            WHERE name = q RETURNING bucket_tat INTO tat;
        IF tat IS NOT NULL THEN
            bucket_wait := extract(epoch FROM (tat - now_)) * 1e6
                - bucket_interval_us::double precision * burst;
        END IF;
    END IF;
    RETURN greatest(wait, bucket_wait, 0)::bigint;
END $$;

-- Makes due delayed adds and expired leases take effect (in due order). Runs in every get;
-- rows another call holds are skipped (it handles them).
CREATE OR REPLACE FUNCTION workqueue_refresh(q text, max_stalls integer, dead_cap integer,
    shut boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NOT shut THEN
        FOR r IN SELECT i.item, i.token FROM workqueue_items i
                 WHERE i.queue = q AND i.due <= clock_timestamp()
                 ORDER BY i.due LIMIT 1000 FOR UPDATE SKIP LOCKED LOOP
            IF r.token IS NULL THEN
                UPDATE workqueue_items i SET due = NULL, ready = true,
                    priority = coalesce(i.priority, 0), seq = nextval('workqueue_seq')
                    WHERE i.queue = q AND i.item = r.item;
            ELSE
                UPDATE workqueue_items i SET due = NULL, dirty = true
                    WHERE i.queue = q AND i.item = r.item;
            END IF;
        END LOOP;
    END IF;
    FOR r IN SELECT i.item, i.stalls FROM workqueue_items i
             WHERE i.queue = q AND i.token IS NOT NULL AND i.lease_until <= clock_timestamp()
             ORDER BY i.lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED LOOP
        IF max_stalls > 0 AND r.stalls + 1 >= max_stalls THEN
            UPDATE workqueue_items i SET stalls = i.stalls + 1 WHERE i.queue = q AND i.item = r.item;
            PERFORM workqueue_bury(q, r.item, 'stalled', dead_cap);
        ELSE
            -- Reclaimed: queued again (its re-adds fold into this hand-out).
            UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
                ready = true, dirty = false, due = NULL, stalls = i.stalls + 1,
                priority = greatest(i.lease_priority, coalesce(i.priority, i.lease_priority)),
                seq = nextval('workqueue_seq')
                WHERE i.queue = q AND i.item = r.item;
        END IF;
    END LOOP;
END $$;

-- get(queue, lease in microseconds, max stalls, dead-letter cap): hands out the next ready
-- item under a new lease. kind 1: leased (item, token, priority); 2: shut down and nothing
-- ready; 0: nothing ready, `wait_us` until the next delay or lease deadline (NULL: none).
CREATE OR REPLACE FUNCTION workqueue_get(q text, lease_us bigint, max_stalls integer,
    dead_cap integer, OUT kind integer, OUT item text, OUT token bigint, OUT priority integer,
    OUT wait_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
    shut boolean;
    x text;
    next_due timestamptz;
    next_expiry timestamptz;
BEGIN
    SELECT coalesce(bool_or(s.shut_down), false) INTO shut FROM workqueue_queues s WHERE s.name = q;
    PERFORM workqueue_refresh(q, max_stalls, dead_cap, shut);
    SELECT i.item INTO x FROM workqueue_items i WHERE i.queue = q AND i.ready
        ORDER BY i.priority DESC, i.seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        kind := 1;
        item := x;
        token := nextval('workqueue_seq');
        UPDATE workqueue_items i SET ready = false, token = workqueue_get.token,
            lease_until = clock_timestamp() + make_interval(secs => lease_us / 1e6),
            leased_at = clock_timestamp(), lease_priority = i.priority, priority = NULL,
            dirty = false
            WHERE i.queue = q AND i.item = x
            RETURNING i.lease_priority INTO priority;
        RETURN;
    END IF;
    IF shut THEN
        kind := 2;
        RETURN;
    END IF;
    kind := 0;
    SELECT min(i.due) INTO next_due FROM workqueue_items i WHERE i.queue = q AND i.due IS NOT NULL;
    SELECT min(i.lease_until) INTO next_expiry FROM workqueue_items i
        WHERE i.queue = q AND i.token IS NOT NULL;
    wait_us := greatest(1, extract(epoch FROM (least(next_due, next_expiry) - clock_timestamp())) * 1e6)::bigint;
END $$;

-- done(queue, item, token, release, mutations): client-go's Done (or a release: handed out
-- again at once, at the head), fenced by the lease's token. Returns 1 when done (or
-- released), 2 when done and queued again (re-added while leased), 0 when another lease holds
-- the item now, -1 when none does. A stale holder changes nothing. `mutations` is 0 outside
-- the fault tests (1: no fencing, 2: no re-queue of a re-added item).
CREATE OR REPLACE FUNCTION workqueue_done(q text, x text, tok bigint, release boolean,
    mutations integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r workqueue_items%ROWTYPE;
BEGIN
    SELECT * INTO r FROM workqueue_items i WHERE i.queue = q AND i.item = x FOR UPDATE;
    IF mutations & 1 = 1 AND NOT release AND (NOT FOUND OR r.token IS NULL) THEN
        -- Test mutation only: a queue without fencing takes any done as the holder's.
        DELETE FROM workqueue_items i WHERE i.queue = q AND i.item = x;
        RETURN 1;
    END IF;
    IF NOT FOUND OR r.token IS NULL THEN
        RETURN -1;
    END IF;
    IF r.token <> tok AND mutations & 1 = 0 THEN
        RETURN 0;
    END IF;
    IF release THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            ready = true, dirty = false, due = NULL,
            priority = greatest(i.lease_priority, coalesce(i.priority, i.lease_priority)),
            seq = -nextval('workqueue_seq')
            WHERE i.queue = q AND i.item = x;
        PERFORM pg_notify('workqueue', q);
        RETURN 1;
    END IF;
    IF r.dirty AND mutations & 2 = 0 THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            ready = true, dirty = false, stalls = 0, priority = coalesce(i.priority, 0),
            seq = nextval('workqueue_seq')
            WHERE i.queue = q AND i.item = x;
        PERFORM pg_notify('workqueue', q);
        RETURN 2;
    ELSIF r.due IS NOT NULL THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            dirty = false, stalls = 0
            WHERE i.queue = q AND i.item = x;
        RETURN 1;
    END IF;
    DELETE FROM workqueue_items i WHERE i.queue = q AND i.item = x;
    RETURN 1;
END $$;
