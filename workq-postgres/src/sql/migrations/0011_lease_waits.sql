-- workqueue-postgres, schema version 11: a lease whose renewal or done waits for its row is
-- never taken back meanwhile. An application's transaction that holds an item's row (an add
-- of a leased item in a transaction left open) makes the holder's renewal wait for that row;
-- the lease could run out in the table while it waited, and once the row was free, a get's
-- sweep could take it before the waiting renewal did: the item was handed to a second worker.
-- Now every call that waits for a leased item's row on its holder's behalf (a renewal, a done
-- or release, a failed item's retry, a step's short wait) first takes the item's lease lock,
-- a transaction-scoped advisory lock, and the sweep takes back only a lease whose lock it
-- gets at once: a lease somebody waits to renew or end is left to that call. A renewal that
-- waited reckons its new deadline once it has the row (an UPDATE reckons it before the wait,
-- and wrote a deadline already past), and a done its time. Additive: the
-- functions older processes call keep their arguments and answers (they do not take the
-- lease lock, and keep the race).

-- The item `k` of queue `q`'s lease lock: an advisory lock id (one bigint; the adding lock is
-- a pair of integers, another key space). Two items sharing an id only wait for each other
-- now and then.
CREATE OR REPLACE FUNCTION workqueue_lease_lock(q integer, k bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN hashtextextended(encode(k, 'hex'), q);

-- renew(queue, key, token, lease): the lease `token` of the item lasts `lease_us` from now,
-- if it is still the holder's (true); false otherwise. It waits for the row as long as
-- another transaction holds it, whatever the session's lock_timeout: a renewal that gave up
-- would let the lease run out, and while it waits (holding the lease lock) no sweep takes the
-- lease back. One renewal at a time waits per lease. The row is locked before the new
-- deadline is reckoned: an UPDATE reckons its new values before it waits for the row, and
-- after a long wait would write a deadline already past (version 10's renewal did: the lease
-- it had waited to renew was taken back at once). The deadline is in no index, so the update
-- can be HOT.
CREATE OR REPLACE FUNCTION workqueue_renew(q integer, k bytea, tok bigint, lease_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(workqueue_lease_lock(q, k));
    PERFORM 1 FROM workqueue_items i WHERE i.queue = q AND i.key = k AND i.token = tok
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE workqueue_items i
        SET lease_until = clock_timestamp() + make_interval(secs => lease_us / 1e6)
        WHERE i.queue = q AND i.key = k;
    RETURN true;
END $$;

-- done: as version 9's, but the time it reckons with (for a delay come due, and the ready
-- time of an item queued again) is read once the item's row is locked, not before a wait
-- for it.
CREATE OR REPLACE FUNCTION workqueue_done(q integer, k bytea, tok bigint, release boolean,
    forget boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    r record;
    p integer;
BEGIN
    SELECT i.token, i.dirty, i.due, i.grp, i.lease_flow INTO r FROM workqueue_items i
        WHERE i.queue = q AND i.key = k FOR UPDATE;
    -- The time once the row is this call's: it may have waited for it.
    now_ := clock_timestamp();
    IF NOT FOUND OR r.token IS NULL THEN
        RETURN -1;
    END IF;
    IF r.token <> tok THEN
        RETURN 0;
    END IF;
    IF forget THEN
        DELETE FROM workqueue_failures f WHERE f.queue = q AND f.key = k;
    END IF;
    IF release THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            ready = true, dirty = false, due = NULL, lease_flow = 0,
            priority = greatest(i.lease_priority, coalesce(i.priority, i.lease_priority)),
            avail_at = '-infinity', seq = -nextval('workqueue_seq'),
            links = (i.lease_links || i.links)[1:4],
            links_dropped = nullif(coalesce(i.lease_dropped, 0) + coalesce(i.links_dropped, 0)
                + greatest(coalesce(cardinality(i.lease_links), 0)
                           + coalesce(cardinality(i.links), 0) - 4, 0), 0),
            lease_links = NULL, lease_dropped = NULL
            WHERE i.queue = q AND i.key = k
            RETURNING i.priority INTO p;
        IF r.grp IS NOT NULL OR r.lease_flow <> 0 THEN
            PERFORM workqueue_flow_ended(q, ARRAY[r.grp], ARRAY[r.lease_flow], ARRAY[p]);
        END IF;
        PERFORM workqueue_wake(q, 1);
        RETURN 1;
    END IF;
    IF r.dirty OR r.due <= now_ THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            ready = true, dirty = false, due = NULL, stalls = 0, lease_flow = 0,
            priority = coalesce(i.priority, 0), avail_at = now_,
            seq = nextval('workqueue_seq'), lease_links = NULL, lease_dropped = NULL
            WHERE i.queue = q AND i.key = k
            RETURNING i.priority INTO p;
        IF r.grp IS NOT NULL OR r.lease_flow <> 0 THEN
            PERFORM workqueue_flow_ended(q, ARRAY[r.grp], ARRAY[r.lease_flow], ARRAY[p]);
        END IF;
        PERFORM workqueue_wake(q, 1);
        RETURN 2;
    ELSIF r.due IS NOT NULL THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            dirty = false, stalls = 0, priority = coalesce(i.priority, 0), lease_flow = 0,
            lease_links = NULL, lease_dropped = NULL
            WHERE i.queue = q AND i.key = k;
        IF r.lease_flow <> 0 THEN
            PERFORM workqueue_flow_ended(q, ARRAY[r.grp], ARRAY[r.lease_flow],
                                         ARRAY[NULL::integer]);
        END IF;
        -- A getter's timer learns of the new due time.
        PERFORM workqueue_wake(q, 1);
        RETURN 1;
    END IF;
    DELETE FROM workqueue_items i WHERE i.queue = q AND i.key = k;
    IF r.lease_flow <> 0 THEN
        PERFORM workqueue_flow_ended(q, ARRAY[r.grp], ARRAY[r.lease_flow], ARRAY[NULL::integer]);
    END IF;
    RETURN 1;
END $$;

-- finish(queue, key, token, release, forget): workqueue_done, under the item's lease lock,
-- taken before the done waits for the row: while it waits, no sweep takes the lease back.
CREATE OR REPLACE FUNCTION workqueue_finish(q integer, k bytea, tok bigint, release boolean,
    forget boolean) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(workqueue_lease_lock(q, k));
    RETURN workqueue_done(q, k, tok, release, forget);
END $$;

-- reclaim: as version 9's, but a lease whose lock is held (its renewal, done or retry waits
-- for the row) is not taken back: the row is left to that call.
CREATE OR REPLACE FUNCTION workqueue_reclaim(q integer, now_ timestamp with time zone,
    max_stalls integer, dead_cap integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
    p integer;
    fg text[] := '{}';
    fb smallint[] := '{}';
    fp integer[] := '{}';
BEGIN
    FOR r IN SELECT i.key, i.stalls, i.grp, i.lease_flow FROM workqueue_items i
             WHERE i.queue = q AND i.token IS NOT NULL AND i.lease_until <= now_
             FOR UPDATE SKIP LOCKED LOOP
        -- A renewal, done or retry of this lease waits (for this row, until another
        -- transaction let it go): the lease is still its holder's, and that call settles it.
        IF NOT pg_try_advisory_xact_lock_shared(workqueue_lease_lock(q, r.key)) THEN
            CONTINUE;
        END IF;
        IF max_stalls > 0 AND r.stalls + 1 >= max_stalls THEN
            -- The failure row comes after the item rows in the lock order, and this loop
            -- goes on to other items: it is taken without waiting, or the item waits for the
            -- next sweep.
            PERFORM 1 FROM workqueue_failures f WHERE f.queue = q AND f.key = r.key
                FOR UPDATE SKIP LOCKED;
            IF NOT FOUND AND EXISTS (SELECT 1 FROM workqueue_failures f
                                     WHERE f.queue = q AND f.key = r.key) THEN
                CONTINUE;
            END IF;
            PERFORM workqueue_bury(q, r.key, 'stalled', dead_cap, 1);
        ELSE
            UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
                ready = true, dirty = false, due = NULL, stalls = i.stalls + 1, lease_flow = 0,
                priority = greatest(i.lease_priority, coalesce(i.priority, i.lease_priority)),
                avail_at = now_, seq = nextval('workqueue_seq'),
                links = (i.lease_links || i.links)[1:4],
                links_dropped = nullif(coalesce(i.lease_dropped, 0) + coalesce(i.links_dropped, 0)
                    + greatest(coalesce(cardinality(i.lease_links), 0)
                               + coalesce(cardinality(i.links), 0) - 4, 0), 0),
                lease_links = NULL, lease_dropped = NULL
                WHERE i.queue = q AND i.key = r.key
                RETURNING i.priority INTO p;
            n := n + 1;
            IF r.grp IS NOT NULL OR r.lease_flow <> 0 THEN
                fg := fg || r.grp;
                fb := fb || r.lease_flow;
                fp := fp || p;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(fb) > 0 THEN
        PERFORM workqueue_flow_ended(q, fg, fb, fp);
    END IF;
    IF n > 0 THEN
        PERFORM workqueue_wake(q, n);
    END IF;
    RETURN n;
END $$;

-- retry_done: as version 4's, with the item's lease lock taken before its row.
CREATE OR REPLACE FUNCTION workqueue_retry_done(q integer, k bytea, tok bigint, forget boolean,
    p integer, delay_us bigint, limited boolean, base_us bigint, max_us bigint,
    bucket_us bigint, burst integer, OUT outcome integer, OUT delay bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    a record;
BEGIN
    delay := 0;
    PERFORM pg_advisory_xact_lock_shared(2003920492, q);
    PERFORM pg_advisory_xact_lock(workqueue_lease_lock(q, k));
    SELECT i.token, i.item, i.grp INTO r FROM workqueue_items i
        WHERE i.queue = q AND i.key = k FOR UPDATE;
    IF NOT FOUND OR r.token IS NULL THEN
        outcome := -1;
        RETURN;
    ELSIF r.token <> tok THEN
        outcome := 0;
        RETURN;
    END IF;
    BEGIN
        IF forget THEN
            DELETE FROM workqueue_failures f WHERE f.queue = q AND f.key = k;
        END IF;
        SELECT * INTO a FROM workqueue_enqueue(q, ARRAY[r.item], ARRAY[r.grp], ARRAY[p],
            ARRAY[delay_us], ARRAY[limited], base_us, max_us, bucket_us, burst);
        IF a.kinds[1] = 0 THEN
            -- Shut down: undo the forget too.
            RAISE SQLSTATE 'WQ001';
        END IF;
    EXCEPTION WHEN SQLSTATE 'WQ001' THEN
        outcome := 3;
        RETURN;
    END;
    delay := a.delays[1];
    outcome := workqueue_done(q, k, tok, false, false);
END $$;

-- step: as version 10's; a done that waits for its row takes the item's lease lock first
-- (within the same short wait). A row the step takes without waiting needs none: no sweep
-- can take it while the step holds it.
CREATE OR REPLACE FUNCTION workqueue_step(q integer, ks bytea[], toks bigint[], forgets boolean[],
    n integer, lease_us bigint, sweep boolean, max_stalls integer, dead_cap integer,
    OUT done integer[], OUT kind integer, OUT items text[], OUT keys bytea[],
    OUT tokens bigint[], OUT priorities integer[], OUT wait_us bigint, OUT item_links text[],
    OUT item_drops integer[])
LANGUAGE plpgsql AS $$
DECLARE
    o integer;
    g record;
    now_ timestamptz;
    r record;
    c record;
    forget boolean;
    plain tid[] := '{}';
    forgotten tid[] := '{}';
    flowing integer[] := '{}';
    ended_grps text[] := '{}';
    ended_bits smallint[] := '{}';
    got boolean;
    -- How long a done waits for a row another transaction holds, in ms: the setting
    -- workqueue.step_wait (20ms if unset; 0 waits not at all), or the session's own
    -- lock_timeout if that is shorter.
    saved text := current_setting('lock_timeout');
    wait_ms integer := least(
        coalesce((extract(epoch FROM nullif(current_setting('workqueue.step_wait', true), '')
                  ::interval) * 1000)::integer, 20),
        coalesce(nullif((extract(epoch FROM saved::interval) * 1000)::integer, 0), 2147483647));
BEGIN
    done := array_fill(0, ARRAY[coalesce(cardinality(ks), 0)]);
    kind := 0;
    -- Item rows in key order, each without waiting. The common case, a lease whose item was
    -- neither re-added nor delayed meanwhile, is done here: its row goes in one DELETE below.
    -- The others take workqueue_done's path (a function call per lease costs more than the
    -- statements it runs).
    FOR o IN SELECT i FROM generate_subscripts(ks, 1) AS i ORDER BY ks[i] LOOP
        forget := coalesce(forgets[o], false);
        SELECT i.ctid, i.token, i.dirty, i.due, i.grp, i.lease_flow INTO r
            FROM workqueue_items i WHERE i.queue = q AND i.key = ks[o] FOR UPDATE SKIP LOCKED;
        got := FOUND;
        IF NOT got AND wait_ms > 0 THEN
            -- Held by another transaction. Most often for an instant: the step that handed
            -- this lease out has sent its answer and not yet committed (on a busy host, a
            -- few ms). Wait that long for the row here, rather than send the done back for a
            -- round trip of its own; a row held longer (an application's open transaction)
            -- costs this step at most wait_ms, once. The lease lock comes first, so that
            -- no sweep takes the lease back once the row is free and before this done has
            -- it (a renewal waiting for the row holds it already: the step then gives up
            -- at wait_ms, and the done is settled on its own).
            BEGIN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
                PERFORM pg_advisory_xact_lock(workqueue_lease_lock(q, ks[o]));
                SELECT i.ctid, i.token, i.dirty, i.due, i.grp, i.lease_flow INTO r
                    FROM workqueue_items i WHERE i.queue = q AND i.key = ks[o] FOR UPDATE;
                got := FOUND;
                PERFORM set_config('lock_timeout', saved, true);
            EXCEPTION WHEN lock_not_available THEN
                -- The setting is undone with the block.
                got := false;
            END;
        END IF;
        IF NOT got THEN
            -- Gone, or held by another transaction: its last committed version tells which.
            SELECT i.token, i.lease_until > clock_timestamp() AS running INTO c
                FROM workqueue_items i WHERE i.queue = q AND i.key = ks[o];
            done[o] := CASE WHEN c.token IS NULL THEN -1
                            WHEN c.token <> toks[o] THEN 0
                            WHEN c.running THEN 3 ELSE 4 END;
            CONTINUE;
        END IF;
        IF r.token IS NULL THEN
            done[o] := -1;
            CONTINUE;
        ELSIF r.token <> toks[o] THEN
            done[o] := 0;
            CONTINUE;
        END IF;
        -- The failure row, without waiting either (most items have none: one probe).
        IF forget AND EXISTS (SELECT 1 FROM workqueue_failures f
                              WHERE f.queue = q AND f.key = ks[o]) THEN
            SELECT f.ctid INTO c FROM workqueue_failures f
                WHERE f.queue = q AND f.key = ks[o] FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                done[o] := 3;
                CONTINUE;
            END IF;
            forgotten := forgotten || c.ctid;
        END IF;
        IF r.lease_flow <> 0 AND NOT r.dirty AND r.due IS NULL THEN
            -- A counted lease whose row goes: deleted with the others, its slots given back
            -- below, in one call for the whole step.
            plain := plain || r.ctid;
            ended_grps := ended_grps || r.grp;
            ended_bits := ended_bits || r.lease_flow;
            done[o] := 1;
        ELSIF r.lease_flow <> 0 OR (r.grp IS NOT NULL AND (r.dirty OR r.due IS NOT NULL)) THEN
            flowing := flowing || o;
        ELSIF r.dirty OR r.due IS NOT NULL THEN
            done[o] := workqueue_done(q, ks[o], toks[o], false, forget);
        ELSE
            plain := plain || r.ctid;
            done[o] := 1;
        END IF;
    END LOOP;
    IF cardinality(forgotten) > 0 THEN
        DELETE FROM workqueue_failures f WHERE f.ctid = ANY(forgotten);
    END IF;
    IF cardinality(plain) > 0 THEN
        DELETE FROM workqueue_items i WHERE i.ctid = ANY(plain);
    END IF;
    IF cardinality(ended_bits) > 0 THEN
        PERFORM workqueue_flow_ended(q, ended_grps, ended_bits,
                                     array_fill(NULL::integer, ARRAY[cardinality(ended_bits)]));
    END IF;
    FOREACH o IN ARRAY flowing LOOP
        done[o] := workqueue_done(q, ks[o], toks[o], false, false);
    END LOOP;
    -- The items queued again (re-added while leased) join the ready order in the step's
    -- order, as one done after another would queue them, not in the key order of the locks.
    IF (SELECT count(*) FROM unnest(done) AS d WHERE d = 2) > 1 THEN
        now_ := clock_timestamp();
        FOR o IN SELECT i FROM generate_subscripts(ks, 1) AS i WHERE done[i] = 2 ORDER BY i LOOP
            UPDATE workqueue_items i SET avail_at = now_, seq = nextval('workqueue_seq')
                WHERE i.queue = q AND i.key = ks[o];
        END LOOP;
    END IF;
    -- A caller whose every done was refused (a stale holder) takes nothing.
    IF n <= 0 OR (cardinality(done) > 0
                  AND NOT EXISTS (SELECT 1 FROM unnest(done) AS d WHERE d IN (1, 2, 3, 4))) THEN
        RETURN;
    END IF;
    SELECT * INTO g FROM workqueue_get(q, n, lease_us, sweep, max_stalls, dead_cap);
    kind := g.kind;
    items := g.items;
    keys := g.keys;
    tokens := g.tokens;
    priorities := g.priorities;
    wait_us := g.wait_us;
    item_links := g.item_links;
    item_drops := g.item_drops;
END $$;

-- A function created or replaced takes the settings of its CREATE: these get those of the
-- others again (a renewal's lock_timeout besides).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workqueue_renew(integer, bytea, bigint, bigint) '
                   'SET search_path = pg_catalog, %I, pg_temp SET lock_timeout = 0 '
                   'SET jit = off', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_done(integer, bytea, bigint, boolean, boolean) '
                   'SET search_path = pg_catalog, %I, pg_temp SET enable_seqscan = off '
                   'SET jit = off', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_finish(integer, bytea, bigint, boolean, boolean) '
                   'SET search_path = pg_catalog, %I, pg_temp SET jit = off', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_reclaim(integer, timestamptz, integer, integer) '
                   'SET search_path = pg_catalog, %I, pg_temp SET enable_seqscan = off '
                   'SET jit = off', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_retry_done(integer, bytea, bigint, boolean, '
                   'integer, bigint, boolean, bigint, bigint, bigint, integer) '
                   'SET search_path = pg_catalog, %I, pg_temp SET enable_seqscan = off '
                   'SET jit = off', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], '
                   'integer, bigint, boolean, integer, integer) SET search_path = pg_catalog, '
                   '%I, pg_temp SET enable_seqscan = off SET jit = off '
                   'SET plan_cache_mode = force_generic_plan', current_schema());
END $$;
