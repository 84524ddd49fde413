-- workqueue-postgres, schema version 7: flow control (workq::flow). Groups of items take turns
-- within a priority, in-flight limits hold across every process, and hand-out rates run on
-- the server's clock. A queue without flow control runs the statements it ran before, at the
-- same cost: each function reads one flag of the queue's row, which it read already, and a
-- queue without it takes none of the paths below.
--
-- THE DATA. An item's group is a column of its row (`grp`): the adding process runs the group
-- function and sends the name with the add. Under flow control every item has one (an add
-- without a group puts its item in the group ''). Then:
--
-- - workqueue_flow, one row per queue: the limits and rates that every process applies (the
--   last process built writes them, workqueue_flow_set), the leases counted against the
--   queue-wide limit, and the queue-wide hand-out bucket (GCRA: its theoretical arrival time).
--   Its row is also the queue's flow lock: a statement that locks group rows holds it first,
--   so that group rows are only ever locked by one statement at a time.
-- - workqueue_group_settings: the per-group overrides (limit, weight, rate) as given.
-- - workqueue_groups, one row per group that holds something (a ready item, a lease, a bucket
--   still refilling): its ready items (a count), its highest priority with a ready item
--   (`top`), its leases out, its limit, weight and rate (copied from the settings), its place
--   in the turns (`turn`, smaller first, drawn from workqueue_seq), the turns left in its
--   current visit (`credit`, deficit round robin), its bucket, and the time it waits until for
--   a token (`parked_until`). A group that holds nothing is forgotten (when its last lease ends,
--   or by a sweep once its bucket is full), so a queue that sees millions of groups over its
--   life keeps only the live ones.
-- - workqueue_arrivals: what the adds announce to the groups (a group's new ready items and
--   their highest priority). An add never locks a group row (it may run in a caller's long
--   transaction): it inserts an arrival, which the next get folds into the groups.
--
-- THE INDEXES. The next group to hand out is the first entry of workqueue_groups_turns: the
-- groups that may hand out now (ready work, not at their limit, not waiting for a token),
-- ordered by their highest ready priority, then by turn. A group leaves it when it saturates,
-- runs out of tokens (then it is parked, found again through workqueue_groups_parked when its
-- token is due) or out of ready items, and joins it again at the back. A get never reads the
-- groups it does not hand out from. Inside a group, workqueue_items_lanes gives its items in
-- the ready order (highest priority, then the moment they became ready). workqueue_groups_idle
-- finds the groups that hold nothing for the sweep. All are partial: a queue without flow
-- control has no row in any.
--
-- A HAND-OUT (workqueue_flow_get, from workqueue_get when the queue's `flow` flag is on): the
-- queue's flow row, locked (one flow get at a time per queue); expired leases taken back;
-- arrivals folded in; due items promoted into their groups; groups whose token is due
-- unparked; then per item: the queue-wide limit and token, the first group of the turns, its
-- token (or it is parked), its oldest ready item at its top priority (FOR UPDATE SKIP LOCKED),
-- the lease, and the group's new state (leases, top, credit, turn, bucket). A lease records
-- what it counted (`lease_flow`: 1 its group's leases, 2 the queue's), and its end
-- (workqueue_flow_ended: done, release, reclaim, dead letter) gives exactly that back, whatever
-- process holds it and whatever the settings are by then; a group or queue that had no free
-- slot and has one now wakes a getter (NOTIFY). A getter held back by a token sleeps until it
-- is due (wait_us).
--
-- THE LOCK ORDER, extended. A statement of the queue that waits for locks takes them in this
-- order:
--
--   0. the queue's adding lock (an advisory lock, key (2003920492, queue id)): shared by every
--      add until its transaction ends, exclusive for the change that turns flow control on;
--   1. rows of workqueue_items, in key order;
--   2. rows of workqueue_failures, in key order;
--   3. the queue's row of workqueue_queues;
--   4. the queue's row of workqueue_flow;
--   5. rows of workqueue_groups (in any order: only the holder of the flow row locks them).
--
-- A flow get locks the flow row first and then takes item rows only without waiting (SKIP
-- LOCKED), as every get does. A step (and workqueue_done_get) locks all its items before the
-- dones that change groups, which then take the flow row.

ALTER TABLE workqueue_queues
    -- Flow control is on: gets go through workqueue_flow_get, adds announce arrivals.
    ADD COLUMN flow boolean NOT NULL DEFAULT false,
    -- Bumped by every change of the flow settings: a process that sees another number than
    -- the one it wrote or read compares the settings with its own, and warns once.
    ADD COLUMN flow_version bigint NOT NULL DEFAULT 0;

ALTER TABLE workqueue_items
    -- The item's group, as the adding process's group function gave it.
    ADD COLUMN grp text,
    -- What the current lease counted: 1 its group's leases, 2 the queue's (0: nothing).
    ADD COLUMN lease_flow smallint NOT NULL DEFAULT 0;

-- A dead letter keeps its item's group, for when it is queued again.
ALTER TABLE workqueue_dead ADD COLUMN grp text;

-- Each group's ready items in the ready order.
CREATE INDEX workqueue_items_lanes
    ON workqueue_items (queue, grp, (coalesce(priority, 0)) DESC, avail_at, seq)
    WHERE ready AND grp IS NOT NULL;

-- A queue's flow settings, its leases counted against max_in_flight, and its hand-out bucket.
CREATE TABLE workqueue_flow (
    queue integer PRIMARY KEY,
    -- The processes group the items (a group function was given).
    grouped boolean NOT NULL DEFAULT false,
    max_in_flight integer,
    group_max_in_flight integer,
    -- The queue-wide hand-out rate: per second (as given), burst, and the interval in µs.
    rate double precision,
    rate_burst integer,
    rate_us bigint,
    -- Every group's rate unless workqueue_group_settings names it.
    group_rate double precision,
    group_rate_burst integer,
    group_rate_us bigint,
    -- Leases that count against max_in_flight (lease_flow & 2).
    in_flight integer NOT NULL DEFAULT 0,
    -- The queue-wide bucket's theoretical arrival time.
    tat timestamptz NOT NULL DEFAULT 'epoch'
) WITH (fillfactor = 50);

-- The groups named in the settings, with what they override (NULL: the default).
CREATE TABLE workqueue_group_settings (
    queue integer NOT NULL,
    name text NOT NULL,
    max_in_flight integer,
    weight integer,
    rate double precision,
    rate_burst integer,
    rate_us bigint,
    PRIMARY KEY (queue, name)
);

-- The groups that hold something (see above). Rows change at every hand-out, so pages keep
-- room for new versions and vacuum comes early.
CREATE TABLE workqueue_groups (
    queue integer NOT NULL,
    name text NOT NULL,
    -- Its ready items (as far as the arrivals folded in tell; corrected whenever a get finds
    -- its lane empty).
    ready integer NOT NULL DEFAULT 0,
    -- Its highest priority with a ready item; NULL: none.
    top integer,
    -- Its leases that count against its limit (lease_flow & 1).
    in_flight integer NOT NULL DEFAULT 0,
    -- Its limit, weight, rate (interval in µs) and burst, from the settings.
    lim integer,
    weight integer NOT NULL DEFAULT 1,
    rate_us bigint,
    burst integer,
    -- Turns left in its current visit (deficit round robin); 0: a new visit.
    credit integer NOT NULL DEFAULT 0,
    -- Its place in the turns: smaller first.
    turn bigint NOT NULL DEFAULT 0,
    -- Its bucket's theoretical arrival time.
    tat timestamptz NOT NULL DEFAULT 'epoch',
    -- Waiting for its next token until then.
    parked_until timestamptz,
    saturated boolean GENERATED ALWAYS AS (lim IS NOT NULL AND in_flight >= lim) STORED,
    idle boolean GENERATED ALWAYS AS (top IS NULL AND in_flight <= 0 AND parked_until IS NULL)
        STORED,
    PRIMARY KEY (queue, name)
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);

-- The turns: the groups that may hand out now, highest ready priority first, then by turn.
CREATE INDEX workqueue_groups_turns ON workqueue_groups (queue, top DESC, turn)
    WHERE top IS NOT NULL AND parked_until IS NULL AND NOT saturated;
-- The groups waiting for a token, by the time it is due.
CREATE INDEX workqueue_groups_parked ON workqueue_groups (queue, parked_until)
    WHERE parked_until IS NOT NULL;
-- The groups that hold nothing, by the time their bucket is full.
CREATE INDEX workqueue_groups_idle ON workqueue_groups (queue, tat) WHERE idle;

-- What the adds announce to the groups, in the order of the adds.
CREATE TABLE workqueue_arrivals (
    queue integer NOT NULL,
    -- The first of the add's items in the queue's order: where a new group joins the turns.
    id bigint NOT NULL,
    grp text NOT NULL,
    -- The highest priority of the group's items that became ready (or were raised).
    priority integer NOT NULL,
    -- How many of them became ready.
    n integer NOT NULL,
    PRIMARY KEY (queue, id)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- When a bucket whose theoretical arrival time is `tat` has a token (GCRA: `burst` tokens of
-- `rate_us` µs each fit before it).
CREATE FUNCTION workqueue_token_at(tat timestamptz, rate_us bigint, burst integer)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN tat - make_interval(secs => least((greatest(burst, 1) - 1)::double precision * rate_us,
                                         1000 * 365.25 * 86400 * 1e6) / 1e6);

-- The bucket's theoretical arrival time once a token is taken at `now_`.
CREATE FUNCTION workqueue_token_take(tat timestamptz, rate_us bigint, now_ timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN greatest(tat, now_) + make_interval(secs => least(rate_us::double precision,
                                                          100 * 365.25 * 86400 * 1e6) / 1e6);

-- Work became ready in the groups `names` of queue `q`: `ns` items each (added to the group's
-- count), at priorities up to `tops`. A group that had no ready item, or none so high, joins
-- the turns at `turns` (smaller first) with a new visit; a group the queue does not keep yet
-- is made with its settings. The caller holds the queue's flow row.
CREATE FUNCTION workqueue_groups_join(q integer, names text[], ns integer[], tops integer[],
    turns bigint[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO workqueue_groups AS g (queue, name, ready, top, turn, lim, weight, rate_us, burst)
    SELECT q, a.name, a.n, a.top, a.turn,
           coalesce(s.max_in_flight, f.group_max_in_flight),
           greatest(coalesce(s.weight, 1), 1),
           coalesce(s.rate_us, f.group_rate_us),
           CASE WHEN s.rate_us IS NOT NULL THEN s.rate_burst ELSE f.group_rate_burst END
    FROM (SELECT u.name, sum(u.n)::integer AS n, max(u.top) AS top, min(u.turn) AS turn
          FROM unnest(names, ns, tops, turns) AS u(name, n, top, turn)
          GROUP BY u.name) a
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
        credit = CASE WHEN g.top IS NULL OR EXCLUDED.top > g.top THEN 0 ELSE g.credit END;
$$;

-- Leases of queue `q` ended (done, released, taken back, buried): per lease its item's group
-- (`grps`), what its hand-out counted (`bits`: 1 its group's leases, 2 the queue's), and its
-- priority if the item is ready again (`prios`; NULL: it is not). Gives the counted slots
-- back, wakes a getter for each group, and for the queue, that had no free slot and has one
-- now, puts the items ready again into their groups' turns (under flow control), and forgets
-- the groups that hold nothing and whose bucket is full. Takes the queue's flow row first,
-- then the group rows (the lock order); does nothing without a counted lease or flow control.
CREATE FUNCTION workqueue_flow_ended(q integer, grps text[], bits smallint[], prios integer[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    flow_ boolean;
    queue_n integer;
    freed integer := 0;
    again boolean;
    now_ timestamptz := clock_timestamp();
    d record;
    r record;
BEGIN
    SELECT s.flow INTO flow_ FROM workqueue_queues s WHERE s.id = q;
    flow_ := coalesce(flow_, false);
    IF NOT flow_ AND NOT EXISTS (SELECT 1 FROM unnest(bits) AS b(x) WHERE b.x <> 0) THEN
        RETURN;
    END IF;
    queue_n := (SELECT count(*) FROM unnest(bits) AS b(x) WHERE (b.x & 2) <> 0);
    IF queue_n > 0 THEN
        UPDATE workqueue_flow f SET in_flight = greatest(f.in_flight - queue_n, 0)
            WHERE f.queue = q
            RETURNING (f.max_in_flight IS NOT NULL AND f.in_flight < f.max_in_flight
                       AND f.in_flight + queue_n >= f.max_in_flight)::integer
            INTO freed;
        freed := coalesce(freed, 0);
    ELSE
        PERFORM 1 FROM workqueue_flow f WHERE f.queue = q FOR NO KEY UPDATE;
    END IF;
    -- The groups' slots back, a group row at a time (by its key: most often one). A group
    -- at its limit that has a free slot now goes to the back of the turns.
    FOR d IN SELECT u.g AS name, count(*)::integer AS n
             FROM unnest(grps, bits) AS u(g, b)
             WHERE (u.b & 1) <> 0 AND u.g IS NOT NULL
             GROUP BY u.g LOOP
        UPDATE workqueue_groups g SET
            in_flight = greatest(g.in_flight - d.n, 0),
            turn = CASE WHEN g.saturated AND g.in_flight - d.n < g.lim
                        THEN nextval('workqueue_seq') ELSE g.turn END,
            credit = CASE WHEN g.saturated THEN 0 ELSE g.credit END
            WHERE g.queue = q AND g.name = d.name
            RETURNING g.top IS NOT NULL AND g.lim IS NOT NULL AND g.in_flight < g.lim
                      AND g.in_flight + d.n >= g.lim
            INTO again;
        IF again THEN
            freed := freed + 1;
        END IF;
        -- A group that holds nothing, its bucket full: forgotten.
        DELETE FROM workqueue_groups g
            WHERE g.queue = q AND g.name = d.name AND g.idle AND g.tat <= now_;
    END LOOP;
    IF flow_ THEN
        SELECT array_agg(coalesce(u.g, '')) AS names, array_agg(1) AS ns,
               array_agg(u.p) AS tops, array_agg(nextval('workqueue_seq')) AS turns
            INTO r
            FROM unnest(grps, prios) AS u(g, p) WHERE u.p IS NOT NULL;
        IF r.names IS NOT NULL THEN
            PERFORM workqueue_groups_join(q, r.names, r.ns, r.tops, r.turns);
        END IF;
    END IF;
    IF freed > 0 THEN
        PERFORM workqueue_wake(q, freed);
    END IF;
END $$;

-- enqueue(queue, items, their groups, priorities, delays in microseconds, rate limited?, the
-- rate limiter): workqueue_add with each item's group (NULL: none given), and the queue's
-- flow settings version (NULL when nothing was added). Under flow control an item without a
-- group is in the group '', and the items that became ready (or were raised) are announced to
-- their groups (workqueue_arrivals), without a lock on any group row. Every add holds the
-- queue's adding lock, shared, until its transaction ends (see the lock order).
--
-- add(queue, items, priorities, delays in microseconds, rate limited?, the rate limiter):
-- client-go's Add / AddAfter / AddRateLimited with priorities, for a batch of items in one
-- statement, with exactly the rules of adding them one by one in order. NULL priority: none
-- given. Returns, per item, what the add did (0 ignored: the queue is shut down, 1 queued,
-- 2 duplicate, 3 deferred: leased, queued again after done, 4 delayed), the delay it got,
-- and its place in the queue's order: a lease of the item whose token is larger covers the
-- add (it was handed out after the add took effect).
--
-- The rate limiter: a rate-limited add counts a failure of its item and waits the longer of
-- its item's backoff (base * 2^(failures - 1), capped at max) and the queue's token bucket
-- (GCRA: each rate-limited add takes one interval of `bucket_us`; up to `burst` go at once),
-- or the shorter of that and the delay given. Within a batch the bucket is spent in the
-- batch's order, as adds one by one would spend it.
CREATE FUNCTION workqueue_enqueue(q integer, xs text[], grps text[], ps integer[],
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
    -- Under flow control, the groups hear of their new ready items: an arrival per group,
    -- numbered by its first item in the batch's order (where a new group joins the turns).
    IF cardinality(ag) > 0 THEN
        INSERT INTO workqueue_arrivals (queue, id, grp, priority, n)
            SELECT q, min(u.o), u.g, max(u.p), sum(u.n)::integer
            FROM unnest(ag, ap, an, ao) AS u(g, p, n, o)
            GROUP BY u.g;
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

-- add(queue, items, priorities, delays, rate limited?, the rate limiter): workqueue_enqueue
-- without groups, for the processes of versions 3 to 6 (under flow control their items are in
-- the group '').
CREATE OR REPLACE FUNCTION workqueue_add(q integer, xs text[], ps integer[],
    delays_us bigint[], limited boolean[], base_us bigint, max_us bigint, bucket_us bigint,
    burst integer, OUT kinds smallint[], OUT delays bigint[], OUT seqs bigint[])
LANGUAGE sql AS $$
    SELECT e.kinds, e.delays, e.seqs
    FROM workqueue_enqueue(q, xs, NULL, ps, delays_us, limited, base_us, max_us, bucket_us,
                           burst) e;
$$;

-- Moves an item's row to the dead letters (its expired leases counted with `more_stalls`
-- more), keeping at most `cap` (0: no cap) per queue. It waits for no lock beyond the item's
-- row and its failure row: the letters over the cap (and the queue's row, which counts them)
-- are dropped only if nobody holds them, else by a later bury. The letter keeps the item's
-- group; the slots its lease counted are given back (workqueue_flow_ended).
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
BEGIN
    DELETE FROM workqueue_items WHERE queue = q AND key = k
        RETURNING item, stalls, grp, lease_flow INTO x, n_stalls, g, b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM workqueue_failures WHERE queue = q AND key = k RETURNING failures
        INTO n_failures;
    INSERT INTO workqueue_dead (queue, item, reason, stalls, failures, grp)
        VALUES (q, x, why, n_stalls + more_stalls, coalesce(n_failures, 0), g);
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

-- Takes back the expired leases of queue `q` (their holders died or stalled): each item is
-- queued again at the tail (its re-adds fold into that hand-out), or moved to the dead
-- letters once its leases expired `max_stalls` times in a row. Waits for no lock: rows
-- someone holds are skipped, and so is an item to bury whose failure row someone holds (the
-- next sweep takes it). The slots the leases counted are given back, and under flow control
-- the items join their groups' turns (workqueue_flow_ended). Returns how many items were
-- queued again.
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
                avail_at = now_, seq = nextval('workqueue_seq')
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

-- done(queue, key, token, release, forget): client-go's Done (or a release: handed out again
-- at once, at the head), fenced by the lease's token; with `forget`, the item's failures are
-- forgotten too (client-go's Forget after a success), only if the done is accepted. Returns
-- 1 when done (or released), 2 when done and queued again (re-added while leased), 0 when
-- another lease holds the item now, -1 when none does. A refused call changes nothing. The
-- slots the lease counted are given back, and under flow control an item queued again joins
-- its group's turns (workqueue_flow_ended, after the item's and failure's rows).
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
            avail_at = '-infinity', seq = -nextval('workqueue_seq')
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
            seq = nextval('workqueue_seq')
            WHERE i.queue = q AND i.key = k
            RETURNING i.priority INTO p;
        IF r.grp IS NOT NULL OR r.lease_flow <> 0 THEN
            PERFORM workqueue_flow_ended(q, ARRAY[r.grp], ARRAY[r.lease_flow], ARRAY[p]);
        END IF;
        PERFORM workqueue_wake(q, 1);
        RETURN 2;
    ELSIF r.due IS NOT NULL THEN
        UPDATE workqueue_items i SET token = NULL, lease_until = NULL, leased_at = NULL,
            dirty = false, stalls = 0, priority = coalesce(i.priority, 0), lease_flow = 0
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

-- get(queue, at most n items, lease in microseconds, sweep expired leases first?, max stalls,
-- dead-letter cap): hands out up to n ready items, each under a new lease, in the queue's
-- order. kind 1: leased (the arrays, in hand-out order); 2: shut down (or paused and shut
-- down) and nothing ready; 3: paused; 0: nothing ready. With kind 0, `wait_us` is the time
-- until the next delayed item is due; NULL when there is none, or when ready or due rows
-- exist that someone else holds (their holder's commit wakes the getters). Under flow control
-- (the queue's `flow` flag) it is workqueue_flow_get's hand-out.
CREATE OR REPLACE FUNCTION workqueue_get(q integer, n integer, lease_us bigint, sweep boolean,
    max_stalls integer, dead_cap integer, OUT kind integer, OUT items text[], OUT keys bytea[],
    OUT tokens bigint[], OUT priorities integer[], OUT wait_us bigint)
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
        SELECT * INTO kind, items, keys, tokens, priorities, wait_us
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
            avail_at = NULL
            WHERE i.ctid = ANY(tids)
            RETURNING i.item, i.key, i.token, i.lease_priority,
                array_position(taken, i.key) AS o
    )
    SELECT array_agg(l.item ORDER BY l.o), array_agg(l.key ORDER BY l.o),
           array_agg(l.token ORDER BY l.o), array_agg(l.lease_priority ORDER BY l.o)
        INTO items, keys, tokens, priorities FROM leased l;
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

-- flow_get(workqueue_get's arguments, then the queue's shut down and pause as workqueue_get
-- read them): workqueue_get under flow control, with its answers. Holds the queue's flow row
-- to its end (one flow get at a time per queue): takes back expired leases (and forgets idle
-- groups) when asked, folds in the arrivals, promotes the due items into their groups,
-- unparks the groups whose token is due, then hands out up to n items, one at a time: the
-- queue-wide limit and token, the first group of the turns (workqueue_groups_turns), its
-- token (else it is parked until its next one and the turns go on), its oldest ready item at
-- its highest priority, the lease (counting it in its group and, with a queue-wide limit, in
-- the queue), and the group's new place: its next highest priority, the turn it keeps while
-- its weight lasts, or the back of the turns. With nothing handed out, `wait_us` is the time
-- until the next token (the queue's, or the first parked group's) or delayed item, unless
-- the queue-wide limit holds everything back (a done wakes the getters then).
CREATE FUNCTION workqueue_flow_get(q integer, n integer, lease_us bigint, sweep boolean,
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
                   array_agg(z.top ORDER BY z.first) AS tops,
                   array_agg(nextval('workqueue_seq') ORDER BY z.first) AS turns,
                   coalesce(sum(z.k), 0)::integer AS k
                INTO a
                FROM (SELECT d2.grp, count(*)::integer AS k, max(d2.p) AS top, min(d2.at) AS first
                      FROM due_rows d2 GROUP BY d2.grp) z;
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
                UPDATE workqueue_groups t SET top = NULL, ready = 0, credit = 0
                    WHERE t.queue = q AND t.name = g.name;
            END IF;
            CONTINUE;
        END IF;
        IF h.p < g.top THEN
            -- Its items at its top priority are gone (taken out by an operator): it goes
            -- where its next item is.
            UPDATE workqueue_groups t SET top = h.p, credit = 0
                WHERE t.queue = q AND t.name = g.name;
            CONTINUE;
        END IF;
        bits := CASE WHEN fl.max_in_flight IS NOT NULL THEN 3 ELSE 1 END;
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
        -- to the back. A group that leaves the turns (no more items at this priority, at its
        -- limit) ends its visit.
        credit_ := CASE WHEN g.credit <= 0 THEN g.weight ELSE g.credit END - 1;
        UPDATE workqueue_groups t SET
            in_flight = t.in_flight + 1,
            ready = CASE WHEN next_top IS NULL THEN 0 ELSE greatest(t.ready - 1, 1) END,
            top = next_top,
            credit = CASE WHEN next_top IS DISTINCT FROM t.top
                               OR (t.lim IS NOT NULL AND t.in_flight + 1 >= t.lim) THEN 0
                          ELSE credit_ END,
            turn = CASE WHEN credit_ <= 0 AND next_top = t.top THEN nextval('workqueue_seq')
                        ELSE t.turn END,
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

-- done_get(queue, keys, tokens, forgets, then workqueue_get's arguments): workqueue_done of
-- every lease (rows in key order), then, unless every done was refused, workqueue_get. One
-- statement: one round trip and one commit for a worker's step from its items to the next.
-- `done` has workqueue_done's answer per lease; the rest is workqueue_get's (kind 0 with no
-- items when every done was refused or n is 0). The dones that change flow control's figures
-- come after every item row is locked (they take the flow row: the lock order).
CREATE OR REPLACE FUNCTION workqueue_done_get(q integer, ks bytea[], toks bigint[],
    forgets boolean[], n integer, lease_us bigint, sweep boolean, max_stalls integer,
    dead_cap integer, OUT done integer[], OUT kind integer, OUT items text[], OUT keys bytea[],
    OUT tokens bigint[], OUT priorities integer[], OUT wait_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
    o integer;
    g record;
    now_ timestamptz;
    r record;
    plain tid[] := '{}';
    flowing integer[] := '{}';
BEGIN
    done := array_fill(0, ARRAY[coalesce(cardinality(ks), 0)]);
    kind := 0;
    -- Every row locked in key order (a fixed lock order: no deadlock with a batch of adds).
    -- The common case, a lease whose item was neither re-added nor delayed meanwhile, is
    -- done here: its row goes in one DELETE below. The others take workqueue_done's path
    -- (a function call per lease costs more than the statements it runs).
    FOR o IN SELECT i FROM generate_subscripts(ks, 1) AS i ORDER BY ks[i] LOOP
        SELECT i.ctid, i.token, i.dirty, i.due, i.grp, i.lease_flow INTO r
            FROM workqueue_items i WHERE i.queue = q AND i.key = ks[o] FOR UPDATE;
        IF NOT FOUND OR r.token IS NULL THEN
            done[o] := -1;
        ELSIF r.token <> toks[o] THEN
            done[o] := 0;
        ELSIF r.lease_flow <> 0 OR (r.grp IS NOT NULL AND (r.dirty OR r.due IS NOT NULL)) THEN
            flowing := flowing || o;
        ELSIF r.dirty OR r.due IS NOT NULL THEN
            done[o] := workqueue_done(q, ks[o], toks[o], false, coalesce(forgets[o], false));
        ELSE
            IF coalesce(forgets[o], false) THEN
                DELETE FROM workqueue_failures f WHERE f.queue = q AND f.key = ks[o];
            END IF;
            plain := plain || r.ctid;
            done[o] := 1;
        END IF;
    END LOOP;
    IF cardinality(plain) > 0 THEN
        DELETE FROM workqueue_items i WHERE i.ctid = ANY(plain);
    END IF;
    FOREACH o IN ARRAY flowing LOOP
        done[o] := workqueue_done(q, ks[o], toks[o], false, coalesce(forgets[o], false));
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
                  AND NOT EXISTS (SELECT 1 FROM unnest(done) AS d WHERE d IN (1, 2))) THEN
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

-- step(queue, keys, tokens, forgets, then workqueue_get's arguments): a worker's step, as
-- workqueue_done_get, that waits for no row: each item row is taken without waiting, or after
-- waiting at most workqueue.step_wait (20 ms unless set, or the session's lock_timeout if
-- shorter) for a row another transaction holds; a row still held is left out, its done 3
-- while its lease runs (the caller settles it on its own), 4 once it has expired. The dones
-- that change flow control's figures come after every item row is locked (they take the
-- queue's flow row, then group rows).
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
END $$;

-- retry_done(queue, key, token, forget, then one add's priority, delay, rate limited? and
-- the rate limiter): a failed item's step. Fenced by the lease's token: if the lease is no
-- longer the caller's, nothing changes (no failure counted, nothing forgotten or re-added)
-- and the answer is 0 (another lease holds the item) or -1 (none does). Otherwise the item's
-- failures are forgotten if asked, the item is added as workqueue_add would add it (while
-- leased, so queued again once done, or when its delay is due; in the group it has), and the
-- lease is done: workqueue_done's answer, 1 or 2, with the delay the add gave. 3: the queue is
-- shut down, and nothing changed (the add would be ignored).
--
-- Locks in the queue's order: the adding lock, the item's row, its failure row, the queue's
-- row, then the flow row and the group's.
CREATE OR REPLACE FUNCTION workqueue_retry_done(q integer, k bytea, tok bigint,
    forget boolean, p integer, delay_us bigint, limited boolean, base_us bigint,
    max_us bigint, bucket_us bigint, burst integer, OUT outcome integer, OUT delay bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    a record;
BEGIN
    delay := 0;
    PERFORM pg_advisory_xact_lock_shared(2003920492, q);
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

-- Moves dead letters back to the queue: the `lim` oldest of queue `q` (or those with the ids
-- `ids`), each in the group its item had. Refuses (returns -1, changing nothing) while the
-- queue is shut down for the fleet, which it keeps from changing until it commits. Returns how
-- many letters it took, each of whose items is now queued (or was already, or is being
-- processed and is queued again after). The adding lock first, the queue's row last, after
-- the item rows (the lock order).
CREATE OR REPLACE FUNCTION workqueue_requeue_dead(q integer, ids bigint[], lim integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    shut boolean;
    xs text[];
    gs text[];
    a record;
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
            RETURNING d.id, d.item, d.grp
        )
        SELECT array_agg(g.item ORDER BY g.id), array_agg(g.grp ORDER BY g.id) INTO xs, gs
            FROM gone g;
        IF xs IS NULL THEN
            RETURN 0;
        END IF;
        SELECT * INTO a FROM workqueue_enqueue(q, xs, gs,
            array_fill(NULL::integer, ARRAY[cardinality(xs)]),
            array_fill(0::bigint, ARRAY[cardinality(xs)]),
            array_fill(false, ARRAY[cardinality(xs)]), 0, 0, 0, 0);
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

-- flow_set(queue, on?, grouped?, max_in_flight, max_in_flight_per_group, the queue's rate
-- (per second, burst, interval in µs), every group's rate (the same), then per group named in
-- the settings: its name, limit, weight, rate, burst and interval): writes the flow settings
-- of queue `q` that every process applies (the last process built wins) and returns their new
-- version. Turning flow control on waits for the adds in progress (the adding lock,
-- exclusive: they read it off, and announced nothing to the groups), puts the items added
-- without a group in the group '' (every item row of the queue is read once), and counts the
-- groups' ready items. Every change gives the groups their limits, weights and rates (a group
-- that has a free slot again goes to the back of the turns); turning it off forgets the
-- groups with no counted lease. Getters are woken to look again.
CREATE FUNCTION workqueue_flow_set(q integer, on_ boolean, grouped_ boolean,
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
        IF NOT was_on THEN
            DELETE FROM workqueue_arrivals x WHERE x.queue = q;
            UPDATE workqueue_groups g SET ready = 0, top = NULL, parked_until = NULL, credit = 0
                WHERE g.queue = q;
            SELECT array_agg(z.grp ORDER BY z.first) AS names, array_agg(z.k ORDER BY z.first) AS ns,
                   array_agg(z.top ORDER BY z.first) AS tops,
                   array_agg(nextval('workqueue_seq') ORDER BY z.first) AS turns
                INTO a
                FROM (SELECT i.grp, count(*)::integer AS k, max(coalesce(i.priority, 0)) AS top,
                             min(i.avail_at) AS first
                      FROM workqueue_items i WHERE i.queue = q AND i.ready GROUP BY i.grp) z;
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
        UPDATE workqueue_groups g SET ready = 0, top = NULL, parked_until = NULL, credit = 0
            WHERE g.queue = q;
    END IF;
    PERFORM workqueue_wake(q, 256);
    RETURN v;
END $$;

-- The moment the oldest ready item of group `g` of queue `q` became ready (a released one,
-- at the head of its group, does not count), read through the group's lane one priority at a
-- time: a look per priority the group has ready items at, whatever their number. For
-- operators.
--
-- A lane is read with `grp` between the name and itself, ordered by `grp` first: with `grp =`
-- a value, the order by `grp` would be dropped as constant, and a plan made with statistics
-- from a nearly empty table could take the queue's ready order (workqueue_items_ready) and
-- filter the group's items out of all of them; only the lane's index gives this order.
CREATE FUNCTION workqueue_group_oldest(q integer, g text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p integer;
    at_ timestamptz;
    oldest timestamptz;
BEGIN
    SELECT coalesce(i.priority, 0) INTO p FROM workqueue_items i
        WHERE i.queue = q AND i.grp >= g AND i.grp <= g AND i.ready
        ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq LIMIT 1;
    WHILE p IS NOT NULL LOOP
        at_ := NULL;
        SELECT i.avail_at INTO at_ FROM workqueue_items i
            WHERE i.queue = q AND i.grp >= g AND i.grp <= g AND i.ready
              AND coalesce(i.priority, 0) = p AND i.avail_at > '-infinity'
            ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq LIMIT 1;
        oldest := least(oldest, at_);
        SELECT coalesce(i.priority, 0) INTO p FROM workqueue_items i
            WHERE i.queue = q AND i.grp >= g AND i.grp <= g AND i.ready
              AND coalesce(i.priority, 0) < p
            ORDER BY i.grp, coalesce(i.priority, 0) DESC, i.avail_at, i.seq LIMIT 1;
        IF NOT FOUND THEN
            p := NULL;
        END IF;
    END LOOP;
    RETURN oldest;
END $$;

-- Every function, the new ones too, runs with the search_path of its schema and without
-- sequential scans (see version 3); a function replaced lost its settings. And without JIT
-- compilation: the queue's statements are short, and a plan whose cost a disabled node
-- (a sort the flow statements cannot avoid under enable_sort = off) puts past jit_above_cost
-- would be compiled at each first run on a connection, hundreds of milliseconds.
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
-- The hand-outs' ordered reads take their order from their indexes, and their statements are
-- planned once per connection (see versions 3 and 4).
ALTER FUNCTION workqueue_get(integer, integer, bigint, boolean, integer, integer)
    SET enable_sort = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_flow_get(integer, integer, bigint, boolean, integer, integer, boolean,
    boolean) SET enable_sort = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_group_oldest(integer, text)
    SET enable_sort = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_done_get(integer, bytea[], bigint[], boolean[], integer, bigint,
    boolean, integer, integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], integer, bigint,
    boolean, integer, integer) SET plan_cache_mode = force_generic_plan;
