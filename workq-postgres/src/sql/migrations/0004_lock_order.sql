-- workqueue-postgres, schema version 4: one lock order everywhere, a worker's step that waits
-- for no row, a failed item's retry fenced like its done, and rate-limited batches that spend
-- the token bucket in the batch's order.
--
-- THE LOCK ORDER. A statement of the queue that waits for row locks takes them in this order:
--
--   1. rows of workqueue_items, in key order;
--   2. then rows of workqueue_failures, in key order;
--   3. then the queue's row of workqueue_queues (its token bucket, counters, shut down).
--
-- A row it needs out of that order (a sweep that goes on to other items after burying one, a
-- step that must never wait) it takes without waiting (SKIP LOCKED), or it leaves it for later.
-- So no two statements of the queue wait for each other in a cycle: they never deadlock
-- (40P01), whatever they run beside. A caller's transaction holds the locks of each of its
-- statements until it ends, so its statements together can be out of that order (an add of an
-- item, then a rate-limited add of another, beside a rate-limited add of the first): keep
-- such transactions short, or put their adds in one `add_all_in`.
--
-- What changed from version 3, and why:
-- - workqueue_add: a batch with rate-limited items locks its item rows first (a new item's row
--   is inserted first, as a placeholder with last_add = 0 that the same call fills in), then
--   counts the failures, then takes the token bucket once, spent in the batch's order (it was
--   spent in key order, one key's failure row and the bucket row after the other's: a batch
--   and a single add could deadlock).
-- - workqueue_step: a worker's step (what workqueue_done_get did) that skips a row another
--   transaction holds (answer 3 or 4): the client settles that done on its own, so the step,
--   and every other worker's done and fetch in it, waits for nobody.
-- - workqueue_retry_done: a failed item's re-add (after a forget, if asked) and its done, in
--   one call fenced by the lease's token: a stale holder counts no failure, forgets nothing and
--   re-adds nothing.
-- - workqueue_reclaim and workqueue_bury never wait: a failure row or the queue's row that
--   someone holds leaves the item for the next sweep, or the dead letters over the cap for the
--   next bury.
-- - workqueue_requeue_dead takes the queue's row last (after its adds).
--
-- Processes built for version 3 run on it (serves_from = 3): no signature changed, and
-- workqueue_done_get stays for them.

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
CREATE OR REPLACE FUNCTION workqueue_add(q integer, xs text[], ps integer[],
    delays_us bigint[], limited boolean[], base_us bigint, max_us bigint, bucket_us bigint,
    burst integer, OUT kinds smallint[], OUT delays bigint[], OUT seqs bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(xs), 0);
    now_ timestamptz := clock_timestamp();
    ks bytea[];
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
    -- The longest wait the limiter gives (and the farthest the bucket's time goes): a
    -- thousand years, far inside PostgreSQL's timestamps.
    cap_us double precision := 1000 * 365.25 * 86400 * 1e6;
BEGIN
    kinds := array_fill(0::smallint, ARRAY[n]);
    delays := array_fill(0::bigint, ARRAY[n]);
    seqs := array_fill(0::bigint, ARRAY[n]);
    IF n = 0 OR EXISTS (SELECT 1 FROM workqueue_queues s WHERE s.id = q AND s.shut_down) THEN
        RETURN;
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
        INSERT INTO workqueue_items AS i (queue, key, item, seq, last_add)
            SELECT q, u.k, u.x, 0, 0
            FROM (SELECT DISTINCT ON (e.k) e.k, e.x
                  FROM unnest(ks, xs, skip) AS e(k, x, sk) WHERE NOT e.sk ORDER BY e.k) u
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
        -- the insert would have written.
        WITH applied AS (
            INSERT INTO workqueue_items AS i (queue, key, item, ready, avail_at, seq, priority,
                    due, last_add)
            SELECT q, e.k, e.x, e.due IS NULL, CASE WHEN e.due IS NULL THEN now_ END, e.ord,
                e.p, e.due, CASE WHEN e.due IS NULL THEN 1 ELSE 4 END
            FROM unnest(ks, xs, dues, order_, ps, occ, skip) AS e(k, x, due, ord, p, nth, sk)
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
                    ELSE 4 END
            -- A duplicate that changes nothing writes nothing (the row is still locked).
            WHERE i.last_add = 0
               OR (NOT (i.ready
                        AND NOT coalesce(EXCLUDED.priority > coalesce(i.priority, 0), false))
                   AND NOT (i.token IS NOT NULL AND i.dirty
                            AND NOT coalesce(EXCLUDED.priority > i.priority,
                                             EXCLUDED.priority IS NOT NULL)))
            RETURNING i.key, i.last_add
        )
        SELECT array_agg(CASE WHEN e.nth = r AND NOT e.sk
                              THEN coalesce(a.last_add, 2::smallint) ELSE e.kind END
                         ORDER BY e.i)
        INTO kinds
        FROM unnest(ks, occ, skip, kinds) WITH ORDINALITY AS e(k, nth, sk, kind, i)
        LEFT JOIN applied a ON a.key = e.k AND e.nth = r AND NOT e.sk;
    END LOOP;
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

-- Moves an item's row to the dead letters (its expired leases counted with `more_stalls`
-- more), keeping at most `cap` (0: no cap) per queue. It waits for no lock beyond the item's
-- row and its failure row: the letters over the cap (and the queue's row, which counts them)
-- are dropped only if nobody holds them, else by a later bury.
CREATE OR REPLACE FUNCTION workqueue_bury(q integer, k bytea, why text, cap integer,
    more_stalls integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    x text;
    n_stalls integer;
    n_failures integer;
    cut bigint;
    dropped bigint;
BEGIN
    DELETE FROM workqueue_items WHERE queue = q AND key = k RETURNING item, stalls
        INTO x, n_stalls;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM workqueue_failures WHERE queue = q AND key = k RETURNING failures
        INTO n_failures;
    INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
        VALUES (q, x, why, n_stalls + more_stalls, coalesce(n_failures, 0));
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
END $$;

-- Takes back the expired leases of queue `q` (their holders died or stalled): each item is
-- queued again at the tail (its re-adds fold into that hand-out), or moved to the dead
-- letters once its leases expired `max_stalls` times in a row. Waits for no lock: rows
-- someone holds are skipped, and so is an item to bury whose failure row someone holds (the
-- next sweep takes it). Returns how many items were queued again.
CREATE OR REPLACE FUNCTION workqueue_reclaim(q integer, now_ timestamptz, max_stalls integer,
    dead_cap integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT i.key, i.stalls FROM workqueue_items i
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
                ready = true, dirty = false, due = NULL, stalls = i.stalls + 1,
                priority = greatest(i.lease_priority, coalesce(i.priority, i.lease_priority)),
                avail_at = now_, seq = nextval('workqueue_seq')
                WHERE i.queue = q AND i.key = r.key;
            n := n + 1;
        END IF;
    END LOOP;
    IF n > 0 THEN
        PERFORM workqueue_wake(q, n);
    END IF;
    RETURN n;
END $$;

-- step(queue, keys, tokens, forgets, then workqueue_get's arguments): a worker's step from
-- its items to the next ones, which waits for no row. Each lease's done (after its forget),
-- fenced by its token, as workqueue_done does it; then, unless every done was refused,
-- workqueue_get. One statement: one round trip and one commit.
--
-- `done` has, per lease, workqueue_done's answer (1 done, 2 done and queued again, 0 another
-- lease holds the item, -1 none does), or, when another transaction holds the item's row (or
-- its failure row, for a forget): 3 if the lease is still running, 4 if it has expired (the
-- holder may be a sweep taking it back). Such a done changed nothing: the caller settles it on
-- its own (workqueue_done, which waits for the row), and the step goes on without it.
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
        IF NOT FOUND THEN
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

-- retry_done(queue, key, token, forget, then one add's priority, delay, rate limited? and
-- the rate limiter): a failed item's step. Fenced by the lease's token: if the lease is no
-- longer the caller's, nothing changes (no failure counted, nothing forgotten or re-added)
-- and the answer is 0 (another lease holds the item) or -1 (none does). Otherwise the item's
-- failures are forgotten if asked, the item is added as workqueue_add would add it (while
-- leased, so queued again once done, or when its delay is due), and the lease is done:
-- workqueue_done's answer, 1 or 2, with the delay the add gave. 3: the queue is shut down,
-- and nothing changed (the add would be ignored).
--
-- Locks in the queue's order: the item's row, its failure row, the queue's row.
CREATE OR REPLACE FUNCTION workqueue_retry_done(q integer, k bytea, tok bigint,
    forget boolean, p integer, delay_us bigint, limited boolean, base_us bigint,
    max_us bigint, bucket_us bigint, burst integer, OUT outcome integer, OUT delay bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    a record;
BEGIN
    delay := 0;
    SELECT i.token, i.item INTO r FROM workqueue_items i
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
        SELECT * INTO a FROM workqueue_add(q, ARRAY[r.item], ARRAY[p], ARRAY[delay_us],
            ARRAY[limited], base_us, max_us, bucket_us, burst);
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
-- `ids`). Refuses (returns -1, changing nothing) while the queue is shut down for the fleet,
-- which it keeps from changing until it commits. Returns how many letters it took, each of
-- whose items is now queued (or was already, or is being processed and is queued again
-- after). The queue's row is locked last, after the item rows (the lock order).
CREATE OR REPLACE FUNCTION workqueue_requeue_dead(q integer, ids bigint[], lim integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    shut boolean;
    xs text[];
    a record;
BEGIN
    IF EXISTS (SELECT 1 FROM workqueue_queues s WHERE s.id = q AND s.shut_down) THEN
        RETURN -1;
    END IF;
    BEGIN
        WITH gone AS (
            DELETE FROM workqueue_dead d WHERE d.id IN (
                SELECT e.id FROM workqueue_dead e
                WHERE e.queue = q AND (ids IS NULL OR e.id = ANY(ids))
                ORDER BY e.id LIMIT lim)
            RETURNING d.id, d.item
        )
        SELECT array_agg(g.item ORDER BY g.id) INTO xs FROM gone g;
        IF xs IS NULL THEN
            RETURN 0;
        END IF;
        SELECT * INTO a FROM workqueue_add(q, xs,
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

-- Every function, the new ones too, runs with the search_path of its schema (see version 3).
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
                       'SET enable_seqscan = off', f, current_schema());
    END LOOP;
END $$;
-- The step's statements (by key, by address) have the right plan whatever the parameters:
-- planned once per connection, as workqueue_get's and workqueue_done_get's.
ALTER FUNCTION workqueue_step(integer, bytea[], bigint[], boolean[], integer, bigint,
    boolean, integer, integer) SET plan_cache_mode = force_generic_plan;
