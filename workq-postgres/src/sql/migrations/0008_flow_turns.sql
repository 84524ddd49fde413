-- workqueue-postgres, schema version 8: flow control as the other backends have it, where
-- version 7 differed.
--
-- EACH PRIORITY KEEPS ITS OWN TURNS. Version 7 gave a group one place in the turns for all its
-- priorities: a group that became ready at a higher priority took a new place, and kept it when
-- it came back down, so a hand-out at priority 1 could cost it its place among the groups of
-- priority 0 (or give it a better one). The in-memory queue and Redis keep a ring per
-- priority. Here a group keeps its place at its highest ready priority in `turn`, as before
-- (the index of the turns is unchanged), and its places at the priorities below, where it has
-- ready items too, in `places` (priority -> turn, NULL when there is none): a group joins the
-- turns of a priority when an item of it becomes ready there, and keeps that place until it
-- hands out there. When its highest ready priority goes down (its items there are handed out
-- or taken out), it takes its place at the new one; when it goes up, it keeps its place at the
-- old one in `places`. The adds announce their items per group and priority
-- (workqueue_arrivals) for that.
--
-- EVERY LEASE COUNTS. Version 7 counted a lease against the queue-wide limit only if the limit
-- was set when it was handed out, and the leases handed out before flow control came on
-- against no limit. Now every hand-out under flow control counts in its group and in the queue
-- (lease_flow 3), and turning flow control on, or changing its settings, counts the leases
-- out that are not counted yet: in their groups (those added without one in the group '')
-- and in the queue.
--
-- TAKEN OFF ON PURPOSE. workqueue_flow_clear turns flow control off (PgQueue::clear_flow_control);
-- a process built without any flow setting no longer writes settings (it follows the stored
-- ones), so flow control is only ever turned off by this call or by the queue's deletion.

ALTER TABLE workqueue_groups
    -- The group's places in the turns of the priorities below its highest ready one, where it
    -- has ready items too: {"priority": turn, ...}; NULL for none.
    ADD COLUMN places jsonb;

-- `places` without the priorities at or above `p`: a group's places below its highest ready
-- priority once that is `p`. NULL for none.
CREATE FUNCTION workqueue_places_below(places jsonb, p integer)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN nullif(places - ARRAY(SELECT k FROM jsonb_object_keys(places) AS k WHERE k::integer >= p),
              '{}'::jsonb);

-- Work became ready in the groups `names` of queue `q`: per entry, `ns` items (added to the
-- group's count) at priority `tops`, joining the turns of that priority at `turns` (smaller
-- first) unless the group has a place there already. A group whose highest ready priority
-- goes up takes its new place there with a new visit, and keeps the old one in `places`; a
-- group the queue does not keep yet is made with its settings. The caller holds the queue's
-- flow row.
CREATE OR REPLACE FUNCTION workqueue_groups_join(q integer, names text[], ns integer[],
    tops integer[], turns bigint[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO workqueue_groups AS g (queue, name, ready, top, turn, places, lim, weight,
            rate_us, burst)
    SELECT q, a.name, a.n, a.top, a.turn,
           CASE WHEN a.places IS NOT NULL THEN workqueue_places_below(a.places, a.top) END,
           coalesce(s.max_in_flight, f.group_max_in_flight),
           greatest(coalesce(s.weight, 1), 1),
           coalesce(s.rate_us, f.group_rate_us),
           CASE WHEN s.rate_us IS NOT NULL THEN s.rate_burst ELSE f.group_rate_burst END
    FROM (SELECT b.name, sum(b.n)::integer AS n, max(b.p) AS top,
                 (array_agg(b.turn ORDER BY b.p DESC))[1] AS turn,
                 -- (Only for a group announced at more than one priority: the common
                 -- case, one priority, reads and writes no places.)
                 CASE WHEN count(*) > 1 THEN jsonb_object_agg(b.p::text, b.turn) END AS places
          FROM (SELECT u.name, u.p, sum(u.n) AS n, min(u.turn) AS turn
                FROM unnest(names, ns, tops, turns) AS u(name, n, p, turn)
                GROUP BY u.name, u.p) b
          GROUP BY b.name) a
    LEFT JOIN workqueue_flow f ON f.queue = q
    -- A probe of the settings' key per group, whatever the statistics say.
    LEFT JOIN LATERAL (SELECT t.max_in_flight, t.weight, t.rate_us, t.rate_burst
                       FROM workqueue_group_settings t
                       WHERE t.queue = q AND t.name = a.name LIMIT 1) s ON true
    ORDER BY a.name
    ON CONFLICT (queue, name) DO UPDATE SET
        ready = g.ready + EXCLUDED.ready,
        top = greatest(g.top, EXCLUDED.top),
        turn = CASE WHEN g.top IS NULL OR EXCLUDED.top > g.top THEN EXCLUDED.turn
                    ELSE g.turn END,
        credit = CASE WHEN g.top IS NULL OR EXCLUDED.top > g.top THEN 0 ELSE g.credit END,
        -- The places announced, then those the group has (kept), then its place at its old
        -- highest priority if it goes up; none at the new highest one. (None at all, without
        -- a look, when the group has none and is announced at its highest priority only.)
        places = CASE
            WHEN EXCLUDED.places IS NULL AND g.places IS NULL
                 AND (g.top IS NULL OR EXCLUDED.top = g.top) THEN NULL
            ELSE workqueue_places_below(
                coalesce(EXCLUDED.places, '{}'::jsonb)
                    || jsonb_build_object(EXCLUDED.top::text, EXCLUDED.turn)
                    || coalesce(g.places, '{}'::jsonb)
                    || CASE WHEN EXCLUDED.top > g.top
                            THEN jsonb_build_object(g.top::text, g.turn)
                            ELSE '{}'::jsonb END,
                greatest(g.top, EXCLUDED.top)) END;
$$;

-- enqueue: as version 7's, but the arrivals name each priority at which a group's items
-- became ready (or were raised), not only the highest, so that the group joins the turns of
-- each (see above).
CREATE OR REPLACE FUNCTION workqueue_enqueue(q integer, xs text[], grps text[], ps integer[],
    delays_us bigint[], limited boolean[], base_us bigint, max_us bigint, bucket_us bigint,
    burst integer, OUT kinds smallint[], OUT delays bigint[], OUT seqs bigint[],
    OUT flow_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(xs), 0);
    now_ timestamptz := clock_timestamp();
    ks bytea[];
    gs text[];
    order_ bigint[];
    dues timestamptz[];
    occ integer[];
    skip boolean[];
    rounds integer;
    wake boolean := false;
    queued bigint := 0;
    m integer;
    waits double precision[];
    start_us double precision := 0;
    shut boolean;
    flow_ boolean;
    -- The arrivals: per item that became ready or was raised, its group, priority, whether
    -- it became ready, and its place in the batch's order.
    ag text[] := '{}';
    ap integer[] := '{}';
    an integer[] := '{}';
    ao bigint[] := '{}';
    rg text[];
    rp integer[];
    rn integer[];
    ro bigint[];
    -- The longest wait the limiter gives (and the farthest the bucket's time goes): a
    -- thousand years, far inside PostgreSQL's timestamps.
    cap_us double precision := 1000 * 365.25 * 86400 * 1e6;
BEGIN
    kinds := array_fill(0::smallint, ARRAY[n]);
    delays := array_fill(0::bigint, ARRAY[n]);
    seqs := array_fill(0::bigint, ARRAY[n]);
    IF n = 0 THEN
        RETURN;
    END IF;
    -- The adding lock, shared, before the queue's row is read: turning flow control on waits
    -- for this add to end, and an add that starts after it reads the flag on. (An expression,
    -- not a statement: a statement only when it has to wait.)
    IF NOT pg_try_advisory_xact_lock_shared(2003920492, q) THEN
        PERFORM pg_advisory_xact_lock_shared(2003920492, q);
    END IF;
    SELECT s.shut_down, s.flow, s.flow_version INTO shut, flow_, flow_version
        FROM workqueue_queues s WHERE s.id = q;
    IF coalesce(shut, false) THEN
        RETURN;
    END IF;
    flow_ := coalesce(flow_, false);
    IF flow_ THEN
        gs := ARRAY(SELECT coalesce(grps[i], '') FROM generate_subscripts(xs, 1) AS i ORDER BY i);
    ELSE
        gs := grps;
    END IF;
    -- Whole arrays at a time: a statement per batch, not a PL/pgSQL step per item.
    ks := ARRAY(SELECT sha256(convert_to(x, 'UTF8'))
                FROM unnest(xs) WITH ORDINALITY AS u(x, i) ORDER BY i);
    IF delays_us IS NOT NULL THEN
        delays := ARRAY(SELECT greatest(coalesce(x, 0), 0)
                        FROM unnest(delays_us) WITH ORDINALITY AS u(x, i) ORDER BY i);
    END IF;
    -- An item already queued (or whose delay ran out: it is queued from its due time on),
    -- whose adds here raise no priority, is a duplicate that changes nothing: no lock, no
    -- write, and no getter ever finds its row locked. Its place is the row's own (the lease
    -- that takes it is handed out after it became ready).
    SELECT array_agg(f.seq IS NOT NULL ORDER BY a.i),
           array_agg(CASE WHEN f.seq IS NOT NULL THEN 2 ELSE 0 END::smallint ORDER BY a.i),
           array_agg(coalesce(abs(f.seq), 0) ORDER BY a.i)
        INTO skip, kinds, seqs
        FROM (SELECT u.k, u.i, max(u.p) OVER (PARTITION BY u.k) AS raise
              FROM unnest(ks, ps) WITH ORDINALITY AS u(k, p, i)) a
        -- A probe of the primary key per add, whatever the statistics say (the LIMIT keeps
        -- the lateral subquery a nested loop; with `key = ANY(ks)` a table last analyzed
        -- while the queue was small gets a scan of the whole queue).
        LEFT JOIN LATERAL (
            SELECT r.seq FROM workqueue_items r
            WHERE r.queue = q AND r.key = a.k
              AND (r.ready OR (r.token IS NULL AND r.due <= now_))
              AND coalesce(a.raise <= coalesce(r.priority, 0), true)
            LIMIT 1) f ON true;
    m := (SELECT count(*) FROM unnest(limited) AS l(x) WHERE l.x);
    IF m > 0 THEN
        -- 1. The item rows, in key order, before the failure rows and the bucket: an existing
        --    row is locked (ON CONFLICT locks the rows it finds, and WHERE false changes none),
        --    a new item's row is inserted as a placeholder (last_add = 0), which the rounds
        --    below turn into the row a plain insert would have made.
        INSERT INTO workqueue_items AS i (queue, key, item, grp, seq, last_add)
            SELECT q, u.k, u.x, u.g, 0, 0
            FROM (SELECT DISTINCT ON (e.k) e.k, e.x, e.g
                  FROM unnest(ks, xs, skip, gs) AS e(k, x, sk, g) WHERE NOT e.sk
                  ORDER BY e.k) u
            ORDER BY u.k
            ON CONFLICT (queue, key) DO UPDATE SET last_add = i.last_add WHERE false;
        -- 2. The failure rows, in key order: each rate-limited add counts one failure, and the
        --    n-th of an item in the batch waits its n-th backoff, as n adds one by one would.
        WITH lim AS (
            SELECT e.i, e.k, e.x,
                   row_number() OVER (PARTITION BY e.k ORDER BY e.i) AS nth,
                   count(*) OVER (PARTITION BY e.k) AS cnt
            FROM unnest(ks, xs, limited) WITH ORDINALITY AS e(k, x, l, i) WHERE e.l
        ), counted AS (
            INSERT INTO workqueue_failures AS f (queue, key, item, failures)
                SELECT q, c.k, c.x, c.cnt
                FROM (SELECT DISTINCT ON (l.k) l.k, l.x, l.cnt FROM lim l ORDER BY l.k) c
                ORDER BY c.k
                ON CONFLICT (queue, key) DO UPDATE SET failures = f.failures + EXCLUDED.failures
                RETURNING f.key, f.failures
        )
        SELECT array_agg(w.wait ORDER BY w.i) INTO waits
            FROM (SELECT g.i,
                         -- (least() skips NULLs: an add not rate-limited gets no wait.)
                         CASE WHEN l.i IS NOT NULL THEN
                             least(base_us::double precision * power(2::double precision,
                                       least(c.failures - l.cnt + l.nth - 1, 62)),
                                   max_us::double precision) END AS wait
                  FROM generate_subscripts(ks, 1) AS g(i)
                  LEFT JOIN lim l ON l.i = g.i
                  LEFT JOIN counted c ON c.key = l.k) w;
        -- 3. The queue's row last: the bucket is taken once for the batch, and the j-th
        --    rate-limited add in the batch's order gets the j-th interval.
        IF bucket_us > 0 THEN
            SELECT greatest(extract(epoch FROM (s.bucket_tat - now_)) * 1e6, 0)
                INTO start_us FROM workqueue_queues s WHERE s.id = q FOR NO KEY UPDATE;
            start_us := coalesce(start_us, 0);
            UPDATE workqueue_queues s SET bucket_tat = now_ + make_interval(secs =>
                    least(start_us + bucket_us::double precision * m, cap_us) / 1e6)
                WHERE s.id = q;
            SELECT array_agg(CASE WHEN w.wait IS NULL THEN NULL
                                  ELSE greatest(w.wait, least(start_us + bucket_us::double precision
                                                              * (w.j - burst), cap_us)) END
                             ORDER BY w.i)
                INTO waits
                FROM (SELECT u.i, u.wait,
                             count(u.wait) OVER (ORDER BY u.i) AS j
                      FROM unnest(waits) WITH ORDINALITY AS u(wait, i)) w;
        END IF;
        -- The shorter of the delay given and the limiter's.
        delays := ARRAY(
            SELECT CASE WHEN u.wait IS NULL THEN u.given
                        WHEN u.given > 0 THEN least(u.given, greatest(u.wait, 0)::bigint)
                        ELSE greatest(u.wait, 0)::bigint END
            FROM unnest(delays, waits) WITH ORDINALITY AS u(given, wait, i) ORDER BY u.i);
    END IF;
    -- The due times; the batch's order, a number per item in the batch's order; and the
    -- n-th add of the same item in the batch, which applies in round n.
    SELECT array_agg(CASE WHEN delays[i] > 0 THEN now_ + make_interval(secs => delays[i] / 1e6)
                     END ORDER BY i),
           array_agg(e.ord ORDER BY i),
           array_agg(e.nth ORDER BY i)
        INTO dues, order_, occ
        FROM (SELECT g.i, g.ord, row_number() OVER (PARTITION BY ks[g.i] ORDER BY g.i) AS nth
              -- The numbers are drawn below the window's sort (a subquery with a volatile
              -- function stays a subquery), so in the batch's order.
              FROM (SELECT i, nextval('workqueue_seq') AS ord
                    FROM generate_subscripts(ks, 1) AS i) g) e;
    rounds := coalesce((SELECT max(u.nth) FROM unnest(occ, skip) AS u(nth, sk)
                        WHERE NOT u.sk), 0);
    FOR r IN 1..rounds LOOP
        -- One statement per round, rows in key order: an insert, or on conflict the
        -- transition of the existing row (locked, in that order). A row not leased whose
        -- delay ran out counts as queued since its due time; a leased row whose pending
        -- delay ran out counts as re-added (dirty). A placeholder (last_add = 0) takes what
        -- the insert would have written. An item keeps the group it has.
        WITH applied AS (
            INSERT INTO workqueue_items AS i (queue, key, item, grp, ready, avail_at, seq,
                    priority, due, last_add)
            SELECT q, e.k, e.x, e.g, e.due IS NULL, CASE WHEN e.due IS NULL THEN now_ END,
                e.ord, e.p, e.due, CASE WHEN e.due IS NULL THEN 1 ELSE 4 END
            FROM unnest(ks, xs, dues, order_, ps, occ, skip, gs)
                AS e(k, x, due, ord, p, nth, sk, g)
            WHERE e.nth = r AND NOT e.sk
            ORDER BY e.k
            ON CONFLICT (queue, key) DO UPDATE SET
                ready = CASE WHEN i.last_add = 0 THEN EXCLUDED.ready
                    ELSE i.token IS NULL
                        AND (i.ready OR coalesce(i.due <= now_, false) OR EXCLUDED.due IS NULL)
                    END,
                due = CASE
                    WHEN i.last_add = 0 THEN EXCLUDED.due
                    WHEN i.token IS NULL AND (i.ready OR coalesce(i.due <= now_, false)) THEN NULL
                    WHEN i.token IS NOT NULL AND (i.dirty OR coalesce(i.due <= now_, false)) THEN NULL
                    WHEN EXCLUDED.due IS NULL THEN NULL
                    ELSE least(coalesce(i.due, EXCLUDED.due), EXCLUDED.due) END,
                dirty = i.last_add <> 0 AND i.token IS NOT NULL
                    AND (i.dirty OR coalesce(i.due <= now_, false) OR EXCLUDED.due IS NULL),
                priority = CASE
                    WHEN i.last_add = 0 THEN EXCLUDED.priority
                    WHEN i.token IS NOT NULL THEN
                        CASE WHEN EXCLUDED.priority IS NULL THEN i.priority
                             WHEN i.priority IS NULL THEN EXCLUDED.priority
                             ELSE greatest(i.priority, EXCLUDED.priority) END
                    ELSE greatest(coalesce(i.priority, 0),
                                  coalesce(EXCLUDED.priority, i.priority, 0)) END,
                avail_at = CASE
                    WHEN i.last_add = 0 THEN EXCLUDED.avail_at
                    WHEN i.token IS NOT NULL THEN NULL
                    WHEN i.ready OR coalesce(i.due <= now_, false) THEN
                        CASE WHEN EXCLUDED.priority > coalesce(i.priority, 0) THEN now_
                             WHEN i.ready THEN i.avail_at
                             ELSE i.due END
                    WHEN EXCLUDED.due IS NULL THEN now_
                    ELSE NULL END,
                seq = CASE
                    WHEN i.last_add = 0 THEN EXCLUDED.seq
                    WHEN i.token IS NULL AND (i.ready OR coalesce(i.due <= now_, false)) THEN
                        CASE WHEN EXCLUDED.priority > coalesce(i.priority, 0) THEN EXCLUDED.seq
                             ELSE i.seq END
                    WHEN i.token IS NULL AND EXCLUDED.due IS NULL THEN EXCLUDED.seq
                    ELSE i.seq END,
                last_add = CASE
                    WHEN i.last_add = 0 THEN EXCLUDED.last_add
                    WHEN i.token IS NOT NULL THEN
                        CASE WHEN i.dirty OR coalesce(i.due <= now_, false) THEN 2
                             WHEN EXCLUDED.due IS NULL THEN 3 ELSE 4 END
                    WHEN i.ready OR coalesce(i.due <= now_, false) THEN 2
                    WHEN EXCLUDED.due IS NULL THEN 1
                    ELSE 4 END,
                grp = CASE WHEN i.last_add = 0 THEN EXCLUDED.grp
                           ELSE coalesce(i.grp, EXCLUDED.grp) END
            -- A duplicate that changes nothing writes nothing (the row is still locked).
            WHERE i.last_add = 0
               OR (NOT (i.ready
                        AND NOT coalesce(EXCLUDED.priority > coalesce(i.priority, 0), false))
                   AND NOT (i.token IS NOT NULL AND i.dirty
                            AND NOT coalesce(EXCLUDED.priority > i.priority,
                                             EXCLUDED.priority IS NOT NULL)))
            RETURNING i.key, i.last_add, i.ready, i.grp, coalesce(i.priority, 0) AS p
        )
        SELECT array_agg(CASE WHEN e.nth = r AND NOT e.sk
                              THEN coalesce(a.last_add, 2::smallint) ELSE e.kind END
                         ORDER BY e.i),
               array_agg(a.grp) FILTER (WHERE flow_ AND a.ready),
               array_agg(a.p) FILTER (WHERE flow_ AND a.ready),
               array_agg((a.last_add = 1)::integer) FILTER (WHERE flow_ AND a.ready),
               array_agg(e.ord) FILTER (WHERE flow_ AND a.ready)
        INTO kinds, rg, rp, rn, ro
        FROM unnest(ks, occ, skip, kinds, order_) WITH ORDINALITY AS e(k, nth, sk, kind, ord, i)
        LEFT JOIN applied a ON a.key = e.k AND e.nth = r AND NOT e.sk;
        IF rg IS NOT NULL THEN
            ag := ag || rg;
            ap := ap || rp;
            an := an || rn;
            ao := ao || ro;
        END IF;
    END LOOP;
    -- Under flow control, the groups hear of their new ready items: an arrival per group and
    -- priority, numbered by its first item in the batch's order (where the group joins the
    -- turns of that priority, if it is not in them).
    IF cardinality(ag) > 0 THEN
        INSERT INTO workqueue_arrivals (queue, id, grp, priority, n)
            SELECT q, min(u.o), u.g, u.p, sum(u.n)::integer
            FROM unnest(ag, ap, an, ao) AS u(g, p, n, o)
            GROUP BY u.g, u.p;
    END IF;
    -- Taken once every row is locked and changed, one per add in the batch's order: a lease
    -- of one of these items with a larger token was handed out after its add.
    -- A queued or delayed item, or a duplicate that locked a queued row (a getter may have
    -- skipped it meanwhile), wakes getters when the transaction commits.
    SELECT array_agg(CASE WHEN skip[i] THEN seqs[i] ELSE nextval('workqueue_seq') END
                     ORDER BY i),
           coalesce(bool_or(NOT skip[i] AND kinds[i] IN (1, 2, 4)), false),
           count(*) FILTER (WHERE NOT skip[i] AND kinds[i] = 1)
        INTO seqs, wake, queued
        FROM generate_subscripts(ks, 1) AS i;
    IF wake THEN
        PERFORM workqueue_wake(q, queued);
    END IF;
END $$;

-- flow_get: as version 7's, but every hand-out counts in the queue too (lease_flow 3), the due
-- items are announced per group and priority, and a group whose highest ready priority goes
-- down takes its place in the turns there (`places`).
CREATE OR REPLACE FUNCTION workqueue_flow_get(q integer, n integer, lease_us bigint, sweep boolean,
    max_stalls integer, dead_cap integer, shut boolean, paused boolean, OUT kind integer,
    OUT items text[], OUT keys bytea[], OUT tokens bigint[], OUT priorities integer[],
    OUT wait_us bigint)
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
            avail_at = NULL, lease_flow = bits
            WHERE i.ctid = h.ctid
            RETURNING i.item, i.key, i.token, i.lease_priority INTO c;
        items := items || c.item;
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

-- flow_set: as version 7's, but turning flow control on or changing its settings counts the
-- leases out that are not counted yet (in their groups, those without one in the group '',
-- and in the queue), and the groups' places below their highest ready priority are forgotten
-- with the rest of their turns when flow control comes on or goes off.
CREATE OR REPLACE FUNCTION workqueue_flow_set(q integer, on_ boolean, grouped_ boolean,
    max_in_flight_ integer, group_max_in_flight_ integer, rate_ double precision,
    rate_burst_ integer, rate_us_ bigint, group_rate_ double precision,
    group_rate_burst_ integer, group_rate_us_ bigint, names text[], limits integer[],
    weights integer[], rates double precision[], rate_bursts integer[], rates_us bigint[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    was_on boolean;
    v bigint;
    a record;
    tids tid[] := '{}';
    grps text[];
    bits smallint[];
BEGIN
    SELECT s.flow INTO was_on FROM workqueue_queues s WHERE s.id = q;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF on_ AND NOT was_on THEN
        PERFORM pg_advisory_xact_lock(2003920492, q);
        UPDATE workqueue_items i SET grp = '' WHERE i.ctid = ANY(ARRAY(
            SELECT u.ctid FROM workqueue_items u WHERE u.queue = q AND u.grp IS NULL
            ORDER BY u.key FOR UPDATE));
    END IF;
    IF on_ THEN
        -- Every lease counts in its group and in the queue: those handed out before flow
        -- control came on (or, by version 7, without a queue-wide limit) are counted now,
        -- their rows locked in key order, before the queue's row (the lock order).
        SELECT coalesce(array_agg(l.ctid), '{}'), array_agg(l.grp), array_agg(l.lease_flow)
            INTO tids, grps, bits
            FROM (SELECT u.ctid, coalesce(u.grp, '') AS grp, u.lease_flow
                  FROM workqueue_items u
                  WHERE u.queue = q AND u.token IS NOT NULL AND u.lease_flow <> 3
                  ORDER BY u.key FOR UPDATE) l;
        IF cardinality(tids) > 0 THEN
            UPDATE workqueue_items i SET lease_flow = 3, grp = coalesce(i.grp, '')
                WHERE i.ctid = ANY(tids);
        END IF;
    END IF;
    UPDATE workqueue_queues s SET flow = on_, flow_version = s.flow_version + 1
        WHERE s.id = q RETURNING s.flow_version INTO v;
    INSERT INTO workqueue_flow AS f (queue, grouped, max_in_flight, group_max_in_flight, rate,
            rate_burst, rate_us, group_rate, group_rate_burst, group_rate_us)
        VALUES (q, grouped_, max_in_flight_, group_max_in_flight_, rate_, rate_burst_, rate_us_,
                group_rate_, group_rate_burst_, group_rate_us_)
        ON CONFLICT (queue) DO UPDATE SET grouped = EXCLUDED.grouped,
            max_in_flight = EXCLUDED.max_in_flight,
            group_max_in_flight = EXCLUDED.group_max_in_flight, rate = EXCLUDED.rate,
            rate_burst = EXCLUDED.rate_burst, rate_us = EXCLUDED.rate_us,
            group_rate = EXCLUDED.group_rate, group_rate_burst = EXCLUDED.group_rate_burst,
            group_rate_us = EXCLUDED.group_rate_us;
    DELETE FROM workqueue_group_settings s WHERE s.queue = q;
    INSERT INTO workqueue_group_settings (queue, name, max_in_flight, weight, rate, rate_burst,
            rate_us)
        SELECT q, u.name, u.lim, u.weight, u.rate, u.burst, u.us
        FROM unnest(names, limits, weights, rates, rate_bursts, rates_us)
            AS u(name, lim, weight, rate, burst, us)
        WHERE u.name IS NOT NULL;
    IF on_ THEN
        IF cardinality(tids) > 0 THEN
            UPDATE workqueue_flow f
                SET in_flight = f.in_flight
                                + (SELECT count(*) FROM unnest(bits) AS b(x) WHERE (b.x & 2) = 0)
                WHERE f.queue = q;
            INSERT INTO workqueue_groups AS g (queue, name, in_flight)
                SELECT q, u.g, count(*)::integer
                FROM unnest(grps, bits) AS u(g, b) WHERE (u.b & 1) = 0
                GROUP BY u.g ORDER BY u.g
                ON CONFLICT (queue, name) DO UPDATE SET in_flight = g.in_flight + EXCLUDED.in_flight;
        END IF;
        IF NOT was_on THEN
            DELETE FROM workqueue_arrivals x WHERE x.queue = q;
            UPDATE workqueue_groups g SET ready = 0, top = NULL, parked_until = NULL, credit = 0,
                places = NULL
                WHERE g.queue = q;
            SELECT array_agg(z.grp ORDER BY z.first) AS names, array_agg(z.k ORDER BY z.first) AS ns,
                   array_agg(z.p ORDER BY z.first) AS tops,
                   array_agg(nextval('workqueue_seq') ORDER BY z.first) AS turns
                INTO a
                FROM (SELECT i.grp, coalesce(i.priority, 0) AS p, count(*)::integer AS k,
                             min(i.avail_at) AS first
                      FROM workqueue_items i WHERE i.queue = q AND i.ready
                      GROUP BY i.grp, coalesce(i.priority, 0)) z;
            IF a.names IS NOT NULL THEN
                PERFORM workqueue_groups_join(q, a.names, a.ns, a.tops, a.turns);
            END IF;
        END IF;
        WITH settings AS (
            SELECT g.name, coalesce(s.max_in_flight, f.group_max_in_flight) AS lim,
                   greatest(coalesce(s.weight, 1), 1) AS weight,
                   coalesce(s.rate_us, f.group_rate_us) AS rate_us,
                   CASE WHEN s.rate_us IS NOT NULL THEN s.rate_burst
                        ELSE f.group_rate_burst END AS burst
            FROM workqueue_groups g
            JOIN workqueue_flow f ON f.queue = g.queue
            LEFT JOIN workqueue_group_settings s ON s.queue = g.queue AND s.name = g.name
            WHERE g.queue = q
        )
        UPDATE workqueue_groups g SET lim = s.lim, weight = s.weight, rate_us = s.rate_us,
            burst = s.burst,
            parked_until = CASE WHEN s.rate_us IS NULL THEN NULL ELSE g.parked_until END,
            turn = CASE WHEN g.saturated AND NOT (s.lim IS NOT NULL AND g.in_flight >= s.lim)
                        THEN nextval('workqueue_seq') ELSE g.turn END,
            credit = 0
            FROM settings s
            WHERE g.queue = q AND g.name = s.name;
    ELSE
        DELETE FROM workqueue_arrivals x WHERE x.queue = q;
        DELETE FROM workqueue_groups g WHERE g.queue = q AND g.in_flight <= 0;
        UPDATE workqueue_groups g SET ready = 0, top = NULL, parked_until = NULL, credit = 0,
            places = NULL
            WHERE g.queue = q;
    END IF;
    PERFORM workqueue_wake(q, 256);
    RETURN v;
END $$;

-- flow_clear(queue): turns flow control off for every process (PgQueue::clear_flow_control),
-- as workqueue_flow_set does with no settings: the settings go, the groups with no counted
-- lease are forgotten, the ready items are handed out in the queue's order again (each item
-- keeps its group in its row), and the leases out give their slots back as they end. Returns
-- whether the queue had flow control. The queue's row is locked first: two calls at once
-- answer true once.
CREATE FUNCTION workqueue_flow_clear(q integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was_on boolean;
BEGIN
    SELECT s.flow INTO was_on FROM workqueue_queues s WHERE s.id = q FOR NO KEY UPDATE;
    IF NOT coalesce(was_on, false) THEN
        RETURN false;
    END IF;
    PERFORM workqueue_flow_set(q, false, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                               '{}', '{}', '{}', '{}', '{}', '{}');
    RETURN true;
END $$;

-- Every function replaced or added runs as version 7's do: with the search_path of its schema,
-- without sequential scans and without JIT compilation (see version 7); the hand-out's ordered
-- reads take their order from their indexes, and its statements are planned once per
-- connection.
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
ALTER FUNCTION workqueue_flow_get(integer, integer, bigint, boolean, integer, integer, boolean,
    boolean) SET enable_sort = off SET plan_cache_mode = force_generic_plan;
