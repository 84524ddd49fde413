//! A transient fault loses no done: a step the server rolls back (`lock_timeout`,
//! `statement_timeout`, a serialization failure, a deadlock) is sent again, and a step whose
//! connection was cut or whose server restarted is settled done by done; the leases are
//! renewed meanwhile, so another consumer takes nothing, and each done keeps its forget. Every
//! fault comes from a real concurrent transaction, a real `pg_terminate_backend` or a real
//! restart.

mod support;

use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};
use support::{PgServer, unique, waiting_for_a_lock};
use workq::{DoneMany, Outcome, Queue, Workers};
use workq_postgres::{Error, Lease, PgQueue};

const LEASE: Duration = Duration::from_secs(1);

/// A handle on queue `name` over a pool whose sessions run with `settings` (`SET` at
/// connect): leases of [`LEASE`], a backoff of zero (a rate-limited add is ready at once) and
/// no token bucket.
async fn handle(server: &PgServer, name: &str, settings: &[(&str, &str)]) -> PgQueue<String> {
    let options = PgConnectOptions::from_str(&server.url())
        .unwrap()
        .options(settings.iter().copied());
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect_with(options)
        .await
        .unwrap();
    PgQueue::builder(name)
        .pool(pool)
        .lease_duration(LEASE)
        .poll_interval(Duration::from_millis(100))
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(None)
        .build()
        .await
        .unwrap()
}

/// Five items, each with a failure counted, handed out on `q`.
async fn five_leases(q: &PgQueue<String>) -> Vec<Lease<String>> {
    for i in 0..5 {
        q.add_rate_limited(format!("item-{i}")).await.unwrap();
    }
    let leases = q.try_get_many(5).await.unwrap();
    assert_eq!(leases.len(), 5);
    leases
}

/// The step of `leases` (each done with a forget, as `Workers` send a success), in a task.
fn step(
    q: &PgQueue<String>,
    leases: Vec<Lease<String>>,
) -> tokio::task::JoinHandle<Result<DoneMany<Lease<String>, Error>, Error>> {
    let q = q.clone();
    tokio::spawn(async move {
        Queue::done_and_next_many(&q, leases.into_iter().map(|l| (l, true)).collect(), 0).await
    })
}

/// For `hold`, another consumer of the queue looks for work every 100 ms (sweeping expired
/// leases back) and must find none, while `step` keeps waiting.
async fn nobody_else_takes_them<R: std::fmt::Debug>(
    other: &PgQueue<String>,
    step: &mut tokio::task::JoinHandle<R>,
    hold: Duration,
) {
    let started = Instant::now();
    while started.elapsed() < hold {
        if let Some(lease) = other.try_get().await.unwrap().into_lease() {
            panic!(
                "{} was handed out again after {:?}",
                lease.item(),
                started.elapsed()
            );
        }
        if step.is_finished() {
            panic!("the step ended during the fault: {:?}", step.await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the fault: every done applied with its forget, nothing left or handed out again.
async fn all_done(
    q: &PgQueue<String>,
    other: &PgQueue<String>,
    step: tokio::task::JoinHandle<Result<DoneMany<Lease<String>, Error>, Error>>,
) {
    let out = step.await.unwrap().expect("the step");
    assert!(out.done.iter().all(Result::is_ok), "{:?}", out.done);
    for i in 0..5 {
        assert_eq!(
            q.num_requeues(format!("item-{i}")).await.unwrap(),
            0,
            "the forget of item-{i}"
        );
    }
    assert_eq!(q.processing_len().await.unwrap(), 0);
    assert_eq!(q.len().await.unwrap(), 0);
    tokio::time::sleep(LEASE).await;
    assert!(other.try_get().await.unwrap().into_lease().is_none());
}

/// A pool without timeouts, for the concurrent transactions.
async fn admin(server: &PgServer) -> PgPool {
    PgPool::connect(&server.url()).await.unwrap()
}

/// A transaction that holds `lock` on a table of the queue.
async fn locking(admin: &PgPool, lock: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = admin.begin().await.unwrap();
    tx.execute(lock).await.unwrap();
    tx
}

/// The pool has `lock_timeout = 100ms`. A transaction holds the failure table for three
/// lease durations, so the step's forgets time out again and again (55P03): the step is
/// sent again each time, its leases renewed, and it applies once the table is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_meets_lock_timeout_is_sent_again() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("lock-timeout");
    let q = handle(&server, &name, &[("lock_timeout", "100ms")]).await;
    let other = handle(&server, &name, &[]).await;
    let admin = admin(&server).await;
    let leases = five_leases(&q).await;
    let tx = locking(&admin, "LOCK TABLE workqueue_failures IN EXCLUSIVE MODE").await;
    let mut step = step(&q, leases);
    nobody_else_takes_them(&other, &mut step, LEASE * 3).await;
    tx.rollback().await.unwrap();
    all_done(&q, &other, step).await;
}

/// The same with `statement_timeout = 150ms` (57014).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_meets_statement_timeout_is_sent_again() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("statement-timeout");
    let q = handle(&server, &name, &[("statement_timeout", "150ms")]).await;
    let other = handle(&server, &name, &[]).await;
    let admin = admin(&server).await;
    let leases = five_leases(&q).await;
    let tx = locking(&admin, "LOCK TABLE workqueue_failures IN EXCLUSIVE MODE").await;
    let mut step = step(&q, leases);
    nobody_else_takes_them(&other, &mut step, LEASE * 3).await;
    tx.rollback().await.unwrap();
    all_done(&q, &other, step).await;
}

/// A deadlock that the server breaks by cancelling the step (40P01): a transaction holds the
/// failure table, the step waits for it while holding item rows, then the transaction asks
/// for the items table. The step (whose session checks for deadlocks after 500 ms, the
/// transaction's after a minute) is the one rolled back; it is sent again and applies once
/// the transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_chosen_as_a_deadlock_victim_is_sent_again() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("deadlock");
    let q = handle(&server, &name, &[("deadlock_timeout", "500ms")]).await;
    let other = handle(&server, &name, &[]).await;
    let admin = admin(&server).await;
    // Read afresh each time (the cumulative statistics reach other sessions within a second
    // or so).
    sqlx::query("SET stats_fetch_consistency = none")
        .execute(&admin)
        .await
        .unwrap();
    let deadlocks = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let before = deadlocks().await;
    let leases = five_leases(&q).await;
    let mut tx = locking(
        &admin,
        "SET LOCAL deadlock_timeout = '60s'; LOCK TABLE workqueue_failures IN EXCLUSIVE MODE",
    )
    .await;
    let step = step(&q, leases);
    waiting_for_a_lock(&admin, "workqueue_step").await;
    // The transaction now waits for the step, which waits for the transaction.
    // Granted once the server cancelled the step (the transaction would have been the victim
    // otherwise, and this would fail).
    tx.execute("LOCK TABLE workqueue_items IN EXCLUSIVE MODE")
        .await
        .expect("the step is the deadlock's victim");
    // The step, sent again, waits for the transaction (which holds both tables now).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!step.is_finished());
    tx.rollback().await.unwrap();
    all_done(&q, &other, step).await;
    // The server counted it (its statistics reach other sessions once the step's session
    // is idle).
    let started = Instant::now();
    while deadlocks().await == before {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no deadlock counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(deadlocks().await - before, 1);
}

/// At `SERIALIZABLE` (the pool's default isolation), a done that waited for a row another
/// transaction changed fails with a serialization failure (40001) when that transaction
/// commits: it is sent again, and the item, re-added by that transaction, is queued again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_that_meets_a_serialization_failure_is_sent_again() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("serialization");
    let q = handle(
        &server,
        &name,
        &[("default_transaction_isolation", "serializable")],
    )
    .await;
    let admin = admin(&server).await;
    q.add("x".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let token = lease.token();
    let mut tx = admin.begin().await.unwrap();
    q.add_in(&mut tx, "x".to_owned()).await.unwrap();
    let done = tokio::spawn({
        let q = q.clone();
        async move { q.done_and_get(lease, true).await }
    });
    waiting_for_a_lock(&admin, "workqueue_").await;
    tx.commit().await.unwrap();
    let next = done.await.unwrap().expect("the done, sent again");
    let next = match next {
        Some(next) => next,
        None => q
            .try_get()
            .await
            .unwrap()
            .into_lease()
            .expect("queued again"),
    };
    assert_eq!(next.item(), "x");
    assert!(next.token() > token);
    next.done().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 0);
}

/// The step's connection is terminated (`pg_terminate_backend`) while it waits: whether it
/// was applied is unknown to the client, so each done is settled on its own, the leases
/// renewed meanwhile, and each applies (it was not) with its forget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_connection_is_terminated_is_settled_done_by_done() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("terminated");
    let q = handle(&server, &name, &[]).await;
    let other = handle(&server, &name, &[]).await;
    let admin = admin(&server).await;
    let leases = five_leases(&q).await;
    let tx = locking(&admin, "LOCK TABLE workqueue_failures IN EXCLUSIVE MODE").await;
    let mut step = step(&q, leases);
    let pid = waiting_for_a_lock(&admin, "workqueue_step").await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    nobody_else_takes_them(&other, &mut step, LEASE * 3).await;
    tx.rollback().await.unwrap();
    all_done(&q, &other, step).await;
}

/// The server is killed (`kill -9`, its backends too) with leases out, and restarted 1.5 s
/// later: the step sent meanwhile is settled done by done once the server is back, with its
/// forgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_sent_while_the_server_restarts_is_settled() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let q = PgQueue::<String>::builder(unique("restart"))
        .url(server.url())
        .lease_duration(Duration::from_secs(10))
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    let leases = five_leases(&q).await;
    server.kill_with_backends();
    let step = step(&q, leases);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if step.is_finished() {
        panic!("the step ended while the server was down: {:?}", step.await);
    }
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let out = step.await.unwrap().expect("the step");
    assert!(out.done.iter().all(Result::is_ok), "{:?}", out.done);
    for i in 0..5 {
        assert_eq!(q.num_requeues(format!("item-{i}")).await.unwrap(), 0);
    }
    assert_eq!(q.processing_len().await.unwrap(), 0);
    assert_eq!(q.len().await.unwrap(), 0);
    drop(server);
}

/// The fault a pool of `Workers` meets in [`workers_ride_out`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The pool's sessions have `lock_timeout = 100ms`: the step is rolled back (55P03)
    /// again and again while the failure table is held.
    LockTimeout,
    /// The pool's sessions have `statement_timeout = 150ms` (57014), the same way.
    StatementTimeout,
    /// The step waiting for the table has its backend terminated
    /// (`pg_terminate_backend`): it is settled done by done.
    Terminated,
    /// The step waiting for the table becomes a deadlock's victim (40P01): the transaction
    /// holding the failure table then asks for the items table, and keeps both 300 ms (with
    /// the items table held no lease can be renewed, so longer than a lease would be a lost
    /// lease, not this fault).
    Deadlock,
}

/// Through `Workers`: four workers each finish an item (each failed once before, so its
/// success forgets a failure) while a transaction holds the failure table for three lease
/// durations (but see [`Fault::Deadlock`]), so the pool's step carrying their dones meets
/// `fault`. Another consumer takes
/// nothing meanwhile (but during the deadlock, when the transaction holds the items table
/// too); every item is handled once, with its failures forgotten, no lease is lost and the
/// pool takes new work afterwards.
async fn workers_ride_out(fault: Fault) {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique(&format!("workers-{fault:?}").to_lowercase());
    let settings: &[(&str, &str)] = match fault {
        Fault::LockTimeout => &[("lock_timeout", "100ms")],
        Fault::StatementTimeout => &[("statement_timeout", "150ms")],
        Fault::Terminated => &[],
        Fault::Deadlock => &[("deadlock_timeout", "500ms")],
    };
    let q = handle(&server, &name, settings).await;
    let other = handle(&server, &name, &[]).await;
    let admin = admin(&server).await;
    let items: Vec<String> = (0..4).map(|i| format!("w-{i}")).collect();
    for item in &items {
        q.add_rate_limited(item).await.unwrap();
    }
    let handled = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let workers = {
        let handled = handled.clone();
        Workers::new(q.clone())
            .count(4)
            .spawn_async(move |item: String| {
                let handled = handled.clone();
                let mut go = go.clone();
                async move {
                    let _ = go.wait_for(|g| *g).await;
                    handled.lock().unwrap().push(item);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Outcome::Done
                }
            })
    };
    // Every item is in a handler (nothing is left queued for the other consumer to take).
    let started = Instant::now();
    while q.processing_len().await.unwrap() < items.len() {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut tx = locking(&admin, "LOCK TABLE workqueue_failures IN EXCLUSIVE MODE").await;
    if fault == Fault::Deadlock {
        tx.execute("SET LOCAL deadlock_timeout = '60s'")
            .await
            .unwrap();
    }
    go_tx.send_replace(true);
    match fault {
        Fault::LockTimeout | Fault::StatementTimeout => {}
        Fault::Terminated => {
            let pid = waiting_for_a_lock(&admin, "workqueue_step").await;
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .unwrap();
            assert!(killed);
        }
        Fault::Deadlock => {
            waiting_for_a_lock(&admin, "workqueue_step").await;
            // Granted once the server cancelled the step (the transaction would have been
            // the victim otherwise, and this would fail).
            tx.execute("LOCK TABLE workqueue_items IN EXCLUSIVE MODE")
                .await
                .expect("the step is the deadlock's victim");
        }
    }
    let hold = if fault == Fault::Deadlock {
        Duration::from_millis(300)
    } else {
        LEASE * 3
    };
    let started = Instant::now();
    while started.elapsed() < hold {
        // With the items table held, the other consumer would only wait for it.
        if fault != Fault::Deadlock {
            assert!(other.try_get().await.unwrap().into_lease().is_none());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        handled.lock().unwrap().len() == items.len(),
        "every handler ran once"
    );
    tx.rollback().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while q.len().await.unwrap() + q.processing_len().await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the items were not all done");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A lease past its time would now be handed out again: nothing is.
    tokio::time::sleep(LEASE).await;
    assert!(other.try_get().await.unwrap().into_lease().is_none());
    // The pool goes on taking work.
    q.add("after".to_owned()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while handled.lock().unwrap().len() < items.len() + 1 {
        assert!(Instant::now() < deadline, "the pool took no new work");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = workers.shut_down().await;
    let mut handled = handled.lock().unwrap().clone();
    handled.sort();
    let mut want = items.clone();
    want.push("after".to_owned());
    want.sort();
    assert_eq!(
        handled, want,
        "{fault:?}: each item handled once: {summary:?}"
    );
    assert_eq!(summary.succeeded, 5, "{fault:?}: {summary:?}");
    assert_eq!(summary.lease_lost, 0, "{fault:?}: {summary:?}");
    for item in &items {
        assert_eq!(
            other.num_requeues(item).await.unwrap(),
            0,
            "{fault:?}: the forget of {item}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lose_no_done_to_a_lock_timeout() {
    workers_ride_out(Fault::LockTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lose_no_done_to_a_statement_timeout() {
    workers_ride_out(Fault::StatementTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lose_no_done_when_their_steps_connection_is_terminated() {
    workers_ride_out(Fault::Terminated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lose_no_done_to_a_deadlock() {
    workers_ride_out(Fault::Deadlock).await;
}
