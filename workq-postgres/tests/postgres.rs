//! What only the PostgreSQL queue has: transactional enqueue, leases with fencing tokens on
//! the database's clock, release on drop, dead letters, a handle's own shut down, polling
//! without `LISTEN`, and the schema's migrations (upgrades from versions 2, 3, 6 and 8 with
//! items in every state, and from 9 under flow control). Each test starts its own server.

mod support;

use std::time::{Duration, Instant};

use support::{PgServer, unique};
use workq::AddKind;
use workq::{AddOptions, TryGetError};
use workq_postgres::{Error, Lease, PgQueue};

async fn queue(server: &PgServer, lease: Duration) -> PgQueue<String> {
    PgQueue::builder(unique("pg"))
        .url(server.url())
        .lease_duration(lease)
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("connect to the test server")
}

/// The next item within 5 s.
async fn next(queue: &PgQueue<String>) -> workq_postgres::Lease<String> {
    tokio::time::timeout(Duration::from_secs(5), queue.get())
        .await
        .expect("an item within 5 s")
        .unwrap()
        .expect("an item, not shut down")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_add_queues_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = queue(&server, Duration::from_secs(10)).await;
    let mut tx = queue.pool().begin().await.unwrap();
    let added = queue.add_in(&mut tx, "order-1".to_owned()).await.unwrap();
    assert_eq!(added.kind, AddKind::Queued);
    queue
        .add_with_in(
            &mut tx,
            "order-2".to_owned(),
            AddOptions::default().priority(3),
        )
        .await
        .unwrap();
    queue
        .add_after_in(&mut tx, "order-3".to_owned(), Duration::from_millis(1))
        .await
        .unwrap();
    // Not visible to anyone else before the commit.
    assert_eq!(queue.len().await.unwrap(), 0);
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(queue.len().await.unwrap(), 0);
    assert_eq!(queue.delayed_len().await.unwrap(), 0);
    assert_eq!(
        queue.try_get().await.unwrap().into_result().err(),
        Some(TryGetError::Empty)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_add_is_queued_and_wakes_a_blocked_getter() {
    let Some(server) = PgServer::start() else {
        return;
    };
    // Getters poll only every 30 s: a wake-up within 5 s is the NOTIFY of the commit.
    let queue = queue(&server, Duration::from_secs(10)).await;
    let other = PgQueue::<String>::builder(queue.name())
        .url(server.url())
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let getter = tokio::spawn(async move { next(&other).await.item().clone() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tx = queue.pool().begin().await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO orders VALUES ('order-1')")
        .execute(&mut *tx)
        .await
        .unwrap();
    queue.add_in(&mut tx, "order-1".to_owned()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !getter.is_finished(),
        "nothing is handed out before the commit"
    );
    tx.commit().await.unwrap();
    let item = tokio::time::timeout(Duration::from_secs(5), getter)
        .await
        .expect("woken by the commit")
        .unwrap();
    assert_eq!(item, "order-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_is_fenced_off() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue: PgQueue<String> = PgQueue::builder(unique("fence"))
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    queue.add("key".to_owned()).await.unwrap();
    let stale = next(&queue).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(stale.is_lost(), "past its deadline, locally too");
    let fresh = next(&queue).await;
    assert!(fresh.token() > stale.token(), "tokens grow");
    assert!(stale.renew().await.unwrap_err().is_lease_lost());
    assert!(matches!(stale.done().await, Err(Error::LeaseLost)));
    // The new holder's claim is intact: nobody else gets the item, and its done is accepted.
    queue.add("key".to_owned()).await.unwrap();
    assert_eq!(
        queue.try_get().await.unwrap().into_result().err(),
        Some(TryGetError::Empty)
    );
    fresh.done().await.unwrap();
    let again = next(&queue).await;
    assert_eq!(
        again.item(),
        "key",
        "the re-add while the fresh lease was held"
    );
    again.done().await.unwrap();
}

/// A stale holder's `done_and_get` with a forget (what `Workers` send after a success) is
/// refused whole: the failure count, which the item's current holder may be failing on,
/// stays; so does it through `done_and_get_many`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_forget_changes_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue: PgQueue<String> = PgQueue::builder(unique("fence-forget"))
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    queue.add("key".to_owned()).await.unwrap();
    let stale = next(&queue).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = next(&queue).await;
    // The current holder fails twice.
    queue.add_rate_limited("key".to_owned()).await.unwrap();
    queue.add_rate_limited("key".to_owned()).await.unwrap();
    assert_eq!(queue.num_requeues("key".to_owned()).await.unwrap(), 2);
    assert!(matches!(
        queue.done_and_get(stale, true).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(
        queue.num_requeues("key".to_owned()).await.unwrap(),
        2,
        "a refused done forgets nothing"
    );
    // The same through Workers' step on the trait, from a holder whose lease was taken over.
    let stale = fresh;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let current = next(&queue).await;
    let out = workq::Queue::done_and_next(&queue, stale, true).await;
    assert!(matches!(out, Err(Error::LeaseLost)));
    assert_eq!(queue.num_requeues("key".to_owned()).await.unwrap(), 2);
    // The holder's own done with a forget is accepted and forgets.
    assert!(queue.done_and_get(current, true).await.unwrap().is_none());
    assert_eq!(queue.num_requeues("key".to_owned()).await.unwrap(), 0);
}

/// `done_and_get`: the done and the next ready item in one call, with `done`'s rules: the
/// next item is the queue's next (a re-add while processing queued behind the others), a
/// `forget` clears the item's failures, nothing ready gives `None`, and a lost lease's call is
/// refused and takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_and_get_ends_a_lease_and_hands_out_the_next_item_in_one_call() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = queue(&server, Duration::from_secs(10)).await;
    queue.add("a".to_owned()).await.unwrap();
    queue.add("b".to_owned()).await.unwrap();
    let a = next(&queue).await;
    assert_eq!(a.item(), "a");
    // Re-added while processing: queued again at the done, behind b.
    assert_eq!(
        queue.add("a".to_owned()).await.unwrap().kind,
        AddKind::Deferred
    );
    // A failure of b, for the forget below.
    queue.add_rate_limited("b".to_owned()).await.unwrap();
    assert_eq!(queue.num_requeues("b".to_owned()).await.unwrap(), 1);

    let b = queue
        .done_and_get(a, false)
        .await
        .unwrap()
        .expect("b is ready");
    assert_eq!(b.item(), "b");
    let a_again = queue
        .done_and_get(b, true)
        .await
        .unwrap()
        .expect("the re-add of a");
    assert_eq!(a_again.item(), "a");
    assert_eq!(queue.num_requeues("b".to_owned()).await.unwrap(), 0);
    assert!(queue.done_and_get(a_again, false).await.unwrap().is_none());
    assert_eq!(queue.len().await.unwrap(), 0);
    assert_eq!(queue.processing_len().await.unwrap(), 0);

    // A lease lost (its queue deleted under it): refused, and the next item stays queued.
    queue.add("c".to_owned()).await.unwrap();
    let c = next(&queue).await;
    queue.delete().await.unwrap();
    queue.add("d".to_owned()).await.unwrap();
    assert!(matches!(
        queue.done_and_get(c, false).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(queue.len().await.unwrap(), 1);
    let d = next(&queue).await;
    assert_eq!(d.item(), "d");
    d.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_are_renewed_past_their_duration() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = queue(&server, Duration::from_millis(400)).await;
    queue.add("key".to_owned()).await.unwrap();
    let lease = next(&queue).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!lease.is_lost());
    assert_eq!(
        queue.try_get().await.unwrap().into_result().err(),
        Some(TryGetError::Empty)
    );
    lease.done().await.unwrap();
    assert_eq!(queue.processing_len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lease_is_released_and_handed_out_again_promptly() {
    let Some(server) = PgServer::start() else {
        return;
    };
    // A lease of an hour: only the release can hand the item out again within 5 s.
    let queue = queue(&server, Duration::from_secs(3600)).await;
    queue.add("a".to_owned()).await.unwrap();
    queue.add("b".to_owned()).await.unwrap();
    let a = next(&queue).await;
    let started = Instant::now();
    drop(a);
    // The release is sent in the background.
    while queue.len().await.unwrap() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "released within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let again = next(&queue).await;
    assert_eq!(again.item(), "a", "a released item goes to the head");
    assert!(started.elapsed() < Duration::from_secs(5));
    again.done().await.unwrap();
    let b = next(&queue).await;
    assert_eq!(b.item(), "b");
    b.release().await.unwrap();
    let b = next(&queue).await;
    b.done().await.unwrap();
    assert_eq!(
        queue.try_get().await.unwrap().into_result().err(),
        Some(TryGetError::Empty)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_whose_leases_keep_expiring_becomes_a_dead_letter() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue: PgQueue<String> = PgQueue::builder(unique("dead"))
        .url(server.url())
        .lease_duration(Duration::from_millis(100))
        .auto_renew(false)
        .max_stalls(2)
        .dead_letter_cap(2)
        .build()
        .await
        .unwrap();
    for item in ["p1", "p2", "p3"] {
        queue.add(item.to_owned()).await.unwrap();
        queue.add_rate_limited(item.to_owned()).await.unwrap();
        queue.forget(item.to_owned()).await.unwrap();
        queue.add_rate_limited(item.to_owned()).await.unwrap();
        for _ in 0..2 {
            next(&queue).await.abandon();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The second expiry buries it: nothing comes out.
        assert_eq!(
            queue.try_get().await.unwrap().into_result().err(),
            Some(TryGetError::Empty)
        );
    }
    let letters = queue
        .dead_letters(workq::admin::End::Last, 10)
        .await
        .unwrap();
    let items: Vec<&str> = letters.iter().map(|l| l.item.as_str()).collect();
    assert_eq!(items, ["\"p3\"", "\"p2\""], "capped at 2, newest first");
    assert_eq!(letters[0].error, "stalled");
    assert_eq!(letters[0].stalls, 2);
    assert_eq!(letters[0].failures, 1);
    assert_eq!(queue.dead_dropped().await.unwrap(), 1);
    assert_eq!(queue.num_requeues("p3".to_owned()).await.unwrap(), 0);
    assert!(queue.requeue_dead_letter(&letters[0]).await.unwrap());
    assert!(!queue.requeue_dead_letter(&letters[0]).await.unwrap());
    let p3 = next(&queue).await;
    assert_eq!(p3.item(), "p3");
    p3.done().await.unwrap();
    assert_eq!(queue.purge_dead_letters().await.unwrap(), 1);
    assert!(
        queue
            .dead_letters(workq::admin::End::Last, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_does_not_deserialize_becomes_a_dead_letter() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("types");
    let numbers: PgQueue<u32> = PgQueue::builder(name.clone())
        .url(server.url())
        .build()
        .await
        .unwrap();
    let texts: PgQueue<String> = PgQueue::builder(name)
        .url(server.url())
        .build()
        .await
        .unwrap();
    texts.add("not a number".to_owned()).await.unwrap();
    numbers.add(7).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), numbers.get())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(*lease.item(), 7);
    lease.done().await.unwrap();
    let letters = numbers
        .dead_letters(workq::admin::End::Last, 10)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].item, "\"not a number\"");
    assert!(
        letters[0].error.contains("invalid type"),
        "{}",
        letters[0].error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handles_shut_down_stops_only_that_handle() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = queue(&server, Duration::from_secs(10)).await;
    let other = PgQueue::<String>::builder(queue.name())
        .url(server.url())
        .build()
        .await
        .unwrap();
    queue.add("a".to_owned()).await.unwrap();
    let held = next(&queue).await;
    let blocked = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.get().await.unwrap().is_none() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    queue.shut_down();
    assert!(
        blocked.await.unwrap(),
        "a blocked getter of the handle wakes with None"
    );
    assert_eq!(
        queue.add("b".to_owned()).await.unwrap().kind,
        AddKind::Ignored
    );
    assert!(queue.is_shutting_down().await.unwrap());
    assert!(!other.is_shutting_down().await.unwrap());
    other.add("c".to_owned()).await.unwrap();
    let drain = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.shut_down_with_drain().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!drain.is_finished(), "the drain waits for the held lease");
    held.done().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next(&other).await.item(), "c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_getters_find_items_by_polling() {
    let Some(server) = PgServer::start() else {
        return;
    };
    // As behind PgBouncer in transaction mode: no LISTEN connection at all.
    let queue: PgQueue<String> = PgQueue::builder(unique("poll"))
        .url(server.url())
        .listen(false)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let getter = {
        let queue = queue.clone();
        tokio::spawn(async move { next(&queue).await.item().clone() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    queue.add("x".to_owned()).await.unwrap();
    assert_eq!(getter.await.unwrap(), "x");
}

/// A process runs on a schema a newer process migrated when that schema still serves its
/// version (a rolling upgrade's old processes), and refuses one that does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_used_only_if_it_serves_this_version() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let build = || {
        PgQueue::<String>::builder("upgrade")
            .url(server.url())
            .build()
    };
    build().await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let newer = workq_postgres::SCHEMA_VERSION + 1;
    // What a newer crate with an additive migration would record.
    sqlx::query("INSERT INTO workqueue_migrations (version, serves_from) VALUES ($1, 1)")
        .bind(newer)
        .execute(&pool)
        .await
        .unwrap();
    let queue = build()
        .await
        .expect("an additive newer schema serves this version");
    queue.add("x".to_owned()).await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 1);
    // And one that breaks older code.
    sqlx::query("INSERT INTO workqueue_migrations (version, serves_from) VALUES ($1, $1)")
        .bind(newer + 1)
        .execute(&pool)
        .await
        .unwrap();
    let error = build()
        .await
        .expect_err("a breaking newer schema is refused");
    assert!(
        matches!(error, workq_postgres::Error::Migrate(_)),
        "{error}"
    );
    assert!(
        error.to_string().contains("upgrade this process"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_processes_install_the_schema_once() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let builds = (0..6).map(|i| {
        let url = server.url();
        tokio::spawn(async move {
            PgQueue::<String>::builder(format!("schema-{i}"))
                .url(url)
                .build()
                .await
                .map(|_| ())
        })
    });
    for build in builds.collect::<Vec<_>>() {
        build.await.unwrap().unwrap();
    }
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let versions: Vec<i32> =
        sqlx::query_scalar("SELECT version FROM workqueue_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    // Every migration, each once.
    assert_eq!(
        versions,
        (1..=workq_postgres::SCHEMA_VERSION).collect::<Vec<_>>()
    );
    // Every name the schema made carries the prefix.
    let stray: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND relname NOT LIKE 'workqueue\\_%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(stray.is_empty(), "{stray:?}");
    PgQueue::<String>::migrate(&pool).await.unwrap();
}

/// A database of schema version 2 with items in every state is upgraded in place: queued items
/// keep their order, delayed ones their due time, leased ones their holder (and its token),
/// re-adds while leased, failure counts and dead letters survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_2_keeps_every_item() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    // Version 2, installed as its crate did, and used through its functions.
    pool.execute(include_str!("../src/sql/migrations/0001_schema.sql"))
        .await
        .unwrap();
    pool.execute(include_str!("../src/sql/migrations/0002_done_get.sql"))
        .await
        .unwrap();
    pool.execute(
        "CREATE TABLE workqueue_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now(), serves_from integer);
         INSERT INTO workqueue_migrations (version, serves_from) VALUES (1, 1), (2, 1);
         INSERT INTO workqueue_queues (name) VALUES ('old');
         SELECT workqueue_add('old', '\"first\"', NULL, 0);
         SELECT workqueue_add('old', '\"second\"', 3, 0);
         SELECT workqueue_add('old', '\"third\"', NULL, 0);
         SELECT workqueue_add('old', '\"later\"', NULL, 3600000000);
         SELECT workqueue_add('old', '\"held\"', NULL, 0);
         SELECT workqueue_backoff('old', '\"third\"', 1000, 1000000, 0, 0);
         INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
             VALUES ('old', '\"buried\"', 'stalled', 5, 0);",
    )
    .await
    .unwrap();
    // `held` is leased (token 1000) and re-added meanwhile.
    sqlx::query(
        "UPDATE workqueue_items SET ready = false, token = 1000,
             lease_until = clock_timestamp() + interval '1 hour', leased_at = clock_timestamp(),
             dirty = true
         WHERE item = '\"held\"'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("SELECT setval('workqueue_seq', 2000)")
        .execute(&pool)
        .await
        .unwrap();

    let q: PgQueue<String> = PgQueue::builder("old")
        .url(server.url())
        .build()
        .await
        .expect("the upgrade to version 3 runs at build");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, workq_postgres::SCHEMA_VERSION);
    assert_eq!(q.num_requeues("third".to_owned()).await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 1);
    assert_eq!(q.processing_len().await.unwrap(), 1);
    assert_eq!(
        q.dead_letters(workq::admin::End::Last, 10).await.unwrap()[0].item,
        "\"buried\""
    );
    // New adds go behind the carried-over ones.
    q.add("new".to_owned()).await.unwrap();
    let mut order = Vec::new();
    while let Some(lease) = q.try_get().await.unwrap().into_lease() {
        order.push((lease.item().clone(), lease.priority()));
        lease.done().await.unwrap();
    }
    assert_eq!(
        order,
        [
            ("second".to_owned(), 3),
            ("first".to_owned(), 0),
            ("third".to_owned(), 0),
            ("new".to_owned(), 0)
        ]
    );
    // The old holder's token still ends its lease, and its re-add is queued then.
    let token: i64 = sqlx::query_scalar(
        "SELECT token FROM workqueue_items i JOIN workqueue_queues s ON s.id = i.queue
         WHERE s.name = 'old' AND i.item = '\"held\"'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(token, 1000);
    let done: i32 = sqlx::query_scalar(
        "SELECT workqueue_done(s.id, workqueue_key('\"held\"'), 1000, false, false)
         FROM workqueue_queues s WHERE s.name = 'old'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, 2, "done, and queued again for the re-add");
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(lease.item(), "held");
    assert!(lease.token() > 2000, "tokens go on growing");
    lease.done().await.unwrap();
}

/// The token of the lease on item `item` (its JSON text is the string) of queue 7.
/// The released migrations, in order: a database of an older schema version is built by
/// running the first few, as a process of that version did.
const RELEASED: [&str; 9] = [
    include_str!("../src/sql/migrations/0001_schema.sql"),
    include_str!("../src/sql/migrations/0002_done_get.sql"),
    include_str!("../src/sql/migrations/0003_keys_and_order.sql"),
    include_str!("../src/sql/migrations/0004_lock_order.sql"),
    include_str!("../src/sql/migrations/0005_step_wait.sql"),
    include_str!("../src/sql/migrations/0006_periodic.sql"),
    include_str!("../src/sql/migrations/0007_flow.sql"),
    include_str!("../src/sql/migrations/0008_flow_turns.sql"),
    include_str!("../src/sql/migrations/0009_trace_links.sql"),
];

/// Runs the first `version` released migrations on `pool` (schema version `version`).
async fn migrate_to(pool: &sqlx::PgPool, version: usize) {
    use sqlx::Executor;
    for sql in &RELEASED[..version] {
        pool.execute(*sql).await.unwrap();
    }
}

async fn token_of(pool: &sqlx::PgPool, item: &str) -> i64 {
    sqlx::query_scalar("SELECT token FROM workqueue_items WHERE queue = 7 AND item = $1")
        .bind(format!("\"{item}\""))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A database of schema version 3 with items in every state (queued with and without a
/// priority, delayed, leased, leased and re-added, leased with a pending delay, a failure
/// count, a used token bucket, a dead letter) is upgraded to version 4 in place: queued items
/// keep their order, the leased ones their holders' tokens, which end them through the new
/// step and the new fenced retry; the bucket goes on from where version 3 left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_3_keeps_every_item() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    migrate_to(&pool, 3).await;
    // Version 3, used through its functions.
    pool.execute(
        "CREATE TABLE workqueue_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now(), serves_from integer);
         INSERT INTO workqueue_migrations (version, serves_from) VALUES (1, 1), (2, 1), (3, 3);
         INSERT INTO workqueue_queues (id, name) VALUES (7, 'v3');
         SELECT workqueue_add(7, ARRAY['\"held\"', '\"held-late\"'], ARRAY[10, 9],
             ARRAY[0, 0]::bigint[], ARRAY[false, false], 0, 0, 0, 0);
         SELECT workqueue_get(7, 2, 3600000000, false, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"held\"'], ARRAY[NULL]::integer[],
             ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"held-late\"'], ARRAY[NULL]::integer[],
             ARRAY[3600000000]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"first\"', '\"second\"', '\"third\"'],
             ARRAY[NULL, 3, NULL], ARRAY[0, 0, 0]::bigint[], ARRAY[false, false, true],
             0, 1000000, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"later\"'], ARRAY[NULL]::integer[],
             ARRAY[3600000000]::bigint[], ARRAY[false], 0, 0, 0, 0);
         UPDATE workqueue_queues SET bucket_tat = clock_timestamp() + interval '1 hour'
             WHERE id = 7;
         INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
             VALUES (7, '\"buried\"', 'stalled', 5, 0);",
    )
    .await
    .unwrap();
    let (held, late) = (
        token_of(&pool, "held").await,
        token_of(&pool, "held-late").await,
    );

    let q: PgQueue<String> = PgQueue::builder("v3")
        .url(server.url())
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .build()
        .await
        .expect("the upgrade to version 4 runs at build");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, workq_postgres::SCHEMA_VERSION);
    assert_eq!(q.num_requeues("third".to_owned()).await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 1);
    assert_eq!(q.processing_len().await.unwrap(), 2);
    assert_eq!(
        q.dead_letters(workq::admin::End::Last, 10).await.unwrap()[0].item,
        "\"buried\""
    );
    // The old holders' tokens end their leases: `held` (re-added) through the step, queued
    // again; `held-late` through the fenced retry, delayed by its backoff; a wrong token
    // changes nothing.
    let step: Vec<i32> = sqlx::query_scalar(
        "SELECT done FROM workqueue_step(7, ARRAY[workqueue_key('\"held\"')], $1,
             ARRAY[false], 0, 1000000, false, 0, 0)",
    )
    .bind(vec![held])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(step, [2], "done, and queued again for the re-add");
    let retry = |tok: i64| {
        sqlx::query_scalar::<_, i32>(
            "SELECT outcome FROM workqueue_retry_done(7, workqueue_key('\"held-late\"'), $1,
                 false, NULL, 0, true, 3600000000, 3600000000, 0, 0)",
        )
        .bind(tok)
        .fetch_one(&pool)
    };
    assert_eq!(
        retry(late - 1).await.unwrap(),
        0,
        "a stale token is refused"
    );
    assert_eq!(q.num_requeues("held-late".to_owned()).await.unwrap(), 0);
    assert_eq!(retry(late).await.unwrap(), 1);
    assert_eq!(q.num_requeues("held-late".to_owned()).await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 2);
    assert_eq!(q.processing_len().await.unwrap(), 0);
    // The bucket goes on from version 3's state: an hour of it is spent already.
    let added = q
        .add_with("slow".to_owned(), AddOptions::default().rate_limited())
        .await
        .unwrap();
    assert!(
        added.delay >= Duration::from_secs(3590),
        "{:?}",
        added.delay
    );
    // New adds go behind the carried-over ones, and tokens go on growing.
    q.add("new".to_owned()).await.unwrap();
    let mut order = Vec::new();
    while let Some(lease) = q.try_get().await.unwrap().into_lease() {
        assert!(lease.token() > late.unsigned_abs());
        order.push((lease.item().clone(), lease.priority()));
        lease.done().await.unwrap();
    }
    assert_eq!(
        order,
        [
            ("second".to_owned(), 3),
            ("first".to_owned(), 0),
            ("third".to_owned(), 0),
            ("held".to_owned(), 0),
            ("new".to_owned(), 0)
        ]
    );
}

/// A database of schema version 6 with items in every state (queued with and without a
/// priority, delayed, leased, leased and re-added, leased with a pending delay, a failure
/// count, a dead letter, a schedule) is upgraded to the current version by a process built
/// with flow control (a group function, one lease per group): every item is then in a group
/// (the group `""`: no process of version 6 gave one), the old leases count in it (two, over
/// its limit: nothing is handed out until they end), the old holders' tokens end them, the
/// queued items come out in their order one at a time (the group's limit), and a process of
/// version 6 still adds through its old call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_6_keeps_every_item_under_flow_control() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    migrate_to(&pool, 6).await;
    // Version 6, used through its functions.
    pool.execute(
        "CREATE TABLE workqueue_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now(), serves_from integer);
         INSERT INTO workqueue_migrations (version, serves_from)
             VALUES (1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3);
         INSERT INTO workqueue_queues (id, name) VALUES (7, 'v6');
         SELECT workqueue_add(7, ARRAY['\"held\"', '\"held-late\"'], ARRAY[10, 9],
             ARRAY[0, 0]::bigint[], ARRAY[false, false], 0, 0, 0, 0);
         SELECT workqueue_get(7, 2, 3600000000, false, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"held\"'], ARRAY[NULL]::integer[],
             ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"held-late\"'], ARRAY[NULL]::integer[],
             ARRAY[3600000000]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"first\"', '\"second\"', '\"third\"'],
             ARRAY[NULL, 3, NULL], ARRAY[0, 0, 0]::bigint[], ARRAY[false, false, true],
             0, 1000000, 0, 0);
         SELECT workqueue_add(7, ARRAY['\"later\"'], ARRAY[NULL]::integer[],
             ARRAY[3600000000]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT workqueue_periodic_upsert(7, 'nightly', 0, 'every 1d', NULL, NULL);
         INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
             VALUES (7, '\"buried\"', 'stalled', 5, 0);",
    )
    .await
    .unwrap();
    let (held, late) = (
        token_of(&pool, "held").await,
        token_of(&pool, "held-late").await,
    );

    let q: PgQueue<String> = PgQueue::builder("v6")
        .url(server.url())
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
        .max_in_flight_per_group(1)
        .build()
        .await
        .expect("the upgrade runs at build, and flow control is turned on");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, workq_postgres::SCHEMA_VERSION);
    let ungrouped: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workqueue_items WHERE queue = 7 AND grp IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(ungrouped, 0, "every item is in a group");
    assert_eq!(q.num_requeues("third".to_owned()).await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 1);
    assert_eq!(q.processing_len().await.unwrap(), 2);
    assert_eq!(
        q.dead_letters(workq::admin::End::Last, 10).await.unwrap()[0].item,
        "\"buried\""
    );
    assert_eq!(q.schedules().await.unwrap()[0].name, "nightly");
    // The old leases count, as every lease under flow control does.
    assert!(
        q.try_get().await.unwrap().is_empty(),
        "the group \"\" holds the two old leases, over its limit of one"
    );
    // The old holders' tokens end their leases: `held` (re-added) through the step, queued
    // again in its group; `held-late` through the fenced retry, delayed by its backoff.
    let step: Vec<i32> = sqlx::query_scalar(
        "SELECT done FROM workqueue_step(7, ARRAY[workqueue_key('\"held\"')], $1,
             ARRAY[false], 0, 1000000, false, 0, 0)",
    )
    .bind(vec![held])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(step, [2], "done, and queued again for the re-add");
    let retried: i32 = sqlx::query_scalar(
        "SELECT outcome FROM workqueue_retry_done(7, workqueue_key('\"held-late\"'), $1,
             false, NULL, 0, true, 3600000000, 3600000000, 0, 0)",
    )
    .bind(late)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(retried, 1);
    assert_eq!(q.processing_len().await.unwrap(), 0);
    let first = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!((first.item().as_str(), first.priority()), ("second", 3));
    assert!(
        q.try_get().await.unwrap().is_empty(),
        "the group \"\" holds one lease, its limit"
    );
    first.done().await.unwrap();
    // A process of version 6 adds through its old call: its item is in the group "".
    let kinds: Vec<i16> = sqlx::query_scalar(
        "SELECT kinds FROM workqueue_add(7, ARRAY['\"old-process\"'], ARRAY[NULL]::integer[],
             ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kinds, [1]);
    q.add("new".to_owned()).await.unwrap();
    let mut order = Vec::new();
    while let Some(lease) = q.try_get().await.unwrap().into_lease() {
        assert!(
            q.try_get().await.unwrap().is_empty(),
            "one at a time: {}",
            lease.item()
        );
        order.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(order, ["first", "third", "held", "old-process", "new"]);
}

/// A database of schema version 8 with items in every state (queued with and without a
/// priority, delayed, leased, leased and re-added) is upgraded to version 9 (trace links) in
/// place: every row starts with no link, the old holders' tokens end their leases, the queued
/// items come out in their order, and a process of version 8 still adds, hands out and steps
/// through its old calls (the hand-outs' new columns are ones it does not read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_8_keeps_every_item() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    migrate_to(&pool, 8).await;
    // Version 8, used through its functions as its processes call them.
    pool.execute(
        "CREATE TABLE workqueue_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now(), serves_from integer);
         INSERT INTO workqueue_migrations (version, serves_from)
             VALUES (1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3), (7, 3), (8, 3);
         INSERT INTO workqueue_queues (id, name) VALUES (7, 'v8');
         SELECT kinds FROM workqueue_enqueue(7, ARRAY['\"held\"'], NULL, ARRAY[NULL]::integer[],
             ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0);
         SELECT kind, items, keys, tokens, priorities, wait_us
             FROM workqueue_get(7, 1, 3600000000, false, 0, 0);
         SELECT kinds FROM workqueue_enqueue(7,
             ARRAY['\"held\"', '\"first\"', '\"second\"', '\"later\"'], NULL,
             ARRAY[NULL, NULL, 3, NULL]::integer[], ARRAY[0, 0, 0, 3600000000]::bigint[],
             ARRAY[false, false, false, false], 0, 0, 0, 0);",
    )
    .await
    .unwrap();
    let held = token_of(&pool, "held").await;

    let q: PgQueue<String> = PgQueue::builder("v8")
        .url(server.url())
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("the upgrade runs at build");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, workq_postgres::SCHEMA_VERSION);
    let linked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workqueue_items WHERE queue = 7
             AND (links IS NOT NULL OR links_dropped IS NOT NULL OR lease_links IS NOT NULL
                  OR lease_dropped IS NOT NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(linked, 0, "every row starts with no link");
    assert_eq!(q.delayed_len().await.unwrap(), 1);
    assert_eq!(q.processing_len().await.unwrap(), 1);
    // The old holder's step, as version 8 sends it: done, and queued again for its re-add.
    let step: Vec<i32> = sqlx::query_scalar(
        "SELECT done FROM workqueue_step(7, ARRAY[workqueue_key('\"held\"')], $1,
             ARRAY[false], 0, 1000000, false, 0, 0)",
    )
    .bind(vec![held])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(step, [2]);
    // A process of version 8 adds and hands out through its old calls.
    let kinds: Vec<i16> = sqlx::query_scalar(
        "SELECT kinds FROM workqueue_enqueue(7, ARRAY['\"old-process\"'], NULL,
             ARRAY[NULL]::integer[], ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kinds, [1]);
    let (kind, items): (i32, Vec<String>) =
        sqlx::query_as("SELECT kind, items FROM workqueue_get(7, 1, 3600000000, false, 0, 0)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((kind, items), (1, vec!["\"second\"".to_owned()]));
    q.add("new".to_owned()).await.unwrap();
    let mut order = Vec::new();
    while let Some(lease) = q.try_get().await.unwrap().into_lease() {
        order.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(order, ["first", "held", "old-process", "new"]);
}

/// A database of schema version 9 under flow control (a group limit of 3, two leases of group
/// `a` counted) is upgraded to version 10 (grouped hand-outs in bulk) in place: the old
/// holder's step, as version 9 sends it, gives both slots back and hands group `a`, alone in
/// the turns, as many items as its limit leaves room for, in its order; the counts are those
/// of one hand-out after another; a group that joins takes its turn before `a`'s next item;
/// the rest comes out in the turns' order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_9_keeps_the_flow_counts() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    migrate_to(&pool, 9).await;
    // Version 9, used through its functions as its processes call them.
    pool.execute(
        "CREATE TABLE workqueue_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now(), serves_from integer);
         INSERT INTO workqueue_migrations (version, serves_from)
             VALUES (1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3), (7, 3), (8, 3), (9, 3);
         INSERT INTO workqueue_queues (id, name) VALUES (7, 'v9');
         SELECT workqueue_flow_set(7, true, true, NULL, 3, NULL, NULL, NULL, NULL, NULL, NULL,
             '{}', '{}', '{}', '{}', '{}', '{}');
         SELECT kinds FROM workqueue_enqueue(7,
             ARRAY['\"a1\"', '\"a2\"', '\"a3\"', '\"a4\"', '\"a5\"', '\"a6\"'],
             ARRAY['a', 'a', 'a', 'a', 'a', 'a'], ARRAY[NULL, NULL, NULL, NULL, NULL, NULL]::integer[],
             ARRAY[0, 0, 0, 0, 0, 0]::bigint[], ARRAY[false, false, false, false, false, false],
             0, 0, 0, 0);
         SELECT kind, items FROM workqueue_get(7, 2, 3600000000, false, 0, 0);",
    )
    .await
    .unwrap();
    let tokens = vec![token_of(&pool, "a1").await, token_of(&pool, "a2").await];

    let q: PgQueue<String> = PgQueue::builder("v9")
        .url(server.url())
        .poll_interval(Duration::from_secs(30))
        .group_by(|item: &String| item[..1].to_owned())
        .max_in_flight_per_group(3)
        .build()
        .await
        .expect("the upgrade runs at build");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, workq_postgres::SCHEMA_VERSION);
    let counts = || async {
        sqlx::query_as::<_, (i32, i32)>(
            "SELECT g.in_flight, f.in_flight FROM workqueue_groups g
                 JOIN workqueue_flow f ON f.queue = g.queue
             WHERE g.queue = 7 AND g.name = 'a'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(counts().await, (2, 2), "version 9 counted both leases");
    // The old holder's step, as version 9 sends it: both done, and three more of `a`.
    let (done, kind, items): (Vec<i32>, i32, Vec<String>) = sqlx::query_as(
        "SELECT done, kind, items FROM workqueue_step(7,
             ARRAY[workqueue_key('\"a1\"'), workqueue_key('\"a2\"')], $1, ARRAY[false, false],
             5, 3600000000, false, 0, 0)",
    )
    .bind(&tokens)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, [1, 1]);
    assert_eq!(kind, 1);
    assert_eq!(
        items,
        ["\"a3\"", "\"a4\"", "\"a5\""],
        "up to the group's limit, in order"
    );
    assert_eq!(counts().await, (3, 3));
    assert!(
        q.try_get().await.unwrap().is_empty(),
        "group a is at its limit"
    );
    // Group `b` joins; `a`'s slots come back through the new step, which hands out `b` first.
    q.add_all(["b1".to_owned(), "b2".to_owned()]).await.unwrap();
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT token FROM workqueue_items WHERE queue = 7 AND grp = 'a' AND token IS NOT NULL
         ORDER BY item",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (done, items): (Vec<i32>, Vec<String>) = sqlx::query_as(
        "SELECT done, items FROM workqueue_step(7,
             ARRAY[workqueue_key('\"a3\"'), workqueue_key('\"a4\"'), workqueue_key('\"a5\"')],
             $1, ARRAY[false, false, false], 3, 3600000000, false, 0, 0)",
    )
    .bind(&held)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, [1, 1, 1]);
    assert_eq!(
        items,
        ["\"b1\"", "\"a6\"", "\"b2\""],
        "the turns, one at a time"
    );
    assert_eq!(counts().await, (1, 3));
}

/// `Queue::done_and_next_many` (what batching `Workers` send): each lease's done and forget,
/// fenced on its own, in one statement; the next items in the queue's order; a stale lease
/// beside a current one is refused alone, and the batch still hands out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_and_next_many_forgets_where_asked_and_fences_each_lease() {
    use workq::{DoneMany, Queue};
    let Some(server) = PgServer::start() else {
        return;
    };
    let q: PgQueue<String> = PgQueue::builder(unique("step"))
        .url(server.url())
        .lease_duration(Duration::from_millis(400))
        .auto_renew(false)
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    assert!(
        Queue::batch_limit(&q) > 1,
        "Workers batch their steps on PostgreSQL"
    );
    q.add_all(["a", "b", "c", "d", "e", "f"].map(String::from))
        .await
        .unwrap();
    let held = q.try_get_many(3).await.unwrap();
    let last_token = held.iter().map(Lease::token).max().unwrap();
    for lease in &held {
        q.add_rate_limited(lease.item().clone()).await.unwrap();
    }
    let steps: Vec<(_, bool)> = held.into_iter().zip([true, false, true]).collect();
    let DoneMany { done, next } = Queue::done_and_next_many(&q, steps, 2).await.unwrap();
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(q.num_requeues("a".to_owned()).await.unwrap(), 0);
    assert_eq!(q.num_requeues("b".to_owned()).await.unwrap(), 1);
    assert_eq!(q.num_requeues("c".to_owned()).await.unwrap(), 0);
    let items: Vec<&str> = next.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(items, ["d", "e"]);
    assert!(next.iter().all(|l| l.token() > last_token));
    // A lease that expired and the one that took its item over, in one step.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let current = q.try_get_many(3).await.unwrap();
    let items: Vec<&str> = current.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(
        items,
        ["f", "d", "e"],
        "f first, then the reclaimed ones at the tail"
    );
    let stale = next.into_iter().next().unwrap();
    let steps: Vec<_> = std::iter::once((stale, true))
        .chain(current.into_iter().map(|l| (l, false)))
        .collect();
    q.add_rate_limited("d".to_owned()).await.unwrap();
    let DoneMany { done, next } = Queue::done_and_next_many(&q, steps, 5).await.unwrap();
    assert!(matches!(done[0], Err(Error::LeaseLost)), "{done:?}");
    assert!(done[1..].iter().all(Result::is_ok), "{done:?}");
    assert_eq!(
        q.num_requeues("d".to_owned()).await.unwrap(),
        1,
        "the stale holder's forget changed nothing"
    );
    assert!(next.is_empty(), "a, b, c wait for their backoff");
}
