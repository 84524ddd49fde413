//! Locks: one locked row holds one item, not the pool; rate-limited batches are one-by-one
//! adds (the token bucket spent in the batch's order); and one lock order everywhere, so a
//! batch in a caller's transaction never deadlocks with single adds and running workers.

mod support;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::{PgServer, unique, waiting_for_a_lock};
use workq::{AddOptions, Outcome, Workers};
use workq_postgres::PgQueue;

/// Waits until `check` holds, for at most `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pool of `max` connections to `server`, whose sessions give up a lock wait after 100 ms
/// (55P03) if `lock_timeout`.
async fn a_pool(server: &PgServer, max: u32, lock_timeout: bool) -> PgPool {
    let settings: &[(&str, &str)] = if lock_timeout {
        &[("lock_timeout", "100ms")]
    } else {
        &[]
    };
    let options = PgConnectOptions::from_str(&server.url())
        .unwrap()
        .options(settings.iter().copied());
    PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options)
        .await
        .unwrap()
}

/// What the handlers saw: how often each item was handled, and any item handled by two
/// workers at once.
#[derive(Default)]
struct Seen {
    handled: HashMap<String, usize>,
    running: Vec<String>,
    overlaps: Vec<String>,
}

impl Seen {
    fn start(&mut self, item: &str) {
        if self.running.iter().any(|i| i == item) {
            self.overlaps.push(item.to_owned());
        }
        self.running.push(item.to_owned());
    }

    fn end(&mut self, item: &str) {
        self.running.retain(|i| i != item);
        *self.handled.entry(item.to_owned()).or_default() += 1;
    }

    fn handled(&self, item: &str) -> usize {
        self.handled.get(item).copied().unwrap_or(0)
    }
}

/// A user's open transaction holds the rows of two items being processed (it adds them again)
/// for three lease durations: `held-done`, whose handler ends at once (its done meets the
/// locked row), and `held-busy`, whose handler runs until the transaction ends (its renewals
/// meet the locked row). Meanwhile ten other items are added: all ten are processed while the
/// rows are held. Then the transaction rolls back (or commits, which queues both again), and
/// each held item is done: once (or twice, one after the other), never by two workers at once.
///
/// With `lock_timeout`, the pool's sessions give up a lock wait after 100 ms (55P03): the
/// held item's done is then sent again and again until the row is free, while its renewal
/// (which waits whatever the timeout) keeps the lease.
///
/// The leases run out in the table while their rows are held (nothing can renew them):
/// when the transaction ends, the waiting renewal or done must take the row before any
/// sweep takes the lease back, or the item goes to a second worker.
async fn one_locked_row_holds_one_item(commit: bool, lock_timeout: bool) {
    let Some(server) = PgServer::start() else {
        return;
    };
    let lease = Duration::from_secs(1);
    let pool = a_pool(&server, 8, lock_timeout).await;
    let q: PgQueue<String> = PgQueue::builder(unique("locked"))
        .pool(pool)
        .lease_duration(lease)
        .poll_interval(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    q.add_all(["held-done", "held-busy"].map(String::from))
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (locked_tx, locked) = tokio::sync::watch::channel(false);
    let (released_tx, released) = tokio::sync::watch::channel(false);
    let workers = {
        let seen = seen.clone();
        Workers::new(q.clone())
            .count(4)
            .spawn_async(move |item: String| {
                let seen = seen.clone();
                let mut locked = locked.clone();
                let mut released = released.clone();
                async move {
                    seen.lock().unwrap().start(&item);
                    if item.starts_with("held") && !*released.borrow() {
                        let _ = locked.wait_for(|l| *l).await;
                        if item == "held-busy" {
                            let _ = released.wait_for(|r| *r).await;
                        }
                    }
                    seen.lock().unwrap().end(&item);
                    Outcome::Done
                }
            })
    };
    // Both held items are being processed.
    eventually(
        "both held items in a handler",
        Duration::from_secs(10),
        || {
            let seen = seen.clone();
            async move { seen.lock().unwrap().running.len() == 2 }
        },
    )
    .await;
    let mut tx = q.pool().begin().await.unwrap();
    q.add_all_in(&mut tx, ["held-done", "held-busy"].map(String::from))
        .await
        .unwrap();
    let held_since = Instant::now();
    locked_tx.send_replace(true);
    let others: Vec<String> = (0..10).map(|i| format!("other-{i}")).collect();
    for item in &others {
        q.add(item.clone()).await.unwrap();
    }
    let hold = lease * 3;
    while others.iter().any(|o| seen.lock().unwrap().handled(o) == 0) {
        assert!(
            held_since.elapsed() < hold,
            "while one transaction held two rows, {} of 10 other items finished",
            others
                .iter()
                .filter(|o| seen.lock().unwrap().handled(o) == 1)
                .count()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(hold.saturating_sub(held_since.elapsed())).await;
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    released_tx.send_replace(true);
    let times = if commit { 2 } else { 1 };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (done, busy) = {
            let seen = seen.lock().unwrap();
            (seen.handled("held-done"), seen.handled("held-busy"))
        };
        let (processing, ready, delayed) = (
            q.processing_len().await.unwrap(),
            q.len().await.unwrap(),
            q.delayed_len().await.unwrap(),
        );
        if done == times && busy == times && processing + ready + delayed == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every held item done: held-done handled {done}, held-busy \
             {busy} (expected {times} each); {processing} processing, {ready} ready, {delayed} \
             delayed; the pool: {:?}; the handlers: {:?}",
            workers.stats(),
            seen.lock().unwrap().running
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Nothing more comes: each held item was done exactly as often as it was added.
    tokio::time::sleep(lease * 2).await;
    let summary = workers.shut_down().await;
    {
        let seen = seen.lock().unwrap();
        assert!(
            seen.overlaps.is_empty(),
            "two holders at once: {:?}",
            seen.overlaps
        );
        assert_eq!(seen.handled("held-done"), times);
        assert_eq!(seen.handled("held-busy"), times);
        for item in &others {
            assert_eq!(seen.handled(item), 1, "{item}");
        }
    }
    assert_eq!(summary.lease_lost, 0, "{summary:?}");
    assert_eq!(summary.succeeded, 10 + 2 * times as u64, "{summary:?}");
    let stalls: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workqueue_dead WHERE queue = (SELECT id FROM workqueue_queues
         WHERE name = $1)",
    )
    .bind(q.name())
    .fetch_one(&PgPool::connect(&server.url()).await.unwrap())
    .await
    .unwrap();
    assert_eq!(stalls, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_locked_row_holds_one_item_not_the_pool_rolled_back() {
    one_locked_row_holds_one_item(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_locked_row_holds_one_item_not_the_pool_committed() {
    one_locked_row_holds_one_item(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_locked_row_holds_one_item_not_the_pool_under_lock_timeout() {
    one_locked_row_holds_one_item(false, true).await;
}

/// What a holder's call does while another transaction holds its item's row.
#[derive(Clone, Copy, Debug)]
enum Waiting {
    Renew,
    Done,
    Release,
    Retry,
}

/// A call of the lease's holder that waits for the item's row (another transaction holds it)
/// keeps the lease while it waits, though the lease runs out in the table meanwhile: a sweep
/// run then, even by the transaction that holds the row (so that it runs before the waiting
/// call can take the row, whatever the timing), does not take the lease back, and once the
/// row is free the call is applied as the holder's. A lease that runs out with nobody
/// waiting is taken back by the same sweep (the control). With `lock_timeout`, the waiting
/// done is sent again and again, and the lease's renewal keeps it meanwhile.
async fn a_waiting_call_keeps_the_lease(call: Waiting, lock_timeout: bool) {
    let Some(server) = PgServer::start() else {
        return;
    };
    let lease_for = Duration::from_millis(400);
    let pool = a_pool(&server, 4, lock_timeout).await;
    let name = unique("waiting-call");
    let q: PgQueue<String> = PgQueue::builder(&name)
        .pool(pool)
        .lease_duration(lease_for)
        .auto_renew(lock_timeout)
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    let admin = PgPool::connect(&server.url()).await.unwrap();
    let queue: i32 = sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
        .bind(&name)
        .fetch_one(&admin)
        .await
        .unwrap();
    let sweep = "SELECT workqueue_reclaim($1, clock_timestamp(), 0, 100)";

    // The control: a lease run out with nobody waiting is taken back.
    q.add("control".to_owned()).await.unwrap();
    q.try_get().await.unwrap().into_lease().unwrap().abandon();
    tokio::time::sleep(lease_for * 2).await;
    let taken: i32 = sqlx::query_scalar(sweep)
        .bind(queue)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(taken, 1, "the sweep takes back a lease run out");
    let control = q.try_get().await.unwrap().into_lease().unwrap();
    control.done().await.unwrap();

    q.add("held".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let mut tx = admin.begin().await.unwrap();
    sqlx::query(
        "SELECT 1 FROM workqueue_items WHERE queue = $1 AND key = workqueue_key('\"held\"')
         FOR UPDATE",
    )
    .bind(queue)
    .execute(&mut *tx)
    .await
    .unwrap();
    let q2 = q.clone();
    let waiting = tokio::spawn(async move {
        match call {
            Waiting::Renew => lease.renew().await.map(|()| Some(lease)),
            Waiting::Done => lease.done().await.map(|()| None),
            Waiting::Release => lease.release().await.map(|()| None),
            Waiting::Retry => q2
                .retry_and_done(lease, AddOptions::default().rate_limited(), false)
                .await
                .map(|kept| {
                    assert!(kept.is_none(), "the queue is not shut down");
                    None
                }),
        }
    });
    let needle = match call {
        _ if lock_timeout => "workqueue_renew",
        Waiting::Renew => "workqueue_renew",
        Waiting::Done | Waiting::Release => "workqueue_finish",
        Waiting::Retry => "workqueue_retry_done",
    };
    waiting_for_a_lock(&admin, needle).await;
    tokio::time::sleep(lease_for * 2).await;
    let run_out: bool = sqlx::query_scalar(
        "SELECT lease_until < clock_timestamp() FROM workqueue_items
         WHERE queue = $1 AND key = workqueue_key('\"held\"')",
    )
    .bind(queue)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(
        run_out,
        "the lease ran out in the table while {call:?} waited"
    );
    let taken: i32 = sqlx::query_scalar(sweep)
        .bind(queue)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        taken, 0,
        "a sweep took back the lease whose {call:?} waited for its row"
    );
    tx.commit().await.unwrap();
    let kept = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the call ends once the row is free")
        .unwrap()
        .unwrap_or_else(|e| panic!("{call:?} after the row was freed: {e}"));
    let (ready, processing, delayed) = (
        q.len().await.unwrap(),
        q.processing_len().await.unwrap(),
        q.delayed_len().await.unwrap(),
    );
    match call {
        Waiting::Renew => {
            assert_eq!((ready, processing, delayed), (0, 1, 0));
            // Renewed from the moment the row was free, not from before the wait (a deadline
            // reckoned then has passed): a sweep now takes nothing.
            let running: bool = sqlx::query_scalar(
                "SELECT lease_until > clock_timestamp() + interval '200 milliseconds'
                 FROM workqueue_items WHERE queue = $1 AND key = workqueue_key('\"held\"')",
            )
            .bind(queue)
            .fetch_one(&admin)
            .await
            .unwrap();
            assert!(
                running,
                "the renewal that waited left a deadline already spent"
            );
            let taken: i32 = sqlx::query_scalar(sweep)
                .bind(queue)
                .fetch_one(&admin)
                .await
                .unwrap();
            assert_eq!(taken, 0);
            kept.unwrap().done().await.unwrap();
        }
        Waiting::Done => assert_eq!((ready, processing, delayed), (0, 0, 0)),
        Waiting::Release | Waiting::Retry => {
            assert_eq!((ready, processing, delayed), (1, 0, 0));
            let again = q.try_get().await.unwrap().into_lease().unwrap();
            assert_eq!(again.item(), "held");
            let failures = q.num_requeues("held".to_owned()).await.unwrap();
            assert_eq!(failures, usize::from(matches!(call, Waiting::Retry)));
            again.done().await.unwrap();
        }
    }
    assert_eq!(
        q.len().await.unwrap() + q.processing_len().await.unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_renewal_keeps_the_lease() {
    a_waiting_call_keeps_the_lease(Waiting::Renew, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_done_keeps_the_lease() {
    a_waiting_call_keeps_the_lease(Waiting::Done, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_release_keeps_the_lease() {
    a_waiting_call_keeps_the_lease(Waiting::Release, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_retry_keeps_the_lease() {
    a_waiting_call_keeps_the_lease(Waiting::Retry, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_retried_under_lock_timeout_keeps_the_lease() {
    a_waiting_call_keeps_the_lease(Waiting::Done, true).await;
}

/// A held lease whose row another transaction holds for five lease durations: its renewals
/// keep one statement waiting for the row (never more, whatever the renewal interval), the
/// lease stays this holder's (nobody takes the item meanwhile, nor right after), and the rest
/// of a 4-connection pool stays free for other work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_a_locked_row_wait_once() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("renewals");
    let build = |renew: bool| {
        PgQueue::<String>::builder(&name)
            .url(server.url())
            .lease_duration(Duration::from_millis(600))
            .auto_renew(renew)
            .max_connections(4)
            .poll_interval(Duration::from_millis(100))
            .build()
    };
    let q = build(true).await.unwrap();
    let other = build(false).await.unwrap();
    q.add("held".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let admin = PgPool::connect(&server.url()).await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    q.add_in(&mut tx, "held".to_owned()).await.unwrap();
    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock'
               AND (query LIKE '%workqueue_items%' OR query LIKE '%workqueue_renew%')",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let started = Instant::now();
    let mut most = 0;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(3) {
        most = most.max(waiting().await);
        // The pool serves other work at once.
        let call = Instant::now();
        q.add(format!("other-{i}")).await.unwrap();
        assert!(
            call.elapsed() < Duration::from_millis(500),
            "an add waited {:?} for a connection",
            call.elapsed()
        );
        // Another consumer (sweeping expired leases) never gets the held item.
        if let Some(taken) = other.try_get().await.unwrap().into_lease() {
            assert_ne!(taken.item(), "held");
            taken.done().await.unwrap();
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(most <= 1, "{most} statements waited for the row at once");
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(other.try_get().await.unwrap().into_lease().is_none());
    assert!(!lease.is_lost());
    lease.done().await.unwrap();
}

/// A done with a forget whose failure row another transaction holds (its item row free) is
/// left out of the step too: the step answers at once for the others, and the forget is
/// applied, with the done, once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_failure_row_holds_its_done_alone() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q: PgQueue<String> = PgQueue::builder(unique("failure-row"))
        .url(server.url())
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    for item in ["a", "b", "c"] {
        q.add_rate_limited(item.to_owned()).await.unwrap();
    }
    let leases = q.try_get_many(3).await.unwrap();
    let admin = PgPool::connect(&server.url()).await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM workqueue_failures WHERE key = workqueue_key('\"b\"') FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let step = tokio::time::timeout(
        Duration::from_secs(5),
        workq::Queue::done_and_next_many(&q, leases.into_iter().map(|l| (l, true)).collect(), 0),
    )
    .await
    .expect("the step waits for nobody")
    .unwrap();
    assert!(step.done.iter().all(Result::is_ok), "{:?}", step.done);
    assert_eq!(q.num_requeues("a".to_owned()).await.unwrap(), 0);
    assert_eq!(q.num_requeues("c".to_owned()).await.unwrap(), 0);
    assert_eq!(q.num_requeues("b".to_owned()).await.unwrap(), 1, "b waits");
    assert_eq!(q.processing_len().await.unwrap(), 1, "b's done waits");
    tx.commit().await.unwrap();
    eventually("b's done and forget", Duration::from_secs(5), || async {
        q.processing_len().await.unwrap() == 0 && q.num_requeues("b".to_owned()).await.unwrap() == 0
    })
    .await;
    assert_eq!(q.len().await.unwrap(), 0);
}

/// A row held for a moment (most often by the step that handed its lease out, between its
/// answer and its commit) does not send a done out of its step: the step waits for the row
/// (up to `workqueue.step_wait`, here long enough for the test's timing not to matter), and
/// the done is applied when the step answers. With `workqueue.step_wait` at 0 the step waits
/// for no row: the held item's done is settled after the step, once the row is free.
async fn a_row_held_for_a_moment(step_wait: &str) {
    let Some(server) = PgServer::start() else {
        return;
    };
    let options = PgConnectOptions::from_str(&server.url())
        .unwrap()
        .options([("workqueue.step_wait", step_wait)]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let q: PgQueue<String> = PgQueue::builder(unique("moment"))
        .pool(pool)
        .build()
        .await
        .unwrap();
    q.add_all(["a", "b"].map(String::from)).await.unwrap();
    let leases = q.try_get_many(2).await.unwrap();
    assert_eq!(leases.len(), 2);
    let admin = PgPool::connect(&server.url()).await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM workqueue_items WHERE key = workqueue_key('\"b\"') FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut step = tokio::spawn({
        let q = q.clone();
        async move {
            workq::Queue::done_and_next_many(
                &q,
                leases.into_iter().map(|l| (l, false)).collect(),
                0,
            )
            .await
        }
    });
    let waits = step_wait != "0";
    if waits {
        // The step is waiting for b's row (and has not given b's done back).
        tokio::select! {
            _ = waiting_for_a_lock(&admin, "workqueue_step") => {}
            _ = &mut step => panic!("the step gave b's done back without waiting for its row"),
        }
    } else {
        // The step answers while the row is still held: b's done is left to be settled.
        while !step.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            q.processing_len().await.unwrap(),
            1,
            "b's done waits for its row"
        );
    }
    tx.commit().await.unwrap();
    let step = step.await.unwrap().unwrap();
    assert!(step.done.iter().all(Result::is_ok), "{:?}", step.done);
    if waits {
        assert_eq!(
            q.processing_len().await.unwrap(),
            0,
            "b's done was applied in the step"
        );
    }
    eventually("both done", Duration::from_secs(5), || async {
        q.processing_len().await.unwrap() == 0
    })
    .await;
    assert_eq!(q.len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_for_a_moment_is_waited_for_in_the_step() {
    a_row_held_for_a_moment("10s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_with_step_wait_off_is_settled_after_the_step() {
    a_row_held_for_a_moment("0").await;
}

/// A queue with client-go's token bucket slowed down to one retry a second (a burst of 100),
/// and a backoff of 1 ms per item.
async fn bucket_queue(server: &PgServer) -> PgQueue<String> {
    PgQueue::builder(unique("bucket"))
        .url(server.url())
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .token_bucket(Some((1.0, 100)))
        .build()
        .await
        .unwrap()
}

/// `add_all_with(i0..i149, rate_limited)` on a fresh queue gives each item the delay 150
/// rate-limited adds one by one give: the bucket's burst of 100 goes to i0..i99 (their own
/// backoff, 1 ms), then i100 waits a second, i101 two, and so on in the batch's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_batch_spends_the_bucket_in_its_order() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let items: Vec<String> = (0..150).map(|i| format!("i{i}")).collect();
    let batched = bucket_queue(&server).await;
    let got = batched
        .add_all_with(
            items
                .iter()
                .map(|i| (i, AddOptions::default().rate_limited())),
        )
        .await
        .unwrap();
    let single = bucket_queue(&server).await;
    let started = Instant::now();
    let mut want = Vec::new();
    for item in &items {
        want.push(single.add_rate_limited(item).await.unwrap());
    }
    // One by one, the bucket refills a little while the adds go: as much as they took.
    let slack = started.elapsed() + Duration::from_millis(1);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        let expected = if i < 100 {
            Duration::from_millis(1)
        } else {
            Duration::from_secs(i as u64 - 99)
        };
        assert_eq!(got.delay, expected, "i{i} in the batch");
        assert!(
            got.delay.abs_diff(want.delay) <= slack,
            "i{i}: {:?} in the batch, {:?} one by one",
            got.delay,
            want.delay
        );
    }
    for item in &items {
        assert_eq!(batched.num_requeues(item).await.unwrap(), 1);
    }
}

/// The n-th rate-limited add of an item in a batch waits the n-th backoff, as n adds one by
/// one would (the earliest wins), and counts n failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rate_limited_adds_in_a_batch_count_each_failure() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = PgQueue::<String>::builder(unique("repeat"))
        .url(server.url())
        .backoff(Duration::from_secs(10), Duration::from_secs(1000))
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    let limited = AddOptions::default().rate_limited();
    let got = q
        .add_all_with(["a", "b", "a", "a"].map(|i| (i.to_owned(), limited)))
        .await
        .unwrap();
    let delays: Vec<Duration> = got.iter().map(|a| a.delay).collect();
    assert_eq!(
        delays,
        [10, 10, 20, 40].map(Duration::from_secs),
        "each add of a its own backoff"
    );
    assert_eq!(q.num_requeues("a".to_owned()).await.unwrap(), 3);
    assert_eq!(q.num_requeues("b".to_owned()).await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 2);
}

/// The number of deadlocks the server detected in the test database so far.
async fn deadlocks(admin: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(admin)
        .await
        .unwrap()
}

/// Rounds of: a rate-limited batch of 150 hot items (in a shuffled order) in a caller's
/// transaction, beside rate-limited single adds of the same items and a `Workers` pool that
/// retries a third of what it handles (a rate-limited re-add and its done in one call) and
/// finishes the rest. The server detects no deadlock, and the batches never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_batches_in_transactions_never_deadlock() {
    batches_in_transactions_never_deadlock(false).await;
}

/// The same under flow control (ten groups, two leases per group and six in all, a hand-out
/// rate), with getters beside the workers that end their leases one by one (a done, or a
/// dropped lease: a release), and the limits changed back and forth meanwhile (processes
/// built with other ones). The flow statements take the queue's flow row after the item
/// rows, and group rows only under it: the server detects no deadlock, and the batches never
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_flow_control_batches_in_transactions_never_deadlock() {
    batches_in_transactions_never_deadlock(true).await;
}

async fn batches_in_transactions_never_deadlock(flow: bool) {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = PgPool::connect(&server.url()).await.unwrap();
    let name = unique("deadlock");
    let build = |per_group: usize| {
        let builder = PgQueue::<String>::builder(&name)
            .url(server.url())
            .backoff(Duration::ZERO, Duration::from_millis(5))
            .token_bucket(Some((1_000_000.0, 1_000_000)))
            .max_connections(12);
        if flow {
            builder
                .group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
                .max_in_flight_per_group(per_group)
                .max_in_flight(6)
                .hand_out_rate(100_000.0, 1000)
        } else {
            builder
        }
    };
    let q = build(2).build().await.unwrap();
    let keys: Arc<Vec<String>> =
        Arc::new((0..150).map(|i| format!("g{}/hot-{i}", i % 10)).collect());
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = {
        let handled = handled.clone();
        Workers::new(q.clone())
            .count(8)
            .retry_forever()
            .spawn_async(move |_: String| {
                let n = handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move {
                    if n.is_multiple_of(3) {
                        Outcome::Retry
                    } else {
                        Outcome::Done
                    }
                }
            })
    };
    let before = deadlocks(&admin).await;
    let limited = AddOptions::default().rate_limited();
    let mut singles = Vec::new();
    for t in 0..3_usize {
        let (q, keys) = (q.clone(), keys.clone());
        singles.push(tokio::spawn(async move {
            for i in 0..400_usize {
                let key = &keys[(i * 7 + t * 53) % keys.len()];
                q.add_with(key, limited).await.expect("a single add");
            }
        }));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut others = Vec::new();
    if flow {
        for g in 0..2_usize {
            let (q, stop) = (q.clone(), stop.clone());
            others.push(tokio::spawn(async move {
                let mut n = g;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = tokio::time::timeout(Duration::from_millis(200), q.get()).await;
                    if let Ok(Some(lease)) = got.map(Result::unwrap) {
                        n += 1;
                        if n.is_multiple_of(4) {
                            drop(lease);
                        } else {
                            lease.done().await.expect("a done");
                        }
                    }
                }
            }));
        }
        let stop = stop.clone();
        let builds: Vec<_> = (0..6).map(|i| build(2 + i % 2)).collect();
        others.push(tokio::spawn(async move {
            for builder in builds {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                builder
                    .build()
                    .await
                    .expect("a process built with other limits");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    for round in 0..30_usize {
        let mut batch: Vec<&String> = keys.iter().collect();
        let shift = (round * 41) % batch.len();
        batch.rotate_left(shift);
        if round % 2 == 1 {
            batch.reverse();
        }
        let mut tx = q.pool().begin().await.unwrap();
        q.add_all_with_in(&mut tx, batch.iter().map(|k| (*k, limited)))
            .await
            .expect("a batch in a transaction: no deadlock");
        tokio::time::sleep(Duration::from_millis(5)).await;
        tx.commit().await.unwrap();
    }
    for single in singles {
        single.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for other in others {
        other.await.unwrap();
    }
    assert_eq!(
        deadlocks(&admin).await - before,
        0,
        "the server saw deadlocks"
    );
    assert!(handled.load(std::sync::atomic::Ordering::Relaxed) > 0);
    workers.shut_down().await;
}
