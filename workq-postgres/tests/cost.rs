//! What the queue costs the database: an idle getter a query per poll interval (also when the
//! only due row is locked by someone's transaction, whose commit wakes it); a delayed backlog
//! nothing per get (every statement reads through index bounds); renewals HOT updates; a
//! shared pool any number of queues; and a `LISTEN` connection that is replaced when it dies
//! or hangs, without losing a wake-up.
//!
//! Statement counts and buffer reads come from `pg_stat_statements` (the test server loads it,
//! with nested statements tracked).

mod support;

use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{PgServer, unique};
use workq::AddOptions;
use workq_postgres::{APPLICATION_NAME, PgQueue};

async fn admin(server: &PgServer) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn reset(admin: &PgPool) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(admin)
        .await
        .unwrap();
}

/// Calls of the statements whose text contains `needle`, since the last reset.
async fn calls(admin: &PgPool, needle: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE query LIKE '%' || $1 || '%'",
    )
    .bind(needle)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Buffers (hit or read) per call of the statements whose text contains `needle`.
async fn blocks_per_call(admin: &PgPool, needle: &str) -> f64 {
    let (blocks, calls): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint,
                coalesce(sum(calls), 0)::bigint
         FROM pg_stat_statements WHERE query LIKE '%' || $1 || '%'",
    )
    .bind(needle)
    .fetch_one(admin)
    .await
    .unwrap();
    assert!(calls > 0, "no call of a statement with {needle:?}");
    blocks as f64 / calls as f64
}

/// The toplevel call of a get.
const GET: &str = "FROM workqueue_get(";

async fn queue(server: &PgServer, poll: Duration) -> PgQueue<String> {
    PgQueue::builder(unique("cost"))
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .poll_interval(poll)
        .build()
        .await
        .expect("connect to the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_getter_on_an_empty_queue_costs_a_query_per_poll_interval() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, Duration::from_secs(1)).await;
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    reset(&admin).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = calls(&admin, GET).await;
    // Three getters, one look per second each (an empty queue cost hundreds a second).
    assert!(n <= 3 * 6, "{n} gets in 4 s");
    q.add("x".to_owned()).await.unwrap();
    q.shut_down();
    let mut got = 0;
    for getter in getters {
        if let Some(lease) = getter.await.unwrap().unwrap() {
            got += 1;
            lease.done().await.unwrap();
        }
    }
    assert!(got <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_row_locked_by_a_transaction_costs_nothing_until_its_commit_wakes_the_getter() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, Duration::from_secs(30)).await;
    q.add_after("a".to_owned(), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A transaction raises the due item's priority: it holds the row until it commits.
    let mut tx = q.pool().begin().await.unwrap();
    q.add_with_in(&mut tx, "a".to_owned(), AddOptions::default().priority(5))
        .await
        .unwrap();
    reset(&admin).await;
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!getter.is_finished());
    let n = calls(&admin, GET).await;
    assert!(n <= 2, "{n} gets while the row was locked: a busy loop");
    let committed = Instant::now();
    tx.commit().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("woken by the commit (the poll interval is 30 s)")
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(committed.elapsed() < Duration::from_secs(10));
    assert_eq!((lease.item().as_str(), lease.priority()), ("a", 5));
    lease.done().await.unwrap();

    // A duplicate of a queued item inside a transaction locks nothing: a getter takes the
    // item while the transaction is still open.
    q.add("b".to_owned()).await.unwrap();
    let mut tx = q.pool().begin().await.unwrap();
    q.add_in(&mut tx, "b".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), q.get())
        .await
        .expect("not blocked by the open transaction")
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "b");
    tx.rollback().await.unwrap();
    lease.done().await.unwrap();
}

/// Cycles of add, get and done on `q`: the per-call buffers of the get's statements (the
/// promotion of due items, the choice of the next ready ones, their claim, the whole get).
async fn cycle_costs(admin: &PgPool, q: &PgQueue<String>) -> (f64, f64, f64, f64) {
    reset(admin).await;
    for i in 0..200 {
        q.add(format!("c{i}")).await.unwrap();
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        lease.done().await.unwrap();
    }
    (
        blocks_per_call(admin, "ORDER BY d.due LIMIT").await,
        blocks_per_call(admin, "array_agg(l.key ORDER BY l.p DESC").await,
        blocks_per_call(admin, "WITH leased AS").await,
        blocks_per_call(admin, GET).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_backlog_adds_nothing_to_the_cost_of_a_get() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let empty = queue(&server, Duration::from_secs(30)).await;
    let backlog = queue(&server, Duration::from_secs(30)).await;
    for chunk in 0..50 {
        backlog
            .add_all_after(
                (0..1000).map(|i| (format!("later-{chunk}-{i}"), Duration::from_secs(3600))),
            )
            .await
            .unwrap();
    }
    // Some leases held too: the sweep of expired leases reads the leased rows, at most once
    // per sweep interval, not per get.
    backlog
        .add_all((0..50).map(|i| format!("held-{i}")))
        .await
        .unwrap();
    let held = backlog.try_get_many(50).await.unwrap();
    assert_eq!(held.len(), 50);
    sqlx::query("ANALYZE workqueue_items")
        .execute(&admin)
        .await
        .unwrap();
    let (promote0, next0, claim0, get0) = cycle_costs(&admin, &empty).await;
    let (promote1, next1, claim1, get1) = cycle_costs(&admin, &backlog).await;
    println!(
        "buffers per call, empty queue / 50,000 delayed: promotion {promote0:.1} / {promote1:.1}, \
         next {next0:.1} / {next1:.1}, claim {claim0:.1} / {claim1:.1}, \
         whole get {get0:.1} / {get1:.1}"
    );
    // An index scan that reads every delayed row would read hundreds of buffers per call.
    for (what, a, b) in [
        ("promotion", promote0, promote1),
        ("next", next0, next1),
        ("claim", claim0, claim1),
        ("get", get0, get1),
    ] {
        assert!(
            b <= a * 1.5 + 4.0,
            "{what}: {a:.1} buffers per call empty, {b:.1} behind the backlog"
        );
    }
    let _ = backlog
        .done_and_get_many(held.into_iter().map(|l| (l, false)).collect(), 0)
        .await
        .unwrap();
}

/// Statistics taken while the table was nearly empty (a fresh deployment, a queue that grew
/// in a minute, before autovacuum analyzed it) say a queue holds a row or two. The claim and
/// the adds' duplicate check must still go to their rows by the primary key or the physical
/// address, not read the whole queue and filter (they did: 500 buffers per get behind 20,000
/// ready items).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_statistics_do_not_turn_a_get_or_an_add_into_a_scan_of_the_queue() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let small = queue(&server, Duration::from_secs(30)).await;
    let big = queue(&server, Duration::from_secs(30)).await;
    small.add("seed".to_owned()).await.unwrap();
    sqlx::query("ANALYZE workqueue_items")
        .execute(&admin)
        .await
        .unwrap();
    let (_, _, small_claim, small_get) = cycle_costs(&admin, &small).await;
    for chunk in 0..20 {
        big.add_all((0..1000).map(|i| format!("ready-{chunk}-{i}")))
            .await
            .unwrap();
    }
    let (_, _, claim, get) = cycle_costs(&admin, &big).await;
    // The adds' check for an existing row, on a batch of duplicates and new items.
    reset(&admin).await;
    for i in 0..20 {
        let batch = [
            format!("ready-0-{i}"),
            format!("new-{i}"),
            format!("ready-19-{i}"),
        ];
        big.add_all(&batch).await.unwrap();
    }
    let probe = blocks_per_call(&admin, "array_agg(f.seq IS NOT NULL").await;
    println!(
        "buffers per call, 1 ready item / 20,000 behind stale statistics: claim \
         {small_claim:.1} / {claim:.1}, whole get {small_get:.1} / {get:.1}; \
         duplicate check of 3 adds {probe:.1}"
    );
    // A scan of the queue reads its 20,000 rows: hundreds of buffers per call.
    assert!(
        claim <= small_claim * 1.5 + 8.0,
        "claim: {claim:.1} buffers per call"
    );
    assert!(
        get <= small_get * 1.5 + 16.0,
        "get: {get:.1} buffers per call"
    );
    assert!(
        probe <= 30.0,
        "duplicate check: {probe:.1} buffers per call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_hot_updates() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q: PgQueue<String> = PgQueue::builder(unique("hot"))
        .url(server.url())
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    q.add("held".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let hot = || async {
        let (updates, hot): (i64, i64) = sqlx::query_as(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
             WHERE relname = 'workqueue_items'",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        (updates, hot)
    };
    // Statistics arrive within a few seconds of a backend's activity.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = hot().await;
    for _ in 0..100 {
        lease.renew().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = hot().await;
        let (updates, hot_updates) = (now.0 - before.0, now.1 - before.1);
        if updates >= 100 {
            assert!(
                hot_updates >= 90,
                "{hot_updates} of {updates} renewals were HOT updates"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "statistics never showed the renewals"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    lease.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queues_share_a_small_pool_and_one_listen_connection() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .unwrap();
    let mut queues = Vec::new();
    for i in 0..6 {
        let q: PgQueue<String> = tokio::time::timeout(
            Duration::from_secs(30),
            PgQueue::builder(unique(&format!("shared-{i}")))
                .pool(pool.clone())
                .poll_interval(Duration::from_secs(30))
                .build(),
        )
        .await
        .expect("a queue builds on a pool of 3 whatever the number of queues")
        .unwrap();
        queues.push(q);
    }
    // Two getters per queue wait at once; adds wake them.
    let mut getters = Vec::new();
    for q in &queues {
        for _ in 0..2 {
            let q = q.clone();
            getters.push(tokio::spawn(async move {
                let lease = q.get().await.unwrap().unwrap();
                lease.done().await.unwrap();
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for q in &queues {
        q.add_all(["a", "b"].map(String::from)).await.unwrap();
    }
    for getter in getters {
        tokio::time::timeout(Duration::from_secs(20), getter)
            .await
            .expect("every getter is woken and served")
            .unwrap();
    }
    let listeners: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(APPLICATION_NAME)
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(
        listeners, 1,
        "one LISTEN connection for every queue of the process"
    );
}

/// The backend of the `LISTEN` connection, other than `not`.
async fn listener_pid(admin: &PgPool, not: i32) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2 LIMIT 1",
    )
    .bind(APPLICATION_NAME)
    .bind(not)
    .fetch_optional(admin)
    .await
    .unwrap()
}

/// Waits for a `LISTEN` connection other than `old`.
async fn new_listener(admin: &PgPool, old: i32, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(pid) = listener_pid(admin, old).await {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "the LISTEN connection was not replaced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listen_connection_is_replaced_without_losing_a_wake_up() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, Duration::from_secs(60)).await;
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old = listener_pid(&admin, 0).await.expect("a LISTEN connection");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(old)
        .execute(&admin)
        .await
        .unwrap();
    // Added while no connection listens: its notification is lost, and the getter still gets
    // the item long before its poll interval, from the look every getter takes after the
    // connection is replaced.
    let added = Instant::now();
    q.add("missed".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(20), getter)
        .await
        .expect("served without waiting for the 60 s poll")
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(added.elapsed() < Duration::from_secs(20));
    lease.done().await.unwrap();
    new_listener(&admin, old, Duration::from_secs(10)).await;
    // And the new connection delivers.
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    q.add("next".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("woken through the new connection")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "next");
    lease.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_listen_connection_is_noticed_and_replaced() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    // The idle connection is pinged every second; a ping unanswered for 5 s replaces it.
    let q = queue(&server, Duration::from_secs(1)).await;
    let old = listener_pid(&admin, 0).await.expect("a LISTEN connection");
    // The backend stops answering (as behind a dead network link).
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &old.to_string()])
        .status()
        .unwrap();
    assert!(stop.success());
    let replaced = new_listener(&admin, old, Duration::from_secs(30)).await;
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &old.to_string()])
        .status();
    assert_ne!(replaced, old);
    q.add("after".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), q.get())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    lease.done().await.unwrap();
}

/// A queue built without any flow control setting runs the statements it ran before flow
/// control existed, at the same cost: per get (one item handed out from 200 ready), the
/// statements the server runs, nested ones included, exactly; and per get in cycles of add,
/// get and done, the buffers the get reads, within the noise (they vary with the dead index
/// entries of earlier cycles that a claim steps over before they are marked dead: 17.5 to 34
/// per get in repeated runs, before flow control and after). Measured before flow control was
/// written: 5 statements and about 22 buffers per get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_without_flow_control_costs_what_it_did_before_flow_control() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, Duration::from_secs(30)).await;
    q.add_all((0..200).map(|i| format!("plain-{i}")))
        .await
        .unwrap();
    // The first get sweeps expired leases; the measured ones do not.
    let first = q.try_get().await.unwrap().into_lease().unwrap();
    reset(&admin).await;
    let mut held = Vec::new();
    for _ in 0..199 {
        held.push(q.try_get().await.unwrap().into_lease().unwrap());
    }
    let statements = statements_per_call(&admin, 199).await;
    first.done().await.unwrap();
    let _ = q
        .done_and_get_many(held.into_iter().map(|l| (l, false)).collect(), 0)
        .await
        .unwrap();
    let (_, _, _, buffers) = cycle_costs(&admin, &q).await;
    println!("without flow control, per get: {statements:.2} statements, {buffers:.1} buffers");
    assert!(
        statements <= PLAIN_STATEMENTS_PER_GET + 0.01,
        "{statements:.2} statements per get, {PLAIN_STATEMENTS_PER_GET} before flow control"
    );
    assert!(
        buffers <= PLAIN_BUFFERS_PER_GET * 1.5 + 8.0,
        "{buffers:.1} buffers per get, about {PLAIN_BUFFERS_PER_GET} before flow control"
    );
}

/// Statements the server ran since the last reset (nested ones included, the statistics'
/// own left out), per one of `calls`.
async fn statements_per_call(admin: &PgPool, calls: i64) -> f64 {
    let statements: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE query NOT LIKE '%pg_stat_statements%'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    statements as f64 / calls as f64
}

/// Statements per get on a queue without flow control, as measured before flow control.
const PLAIN_STATEMENTS_PER_GET: f64 = 5.0;

/// Buffers per get on a queue without flow control, as measured before flow control.
const PLAIN_BUFFERS_PER_GET: f64 = 22.0;

/// Cycles of add, get and done on a queue with flow control whose items are spread over
/// `groups` groups: the buffers per get (the whole get, its statements included), per cycle
/// (the add, the get and the done), and the statements per cycle.
async fn flow_cycle_costs(admin: &PgPool, q: &PgQueue<String>, groups: usize) -> (f64, f64, f64) {
    reset(admin).await;
    for i in 0..200 {
        q.add(format!("g{}/c{i}", (i * 7) % groups)).await.unwrap();
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        lease.done().await.unwrap();
    }
    let cycle: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
         FROM pg_stat_statements WHERE toplevel AND query NOT LIKE '%pg_stat_statements%'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    (
        blocks_per_call(admin, GET).await,
        cycle as f64 / 200.0,
        statements_per_call(admin, 200).await,
    )
}

/// A queue with flow control whose items are spread over `groups` groups (2 ready items
/// each), one get already made (it folds the adds into the groups).
async fn grouped_queue(server: &PgServer, groups: usize) -> PgQueue<String> {
    let q: PgQueue<String> = PgQueue::builder(unique("groups"))
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(30))
        .group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
        .max_in_flight_per_group(1)
        .build()
        .await
        .expect("connect to the test server");
    q.add_all((0..groups * 2).map(|i| format!("g{}/ready-{i}", i % groups)))
        .await
        .unwrap();
    let first = q.try_get().await.unwrap().into_lease().unwrap();
    first.done().await.unwrap();
    q
}

/// Vacuums the arrivals the first gets folded in (20,000 rows for 10,000 groups), as
/// autovacuum does within a minute (the table is vacuumed after every 1,000 dead rows):
/// until then a fold reads past their index entries, a burst's cost, not the groups'.
async fn vacuum_arrivals(admin: &PgPool) {
    sqlx::query("VACUUM workqueue_arrivals")
        .execute(admin)
        .await
        .unwrap();
}

/// The next group to hand out is found through an index: the buffers a get reads do not grow
/// with the number of groups, also when the statistics were taken while the tables were
/// nearly empty (a fresh deployment). With 10 groups and with 10,000 (20,000 ready items), a
/// get (folding the adds in, the turns, the group's next item, the lease, the group's new
/// place, its limit) reads about the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_groups_a_get_reads_as_much_at_10_as_at_10000_groups() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let seed = grouped_queue(&server, 1).await;
    sqlx::query("ANALYZE workqueue_items, workqueue_groups, workqueue_arrivals, workqueue_flow")
        .execute(&admin)
        .await
        .unwrap();
    let few = grouped_queue(&server, 10).await;
    vacuum_arrivals(&admin).await;
    let (few_get, few_cycle, few_statements) = flow_cycle_costs(&admin, &few, 10).await;
    let many = grouped_queue(&server, 10_000).await;
    vacuum_arrivals(&admin).await;
    let (many_get, many_cycle, many_statements) = flow_cycle_costs(&admin, &many, 10_000).await;
    println!(
        "with flow control, behind stale statistics, 10 groups / 10,000 groups: per get \
         {few_get:.1} / {many_get:.1} buffers; per cycle of add, get and done {few_cycle:.1} / \
         {many_cycle:.1} buffers, {few_statements:.1} / {many_statements:.1} statements"
    );
    // A scan of the groups (or of the queue's ready items) reads their 10,000 rows (20,000):
    // hundreds of buffers per call.
    assert!(
        many_get <= few_get * 1.5 + 16.0,
        "{many_get:.1} buffers per get at 10,000 groups, {few_get:.1} at 10"
    );
    assert!(
        many_cycle <= few_cycle * 1.5 + 32.0,
        "{many_cycle:.1} buffers per cycle at 10,000 groups, {few_cycle:.1} at 10"
    );
    drop(seed);
}
