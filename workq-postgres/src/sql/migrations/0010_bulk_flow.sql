-- workqueue-postgres, schema version 10: grouped hand-outs in bulk. Under flow control a
-- worker's step gives the slots of every lease it ends back in one call (one write of the
-- flow row and of each group's row for the whole step, not one per lease), and a get hands a
-- group that is alone in the turns at its priority all the items it may take in one go (its
-- row and the flow row written once for them), as one hand-out after another would. Additive:
-- the functions keep their arguments and answers, so older processes run on it unchanged.

-- flow_get: as version 9's; a group alone in the turns at its priority takes its hand-outs
-- together.
CREATE OR REPLACE FUNCTION workqueue_flow_get(q integer, n integer, lease_us bigint, sweep boolean,
    max_stalls integer, dead_cap integer, shut boolean, paused boolean, OUT kind integer,
    OUT items text[], OUT keys bytea[], OUT tokens bigint[], OUT priorities integer[],
    OUT wait_us bigint, OUT item_links text[], OUT item_drops integer[])
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    fl workqueue_flow;
    g workqueue_groups;
    h record;
    c record;
    a record;
    batch integer;
    promoted integer := 0;
    taken integer := 0;
    bits smallint;
    next_top integer;
    credit_ integer;
    skipped text[] := '{}';
    capped boolean := false;
    token_at timestamptz;
    wake_at timestamptz;
    next_due timestamptz;
    moved boolean := false;
    room integer;
    start_ integer;
    k integer;
    tids tid[];
    order_keys bytea[];
    b record;
BEGIN
    kind := 0;
    SELECT * INTO fl FROM workqueue_flow f WHERE f.queue = q FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        INSERT INTO workqueue_flow (queue) VALUES (q) ON CONFLICT (queue) DO NOTHING;
        SELECT * INTO fl FROM workqueue_flow f WHERE f.queue = q FOR NO KEY UPDATE;
    END IF;
    IF sweep THEN
        PERFORM workqueue_reclaim(q, now_, max_stalls, dead_cap);
        -- Groups that hold nothing, whose bucket is full again: forgotten.
        DELETE FROM workqueue_groups d WHERE d.ctid = ANY(ARRAY(
            SELECT e.ctid FROM workqueue_groups e
            WHERE e.queue = q AND e.idle AND e.tat <= now_
            ORDER BY e.tat LIMIT 1000));
        -- The sweep gave back the slots of the leases it took back.
        SELECT * INTO fl FROM workqueue_flow f WHERE f.queue = q;
    END IF;
    IF paused THEN
        kind := CASE WHEN shut THEN 2 ELSE 3 END;
        RETURN;
    END IF;
    -- The arrivals, in the order of the adds.
    LOOP
        WITH gone AS (
            DELETE FROM workqueue_arrivals x WHERE x.ctid = ANY(ARRAY(
                SELECT y.ctid FROM workqueue_arrivals y WHERE y.queue = q
                ORDER BY y.id LIMIT 5000))
            RETURNING x.grp, x.priority, x.n, x.id
        )
        SELECT array_agg(z.grp) AS names, array_agg(z.n) AS ns, array_agg(z.priority) AS tops,
               array_agg(z.id) AS turns, count(*) AS k
            INTO a FROM gone z;
        IF a.k > 0 THEN
            PERFORM workqueue_groups_join(q, a.names, a.ns, a.tops, a.turns);
        END IF;
        EXIT WHEN a.k < 5000;
    END LOOP;
    IF NOT shut THEN
        -- Due delayed items join their groups' ready order at their due time.
        LOOP
            WITH due_rows AS (
                UPDATE workqueue_items i SET ready = true, avail_at = i.due, due = NULL,
                    last_add = 1, grp = coalesce(i.grp, '')
                    WHERE i.ctid = ANY(ARRAY(
                        SELECT d.ctid FROM workqueue_items d
                        WHERE d.queue = q AND d.due <= now_ AND d.token IS NULL
                        ORDER BY d.due LIMIT 5000 FOR UPDATE SKIP LOCKED))
                    RETURNING i.grp, coalesce(i.priority, 0) AS p, i.due AS at
            )
            SELECT array_agg(z.grp ORDER BY z.first) AS names, array_agg(z.k ORDER BY z.first) AS ns,
                   array_agg(z.p ORDER BY z.first) AS tops,
                   array_agg(nextval('workqueue_seq') ORDER BY z.first) AS turns,
                   coalesce(sum(z.k), 0)::integer AS k
                INTO a
                FROM (SELECT d2.grp, d2.p, count(*)::integer AS k, min(d2.at) AS first
                      FROM due_rows d2 GROUP BY d2.grp, d2.p) z;
            batch := a.k;
            IF batch > 0 THEN
                PERFORM workqueue_groups_join(q, a.names, a.ns, a.tops, a.turns);
            END IF;
            promoted := promoted + batch;
            EXIT WHEN batch < 5000;
        END LOOP;
    END IF;
    -- Groups whose token is due: back at the end of the turns.
    UPDATE workqueue_groups p SET parked_until = NULL, credit = 0,
        turn = nextval('workqueue_seq')
        WHERE p.queue = q AND p.parked_until <= now_;
    WHILE taken < n LOOP
        IF fl.max_in_flight IS NOT NULL AND fl.in_flight >= fl.max_in_flight THEN
            capped := true;
            EXIT;
        END IF;
        IF fl.rate_us IS NOT NULL
                AND workqueue_token_at(fl.tat, fl.rate_us, fl.rate_burst) > now_ THEN
            token_at := workqueue_token_at(fl.tat, fl.rate_us, fl.rate_burst);
            EXIT;
        END IF;
        SELECT * INTO g FROM workqueue_groups t
            WHERE t.queue = q AND t.top IS NOT NULL AND t.parked_until IS NULL
              AND NOT t.saturated AND t.name <> ALL(skipped)
            ORDER BY t.top DESC, t.turn LIMIT 1 FOR NO KEY UPDATE;
        EXIT WHEN NOT FOUND;
        IF g.rate_us IS NOT NULL AND workqueue_token_at(g.tat, g.rate_us, g.burst) > now_ THEN
            -- Out of tokens: it leaves the turns to the others until its next one.
            UPDATE workqueue_groups t
                SET parked_until = workqueue_token_at(t.tat, t.rate_us, t.burst), credit = 0
                WHERE t.queue = q AND t.name = g.name;
            CONTINUE;
        END IF;
        -- A group alone in the turns at its priority (the others there hold nothing ready,
        -- are at their limit or wait for a token) takes every hand-out until it is not: its
        -- items go together, as many as the call, its limit and the queue's leave room for,
        -- with the group's row and the flow row written once for them all, as one hand-out
        -- after another would leave them. Not under a rate (each hand-out takes a token).
        room := n - taken;
        IF g.lim IS NOT NULL THEN
            room := least(room, g.lim - g.in_flight);
        END IF;
        IF fl.max_in_flight IS NOT NULL THEN
            room := least(room, fl.max_in_flight - fl.in_flight);
        END IF;
        IF room > 1 AND g.rate_us IS NULL AND fl.rate_us IS NULL
                AND NOT EXISTS (SELECT 1 FROM workqueue_groups t
                                WHERE t.queue = q AND t.top = g.top AND t.parked_until IS NULL
                                  AND NOT t.saturated AND t.name <> g.name
                                  AND t.name <> ALL(skipped)) THEN
            SELECT coalesce(array_agg(l.ctid ORDER BY l.p DESC, l.avail_at, l.seq), '{}'),
                   coalesce(array_agg(l.key ORDER BY l.p DESC, l.avail_at, l.seq), '{}')
                INTO tids, order_keys
                FROM (SELECT i.ctid, i.key, coalesce(i.priority, 0) AS p, i.avail_at, i.seq
                      FROM workqueue_items i
                      WHERE i.queue = q AND i.grp >= g.name AND i.grp <= g.name AND i.ready
                        AND coalesce(i.priority, 0) >= g.top
                      ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq
                      LIMIT room FOR UPDATE SKIP LOCKED) l;
            k := cardinality(tids);
            IF k > 0 THEN
                WITH leased AS (
                    UPDATE workqueue_items i SET ready = false, token = nextval('workqueue_seq'),
                        lease_until = now_ + make_interval(secs => lease_us / 1e6),
                        leased_at = now_, lease_priority = coalesce(i.priority, 0),
                        priority = NULL, dirty = false, avail_at = NULL, lease_flow = 3,
                        lease_links = i.links, lease_dropped = i.links_dropped, links = NULL,
                        links_dropped = NULL
                        WHERE i.ctid = ANY(tids)
                        RETURNING i.item, i.key, i.token, i.lease_priority, i.lease_links,
                            i.lease_dropped, array_position(order_keys, i.key) AS o
                )
                SELECT array_agg(l.item ORDER BY l.o) AS items,
                       array_agg(l.key ORDER BY l.o) AS keys,
                       array_agg(l.token ORDER BY l.o) AS tokens,
                       array_agg(l.lease_priority ORDER BY l.o) AS priorities,
                       array_agg(array_to_string(l.lease_links, ',') ORDER BY l.o) AS links,
                       array_agg(l.lease_dropped ORDER BY l.o) AS drops
                    INTO b FROM leased l;
                items := items || b.items;
                item_links := item_links || b.links;
                item_drops := item_drops || b.drops;
                keys := keys || b.keys;
                tokens := tokens || b.tokens;
                priorities := priorities || b.priorities;
                taken := taken + k;
                next_top := NULL;
                SELECT coalesce(i.priority, 0) INTO next_top FROM workqueue_items i
                    WHERE i.queue = q AND i.grp >= g.name AND i.grp <= g.name AND i.ready
                    ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq LIMIT 1;
                -- The credit k hand-outs leave (see below): a visit ends at each 0, and the
                -- next one starts with `weight`.
                start_ := CASE WHEN g.credit <= 0 THEN greatest(g.weight, 1) ELSE g.credit END;
                credit_ := CASE WHEN k < start_ THEN start_ - k
                                ELSE (greatest(g.weight, 1) - (k - start_) % greatest(g.weight, 1))
                                     % greatest(g.weight, 1) END;
                UPDATE workqueue_groups t SET
                    in_flight = t.in_flight + k,
                    ready = CASE WHEN next_top IS NULL THEN 0 ELSE greatest(t.ready - k, 1) END,
                    top = next_top,
                    credit = CASE WHEN next_top IS DISTINCT FROM t.top
                                       OR (t.lim IS NOT NULL AND t.in_flight + k >= t.lim) THEN 0
                                  ELSE credit_ END,
                    turn = CASE WHEN next_top IS NULL THEN t.turn
                                WHEN next_top <> t.top THEN
                                    coalesce((t.places ->> next_top::text)::bigint,
                                             nextval('workqueue_seq'))
                                WHEN k >= start_ THEN nextval('workqueue_seq')
                                ELSE t.turn END,
                    places = CASE WHEN next_top IS NULL THEN NULL
                                  WHEN next_top <> t.top
                                      THEN workqueue_places_below(t.places, next_top)
                                  ELSE t.places END
                    WHERE t.queue = q AND t.name = g.name;
                fl.in_flight := fl.in_flight + k;
                moved := true;
                CONTINUE;
            END IF;
        END IF;
        -- (The lane's own order, whatever the statistics: see workqueue_group_oldest.)
        SELECT i.ctid, coalesce(i.priority, 0) AS p INTO h FROM workqueue_items i
            WHERE i.queue = q AND i.grp >= g.name AND i.grp <= g.name AND i.ready
            ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq
            LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM workqueue_items i
                       WHERE i.queue = q AND i.grp >= g.name AND i.grp <= g.name AND i.ready
                       ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq
                       LIMIT 1) THEN
                -- Its ready rows are someone's (a transaction's add): their commit wakes the
                -- getters.
                skipped := skipped || g.name;
            ELSE
                UPDATE workqueue_groups t SET top = NULL, ready = 0, credit = 0, places = NULL
                    WHERE t.queue = q AND t.name = g.name;
            END IF;
            CONTINUE;
        END IF;
        IF h.p < g.top THEN
            -- Its items at its top priority are gone (taken out by an operator): it goes
            -- where its next item is, to its place in the turns there.
            UPDATE workqueue_groups t SET top = h.p, credit = 0,
                turn = coalesce((t.places ->> h.p::text)::bigint, nextval('workqueue_seq')),
                places = workqueue_places_below(t.places, h.p)
                WHERE t.queue = q AND t.name = g.name;
            CONTINUE;
        END IF;
        -- Every lease counts in its group and in the queue (a queue-wide limit set later
        -- counts it too).
        bits := 3;
        UPDATE workqueue_items i SET ready = false, token = nextval('workqueue_seq'),
            lease_until = now_ + make_interval(secs => lease_us / 1e6), leased_at = now_,
            lease_priority = coalesce(i.priority, 0), priority = NULL, dirty = false,
            avail_at = NULL, lease_flow = bits, lease_links = i.links,
            lease_dropped = i.links_dropped, links = NULL, links_dropped = NULL
            WHERE i.ctid = h.ctid
            RETURNING i.item, i.key, i.token, i.lease_priority, i.lease_links, i.lease_dropped
            INTO c;
        items := items || c.item;
        item_links := item_links || array_to_string(c.lease_links, ',');
        item_drops := item_drops || c.lease_dropped;
        keys := keys || c.key;
        tokens := tokens || c.token;
        priorities := priorities || c.lease_priority;
        taken := taken + 1;
        next_top := NULL;
        SELECT coalesce(i.priority, 0) INTO next_top FROM workqueue_items i
            WHERE i.queue = q AND i.grp >= g.name AND i.grp <= g.name AND i.ready
            ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq LIMIT 1;
        -- Deficit round robin: a new visit gets `weight` turns; the last one sends the group
        -- to the back of the turns of this priority. A group that leaves the turns (no more
        -- items at this priority, at its limit) ends its visit; one whose next items are at
        -- another priority takes its place in the turns there.
        credit_ := CASE WHEN g.credit <= 0 THEN g.weight ELSE g.credit END - 1;
        UPDATE workqueue_groups t SET
            in_flight = t.in_flight + 1,
            ready = CASE WHEN next_top IS NULL THEN 0 ELSE greatest(t.ready - 1, 1) END,
            top = next_top,
            credit = CASE WHEN next_top IS DISTINCT FROM t.top
                               OR (t.lim IS NOT NULL AND t.in_flight + 1 >= t.lim) THEN 0
                          ELSE credit_ END,
            turn = CASE WHEN next_top IS NULL THEN t.turn
                        WHEN next_top <> t.top THEN
                            coalesce((t.places ->> next_top::text)::bigint,
                                     nextval('workqueue_seq'))
                        WHEN credit_ <= 0 THEN nextval('workqueue_seq')
                        ELSE t.turn END,
            places = CASE WHEN next_top IS NULL THEN NULL
                          WHEN next_top <> t.top THEN workqueue_places_below(t.places, next_top)
                          ELSE t.places END,
            tat = CASE WHEN t.rate_us IS NOT NULL
                       THEN workqueue_token_take(t.tat, t.rate_us, now_) ELSE t.tat END
            WHERE t.queue = q AND t.name = g.name;
        IF bits = 3 THEN
            fl.in_flight := fl.in_flight + 1;
        END IF;
        IF fl.rate_us IS NOT NULL THEN
            fl.tat := workqueue_token_take(fl.tat, fl.rate_us, now_);
        END IF;
        moved := true;
    END LOOP;
    IF moved THEN
        UPDATE workqueue_flow f SET in_flight = fl.in_flight, tat = fl.tat WHERE f.queue = q;
    END IF;
    IF taken > 0 THEN
        kind := 1;
        IF taken = n AND promoted > taken THEN
            -- More became ready than this call took: other getters may be waiting.
            PERFORM workqueue_wake(q, promoted - taken);
        END IF;
        RETURN;
    END IF;
    items := NULL;
    item_links := NULL;
    item_drops := NULL;
    keys := NULL;
    tokens := NULL;
    priorities := NULL;
    IF shut AND NOT EXISTS (SELECT 1 FROM workqueue_items i WHERE i.queue = q AND i.ready) THEN
        kind := 2;
        RETURN;
    END IF;
    IF NOT capped THEN
        wake_at := token_at;
        IF token_at IS NULL THEN
            SELECT p.parked_until INTO wake_at FROM workqueue_groups p
                WHERE p.queue = q AND p.parked_until IS NOT NULL
                ORDER BY p.parked_until LIMIT 1;
        END IF;
        IF NOT shut THEN
            SELECT i.due INTO next_due FROM workqueue_items i
                WHERE i.queue = q AND i.due IS NOT NULL AND i.token IS NULL
                ORDER BY i.due LIMIT 1;
            IF next_due > now_ THEN
                wake_at := least(wake_at, next_due);
            END IF;
        END IF;
        IF wake_at > now_ THEN
            wait_us := ceil(extract(epoch FROM (wake_at - now_)) * 1e6)::bigint;
        END IF;
    END IF;
END $$;

-- step: as version 9's; the counted leases whose rows go are deleted with the others, and
-- their slots given back in one call of workqueue_flow_ended.
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
            -- costs this step at most wait_ms, once.
            BEGIN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
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

-- A function replaced takes the settings of its CREATE: both get those of version 9 again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workqueue_flow_get(integer, integer, bigint, boolean, '
                   'integer, integer, boolean, boolean) SET search_path = pg_catalog, %I, '
                   'pg_temp SET enable_seqscan = off SET jit = off SET enable_sort = off '
                   'SET plan_cache_mode = force_generic_plan', current_schema());
    EXECUTE format('ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], '
                   'integer, bigint, boolean, integer, integer) SET search_path = pg_catalog, '
                   '%I, pg_temp SET enable_seqscan = off SET jit = off '
                   'SET plan_cache_mode = force_generic_plan', current_schema());
END $$;
