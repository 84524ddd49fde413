-- workqueue-postgres, schema version 5: a worker's step waits a moment for a row that another
-- transaction holds, instead of sending that done back at once.
--
-- Version 4's workqueue_step skips a row another transaction holds (SKIP LOCKED), so that one
-- row an application keeps locked does not stop the pool; the caller then settles that done
-- on its own (workqueue_done, one more round trip, which waits for the row). Measured under
-- W7 (4 processes of 16 workers, 0 ms handler), about 2.5 % of the dones took that path:
-- the rows were held by the very step that had just handed the lease out, between sending its
-- answer and committing, for a few ms on a busy host. Each cost a round trip and a wait of its
-- own. Now the step waits for such a row for up to 20 ms (the setting workqueue.step_wait, or
-- the session's lock_timeout if shorter) before it gives the done back: the common instant is absorbed in the step, and a
-- row held longer still costs the step at most that once. Additive: the function's signature
-- and answers are version 4's.

CREATE OR REPLACE FUNCTION workqueue_step(q integer, ks bytea[], toks bigint[],
    forgets boolean[], n integer, lease_us bigint, sweep boolean, max_stalls integer,
    dead_cap integer, OUT done integer[], OUT kind integer, OUT items text[],
    OUT keys bytea[], OUT tokens bigint[], OUT priorities integer[], OUT wait_us bigint)
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
        SELECT i.ctid, i.token, i.dirty, i.due INTO r FROM workqueue_items i
            WHERE i.queue = q AND i.key = ks[o] FOR UPDATE SKIP LOCKED;
        got := FOUND;
        IF NOT got AND wait_ms > 0 THEN
            -- Held by another transaction. Most often for an instant: the step that handed
            -- this lease out has sent its answer and not yet committed (on a busy host, a
            -- few ms). Wait that long for the row here, rather than send the done back for a
            -- round trip of its own; a row held longer (an application's open transaction)
            -- costs this step at most wait_ms, once.
            BEGIN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
                SELECT i.ctid, i.token, i.dirty, i.due INTO r FROM workqueue_items i
                    WHERE i.queue = q AND i.key = ks[o] FOR UPDATE;
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
        IF r.dirty OR r.due IS NOT NULL THEN
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
END $$;

-- A function replaced loses its settings: the ones every function of the queue has (version
-- 3) and the step's plan mode (version 4).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], '
                   'integer, bigint, boolean, integer, integer) '
                   'SET search_path = pg_catalog, %I, pg_temp SET enable_seqscan = off '
                   'SET plan_cache_mode = force_generic_plan', current_schema());
END $$;
