-- workqueue-postgres, schema version 9: trace links (the client's feature `otel`; see the
-- repository's docs/tracing.md). An add made in a recorded span sends its W3C `traceparent`;
-- the item keeps the links of its first adds since its last hand-out (at most 4), the lease
-- that hands it out takes them, and a release or a lost lease gives them back in front of the
-- links of adds made meanwhile. Additive: the functions older processes call keep their
-- arguments (the hand-outs answer two more columns, which they do not read), and a queue whose
-- adds never carry a `traceparent` runs the statements it ran before.

ALTER TABLE workqueue_items
    -- The `traceparent`s of the adds since the item was last handed out, first add first;
    -- NULL for none.
    ADD COLUMN links text[],
    -- Adds whose link did not fit beside the 4 (those that wrote the row anyway: a duplicate
    -- add whose row holds 4 links already is not written, and not counted); NULL for none.
    ADD COLUMN links_dropped integer,
    -- What the current lease took of those at its hand-out (left as they were by a done that
    -- deletes the row, cleared by one that keeps it).
    ADD COLUMN lease_links text[],
    ADD COLUMN lease_dropped integer,
    -- Checked on every write, not on the rows of before (whose columns are NULL): no scan.
    ADD CONSTRAINT workqueue_items_links_bound
        CHECK (cardinality(links) <= 4 AND cardinality(lease_links) <= 4) NOT VALID;

ALTER TABLE workqueue_dead
    -- A letter keeps the links of the item it was: its lease's, then its pending adds' (at
    -- most 4), and their drops; a requeue gives them back.
    ADD COLUMN links text[],
    ADD COLUMN links_dropped integer;

-- Whether `t` is a W3C `traceparent` as a link keeps it: exactly 55 characters, a version of
-- two lowercase hex digits other than `ff`, a trace id and a span id of lowercase hex not all
-- zeros, the flags, dashes between. Anything else a client sends is not stored.
CREATE FUNCTION workqueue_traceparent_ok(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(t ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                AND left(t, 2) <> 'ff'
                AND substr(t, 4, 32) <> '00000000000000000000000000000000'
                AND substr(t, 37, 16) <> '0000000000000000', false);

-- link(queue, keys, traceparent): the adds of the items `ks` (an item named n times: n adds)
-- made in the span `tp`, each appended to its item's links while it holds fewer than 4, the
-- adds beyond counted. An item whose row holds 4 links already is neither locked nor written
-- (as a duplicate add without a link writes nothing). It waits for no row: it comes after
-- the add took its locks (the queue's row among them, for a rate-limited add), so waiting for
-- a duplicate's row here would break the lock order. A row another transaction holds at that
-- instant (a hand-out, an add in an open transaction) keeps no link of this add; the rows the
-- add itself locked are this transaction's. The rows exist: the adds were accepted in this
-- transaction.
CREATE FUNCTION workqueue_link(q integer, ks bytea[], tp text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT workqueue_traceparent_ok(tp) OR coalesce(cardinality(ks), 0) = 0 THEN
        RETURN;
    END IF;
    WITH adds AS (
        SELECT u.k, count(*)::integer AS n FROM unnest(ks) AS u(k) GROUP BY u.k ORDER BY u.k
    ), locked AS (
        SELECT i.id, a.n FROM adds a
        JOIN LATERAL (
            SELECT r.ctid AS id FROM workqueue_items r
            WHERE r.queue = q AND r.key = a.k AND coalesce(cardinality(r.links), 0) < 4
            LIMIT 1 FOR UPDATE SKIP LOCKED) i ON true
    )
    UPDATE workqueue_items i SET
        links = (i.links || array_fill(tp, ARRAY[least(l.n, 4)]))[1:4],
        links_dropped = nullif(coalesce(i.links_dropped, 0)
            + greatest(coalesce(cardinality(i.links), 0) + l.n - 4, 0), 0)
        FROM locked l
        WHERE i.ctid = l.id;
END $$;

-- enqueue_traced: workqueue_enqueue, then the accepted adds linked to the span `tp` (one
-- traceparent per call: the items of one batch share the caller's span). What a client calls
-- only when it has a traceparent to send.
CREATE FUNCTION workqueue_enqueue_traced(q integer, xs text[], grps text[], ps integer[],
    delays_us bigint[], limited boolean[], base_us bigint, max_us bigint, bucket_us bigint,
    burst integer, tp text, OUT kinds smallint[], OUT delays bigint[], OUT seqs bigint[],
    OUT flow_version bigint)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT e.kinds, e.delays, e.seqs, e.flow_version INTO kinds, delays, seqs, flow_version
        FROM workqueue_enqueue(q, xs, grps, ps, delays_us, limited, base_us, max_us, bucket_us,
                               burst) e;
    -- Kind 0: not added (the queue is shut down).
    PERFORM workqueue_link(q, ARRAY(SELECT sha256(convert_to(u.x, 'UTF8'))
                                    FROM unnest(xs, kinds) WITH ORDINALITY AS u(x, kind, i)
                                    WHERE u.kind <> 0 ORDER BY u.i), tp);
END $$;

-- retry_done_traced: workqueue_retry_done, then its re-add (if accepted) linked to the span
-- `tp` it was made in, so the next attempt links to the one that failed.
CREATE FUNCTION workqueue_retry_done_traced(q integer, k bytea, tok bigint, forget boolean,
    p integer, delay_us bigint, limited boolean, base_us bigint, max_us bigint,
    bucket_us bigint, burst integer, tp text, OUT outcome integer, OUT delay bigint)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT r.outcome, r.delay INTO outcome, delay
        FROM workqueue_retry_done(q, k, tok, forget, p, delay_us, limited, base_us, max_us,
                                  bucket_us, burst) r;
    IF outcome IN (1, 2) THEN
        PERFORM workqueue_link(q, ARRAY[k], tp);
    END IF;
END $$;

-- The hand-outs answer two more arrays, one entry per item handed out: the links its lease
-- took (the traceparents joined by ',', NULL for none) and the adds whose links were dropped
-- (NULL for none). Their results change, so they are dropped and made again; older processes
-- read their columns by name.
DROP FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], integer, bigint, boolean,
    integer, integer);
DROP FUNCTION workqueue_get(integer, integer, bigint, boolean, integer, integer);
DROP FUNCTION workqueue_flow_get(integer, integer, bigint, boolean, integer, integer, boolean,
    boolean);

-- flow_get: as version 8's; the hand-out moves the item's links to its lease and answers them.
CREATE FUNCTION workqueue_flow_get(q integer, n integer, lease_us bigint, sweep boolean,
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

-- get: as version 7's; the hand-out moves the items' links to their leases and answers them.
CREATE FUNCTION workqueue_get(q integer, n integer, lease_us bigint, sweep boolean,
    max_stalls integer, dead_cap integer, OUT kind integer, OUT items text[], OUT keys bytea[],
    OUT tokens bigint[], OUT priorities integer[], OUT wait_us bigint, OUT item_links text[],
    OUT item_drops integer[])
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    shut boolean;
    paused_ boolean;
    flow_ boolean;
    promoted integer := 0;
    batch integer;
    next_due timestamptz;
    taken bytea[];
    tids tid[];
BEGIN
    kind := 0;
    SELECT s.shut_down, s.paused, s.flow INTO shut, paused_, flow_
        FROM workqueue_queues s WHERE s.id = q;
    shut := coalesce(shut, false);
    IF flow_ THEN
        SELECT * INTO kind, items, keys, tokens, priorities, wait_us, item_links, item_drops
            FROM workqueue_flow_get(q, n, lease_us, sweep, max_stalls, dead_cap, shut,
                                    coalesce(paused_, false));
        RETURN;
    END IF;
    IF sweep THEN
        PERFORM workqueue_reclaim(q, now_, max_stalls, dead_cap);
    END IF;
    IF coalesce(paused_, false) THEN
        kind := CASE WHEN shut THEN 2 ELSE 3 END;
        RETURN;
    END IF;
    IF NOT shut THEN
        -- Due delayed items join the ready order at their due time (so before anything added
        -- after it). Every due row is promoted, a few thousand per statement.
        LOOP
            -- The due rows first, locked, then those very rows by their physical address
            -- (a TID scan): the plan cannot start from the queue's other rows, whatever the
            -- statistics say. A locked row does not move until this transaction moves it.
            -- (No other condition: one on the queue would let a generic plan, made while
            -- the table held a few rows, read the queue by the primary key instead.)
            UPDATE workqueue_items i SET ready = true, avail_at = i.due, due = NULL,
                last_add = 1
                WHERE i.ctid = ANY(ARRAY(
                    SELECT d.ctid FROM workqueue_items d
                    WHERE d.queue = q AND d.due <= now_ AND d.token IS NULL
                    ORDER BY d.due LIMIT 5000 FOR UPDATE SKIP LOCKED));
            GET DIAGNOSTICS batch = ROW_COUNT;
            promoted := promoted + batch;
            EXIT WHEN batch < 5000;
        END LOOP;
    END IF;
    -- The rows first, locked, in the queue's order, then those very rows by their physical
    -- address (as for promotion).
    SELECT coalesce(array_agg(l.key ORDER BY l.p DESC, l.avail_at, l.seq), '{}'),
           coalesce(array_agg(l.ctid), '{}')
        INTO taken, tids
        FROM (SELECT i.key, i.ctid, coalesce(i.priority, 0) AS p, i.avail_at, i.seq
              FROM workqueue_items i WHERE i.queue = q AND i.ready
              ORDER BY coalesce(i.priority, 0) DESC, i.avail_at, i.seq
              LIMIT greatest(n, 1) FOR UPDATE SKIP LOCKED) l;
    WITH leased AS (
        UPDATE workqueue_items i SET ready = false, token = nextval('workqueue_seq'),
            lease_until = now_ + make_interval(secs => lease_us / 1e6), leased_at = now_,
            lease_priority = coalesce(i.priority, 0), priority = NULL, dirty = false,
            avail_at = NULL, lease_links = i.links, lease_dropped = i.links_dropped,
            links = NULL, links_dropped = NULL
            WHERE i.ctid = ANY(tids)
            RETURNING i.item, i.key, i.token, i.lease_priority, i.lease_links, i.lease_dropped,
                array_position(taken, i.key) AS o
    )
    SELECT array_agg(l.item ORDER BY l.o), array_agg(l.key ORDER BY l.o),
           array_agg(l.token ORDER BY l.o), array_agg(l.lease_priority ORDER BY l.o),
           array_agg(array_to_string(l.lease_links, ',') ORDER BY l.o),
           array_agg(l.lease_dropped ORDER BY l.o)
        INTO items, keys, tokens, priorities, item_links, item_drops FROM leased l;
    IF promoted > coalesce(cardinality(items), 0) THEN
        -- More became ready than this call took: other getters may be waiting.
        PERFORM workqueue_wake(q, promoted - coalesce(cardinality(items), 0));
    END IF;
    IF cardinality(items) > 0 THEN
        kind := 1;
        RETURN;
    END IF;
    IF shut THEN
        kind := 2;
        RETURN;
    END IF;
    SELECT i.due INTO next_due FROM workqueue_items i
        WHERE i.queue = q AND i.due IS NOT NULL AND i.token IS NULL ORDER BY i.due LIMIT 1;
    IF next_due IS NOT NULL AND next_due > now_
            AND NOT EXISTS (SELECT 1 FROM workqueue_items i WHERE i.queue = q AND i.ready) THEN
        wait_us := ceil(extract(epoch FROM (next_due - now_)) * 1e6)::bigint;
    END IF;
END $$;

-- step: as version 7's; answers the links of the leases its get handed out.
CREATE FUNCTION workqueue_step(q integer, ks bytea[], toks bigint[], forgets boolean[],
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
        IF r.lease_flow <> 0 OR (r.grp IS NOT NULL AND (r.dirty OR r.due IS NOT NULL)) THEN
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

-- done: as version 7's; a release gives the lease's links back to the item, in front of those
-- of the adds made meanwhile (at most 4, the rest counted), and a done that keeps the row
-- clears them.
CREATE OR REPLACE FUNCTION workqueue_done(q integer, k bytea, tok bigint, release boolean,
    forget boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    r record;
    p integer;
BEGIN
    SELECT i.token, i.dirty, i.due, i.grp, i.lease_flow INTO r FROM workqueue_items i
        WHERE i.queue = q AND i.key = k FOR UPDATE;
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

-- reclaim: as version 7's; a lease taken back gives its links to the item as a release does.
CREATE OR REPLACE FUNCTION workqueue_reclaim(q integer, now_ timestamptz, max_stalls integer,
    dead_cap integer)
RETURNS integer
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

-- bury: as version 7's; the letter keeps the item's links, the lease's in front.
CREATE OR REPLACE FUNCTION workqueue_bury(q integer, k bytea, why text, cap integer,
    more_stalls integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    x text;
    n_stalls integer;
    n_failures integer;
    g text;
    b smallint;
    cut bigint;
    dropped bigint;
    ls text[];
    ld integer;
BEGIN
    DELETE FROM workqueue_items WHERE queue = q AND key = k
        RETURNING item, stalls, grp, lease_flow, (lease_links || links)[1:4],
            nullif(coalesce(lease_dropped, 0) + coalesce(links_dropped, 0)
                + greatest(coalesce(cardinality(lease_links), 0)
                           + coalesce(cardinality(links), 0) - 4, 0), 0)
        INTO x, n_stalls, g, b, ls, ld;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM workqueue_failures WHERE queue = q AND key = k RETURNING failures
        INTO n_failures;
    INSERT INTO workqueue_dead (queue, item, reason, stalls, failures, grp, links,
            links_dropped)
        VALUES (q, x, why, n_stalls + more_stalls, coalesce(n_failures, 0), g, ls, ld);
    IF cap > 0 THEN
        SELECT d.id INTO cut FROM workqueue_dead d WHERE d.queue = q
            ORDER BY d.id DESC OFFSET cap LIMIT 1;
        IF cut IS NOT NULL THEN
            PERFORM 1 FROM workqueue_queues s WHERE s.id = q FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                WITH old AS (
                    DELETE FROM workqueue_dead d WHERE d.id IN (
                        SELECT e.id FROM workqueue_dead e WHERE e.queue = q AND e.id <= cut
                        FOR UPDATE SKIP LOCKED)
                    RETURNING 1
                )
                SELECT count(*) INTO dropped FROM old;
                IF dropped > 0 THEN
                    UPDATE workqueue_queues SET dead_dropped = dead_dropped + dropped
                        WHERE id = q;
                END IF;
            END IF;
        END IF;
    END IF;
    IF b <> 0 THEN
        PERFORM workqueue_flow_ended(q, ARRAY[g], ARRAY[b], ARRAY[NULL::integer]);
    END IF;
END $$;

-- requeue_dead: as version 7's; each letter's links go back to its item, in front of those of
-- the adds pending.
CREATE OR REPLACE FUNCTION workqueue_requeue_dead(q integer, ids bigint[], lim integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    shut boolean;
    xs text[];
    gs text[];
    ls text[];
    ds integer[];
    a record;
    l record;
BEGIN
    IF EXISTS (SELECT 1 FROM workqueue_queues s WHERE s.id = q AND s.shut_down) THEN
        RETURN -1;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(2003920492, q);
    BEGIN
        WITH gone AS (
            DELETE FROM workqueue_dead d WHERE d.id IN (
                SELECT e.id FROM workqueue_dead e
                WHERE e.queue = q AND (ids IS NULL OR e.id = ANY(ids))
                ORDER BY e.id LIMIT lim)
            RETURNING d.id, d.item, d.grp, d.links, d.links_dropped
        )
        SELECT array_agg(g.item ORDER BY g.id), array_agg(g.grp ORDER BY g.id),
               array_agg(array_to_string(g.links, ',') ORDER BY g.id),
               array_agg(g.links_dropped ORDER BY g.id)
            INTO xs, gs, ls, ds
            FROM gone g;
        IF xs IS NULL THEN
            RETURN 0;
        END IF;
        SELECT * INTO a FROM workqueue_enqueue(q, xs, gs,
            array_fill(NULL::integer, ARRAY[cardinality(xs)]),
            array_fill(0::bigint, ARRAY[cardinality(xs)]),
            array_fill(false, ARRAY[cardinality(xs)]), 0, 0, 0, 0);
        -- The letters' links go in front of those of the adds pending (at most 4, the rest
        -- counted); of two letters of one item, the older in front. Before the queue's row,
        -- and waiting for no row the add did not lock (as workqueue_link): an item whose row
        -- another transaction holds at that instant gets no link back.
        FOR l IN SELECT workqueue_key(u.x) AS k, string_to_array(u.l, ',') AS ts,
                        coalesce(u.d, 0) AS d
                 FROM unnest(xs, ls, ds) WITH ORDINALITY AS u(x, l, d, i)
                 WHERE u.l IS NOT NULL OR u.d IS NOT NULL
                 ORDER BY workqueue_key(u.x), u.i DESC LOOP
            UPDATE workqueue_items i SET
                links = (l.ts || i.links)[1:4],
                links_dropped = nullif(l.d + coalesce(i.links_dropped, 0)
                    + greatest(coalesce(cardinality(l.ts), 0)
                               + coalesce(cardinality(i.links), 0) - 4, 0), 0)
                WHERE i.ctid = (SELECT r.ctid FROM workqueue_items r
                                WHERE r.queue = q AND r.key = l.k FOR UPDATE SKIP LOCKED);
        END LOOP;
        SELECT s.shut_down INTO shut FROM workqueue_queues s WHERE s.id = q FOR SHARE;
        IF shut OR EXISTS (SELECT 1 FROM unnest(a.kinds) AS k WHERE k = 0) THEN
            -- Shut down meanwhile: the letters go back where they were.
            RAISE SQLSTATE 'WQ002';
        END IF;
        RETURN cardinality(xs);
    EXCEPTION WHEN SQLSTATE 'WQ002' THEN
        RETURN -1;
    END;
END $$;

-- Every function replaced or added runs as version 7's do (see version 8).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname LIKE 'workqueue\_%'
               AND p.prosqlbody IS NULL
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp '
                       'SET enable_seqscan = off SET jit = off', f, current_schema());
    END LOOP;
END $$;
ALTER FUNCTION workqueue_get(integer, integer, bigint, boolean, integer, integer)
    SET enable_sort = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_flow_get(integer, integer, bigint, boolean, integer, integer, boolean,
    boolean) SET enable_sort = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], integer, bigint,
    boolean, integer, integer) SET plan_cache_mode = force_generic_plan;
