//! What operators do: dead letters (list, requeue one or all, delete, purge) lose nothing and
//! count what they did, also while the queue is shut down; pause and resume; stats; delete.

mod support;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{PgServer, unique};
use workqueue_postgres::{Error, PgQueue};

async fn queue(server: &PgServer, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("connect to the test server")
}

async fn admin(server: &PgServer) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap()
}

/// Puts `n` dead letters of items `prefix0..` into queue `q` directly (what a thousand
/// poisoned items would leave).
async fn bury(admin: &PgPool, q: &PgQueue<String>, prefix: &str, n: usize) {
    sqlx::query(
        "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
         SELECT s.id, to_jsonb($2 || i)::text, 'stalled', 5, 0
         FROM workqueue_queues s, generate_series(0, $3 - 1) i WHERE s.name = $1",
    )
    .bind(q.name())
    .bind(prefix)
    .bind(i32::try_from(n).unwrap())
    .execute(admin)
    .await
    .unwrap();
}

async fn dead_count(admin: &PgPool, q: &PgQueue<String>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM workqueue_dead d JOIN workqueue_queues s ON s.id = d.queue
         WHERE s.name = $1",
    )
    .bind(q.name())
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Everything ready, in order.
async fn drain(q: &PgQueue<String>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let next = q.try_get_many(500).await.unwrap();
        if next.is_empty() {
            return out;
        }
        out.extend(next.iter().map(|l| l.item().clone()));
        q.done_and_get_many(next, 0).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeueing_dead_letters_while_shut_down_refuses_and_keeps_them() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("dead")).await;
    bury(&admin, &q, "d", 3).await;
    q.shut_down_fleet().await.unwrap();
    assert!(matches!(
        q.requeue_dead_letters().await,
        Err(Error::ShutDown)
    ));
    let one = q.dead_letters(1).await.unwrap().remove(0);
    assert!(matches!(
        q.requeue_dead_letter(&one).await,
        Err(Error::ShutDown)
    ));
    assert_eq!(dead_count(&admin, &q).await, 3, "every letter is kept");
    // A handle that is shut down refuses too.
    q.resume_fleet().await.unwrap();
    let closed = queue(&server, q.name()).await;
    closed.shut_down();
    assert!(matches!(
        closed.requeue_dead_letters().await,
        Err(Error::ShutDown)
    ));
    assert_eq!(dead_count(&admin, &q).await, 3);
    // Running: the count is the number of items queued again.
    assert!(q.requeue_dead_letter(&one).await.unwrap());
    assert!(!q.requeue_dead_letter(&one).await.unwrap(), "gone already");
    assert_eq!(q.requeue_dead_letters().await.unwrap(), 2);
    assert_eq!(dead_count(&admin, &q).await, 0);
    let mut items = drain(&q).await;
    items.sort();
    assert_eq!(items, ["d0", "d1", "d2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_dead_letter_lists_are_worked_through_in_steps_with_exact_counts() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("dead-many")).await;
    bury(&admin, &q, "x", 2500).await;
    // Two of them are queued already: their letters count as queued again (the item is).
    q.add("x7".to_owned()).await.unwrap();
    q.add("x2400".to_owned()).await.unwrap();
    assert_eq!(q.requeue_dead_letters().await.unwrap(), 2500);
    assert_eq!(q.len().await.unwrap(), 2500);
    let items = drain(&q).await;
    assert_eq!(items.len(), 2500);
    assert_eq!(items[0], "x7", "the queued item kept its place");
    // Oldest letters first after the items already queued.
    assert_eq!(&items[2..4], ["x0", "x1"]);

    bury(&admin, &q, "y", 2345).await;
    let id = q.dead_letters(1).await.unwrap()[0].id;
    assert!(q.delete_dead_letter(id).await.unwrap());
    assert!(!q.delete_dead_letter(id).await.unwrap());
    assert_eq!(q.purge_dead_letters().await.unwrap(), 2344);
    assert_eq!(q.purge_dead_letters().await.unwrap(), 0);
    assert_eq!(dead_count(&admin, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_hands_out_nothing_keeps_its_adds_and_wakes_getters_on_resume() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server, &unique("pause")).await;
    assert!(q.pause().await.unwrap(), "it was running");
    assert!(!q.pause().await.unwrap(), "paused already");
    assert!(q.is_paused().await.unwrap());
    q.add("a".to_owned()).await.unwrap();
    q.add_after("b".to_owned(), Duration::from_millis(10))
        .await
        .unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(q.len().await.unwrap(), 2, "a, and b whose delay ran out");
    assert!(q.try_get().await.unwrap().is_empty());
    // A getter waits (the poll interval is 30 s), and the resume wakes it at once.
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!getter.is_finished(), "nothing is handed out while paused");
    let resumed = std::time::Instant::now();
    assert!(q.resume().await.unwrap());
    let lease = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("woken by the resume, not by a poll")
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(resumed.elapsed() < Duration::from_secs(10));
    assert_eq!(lease.item(), "a");
    lease.done().await.unwrap();
    assert_eq!(drain(&q).await, ["b"]);
    assert!(!q.is_paused().await.unwrap());
    // Paused and shut down for the fleet: getters end.
    q.pause().await.unwrap();
    q.shut_down_fleet().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), q.get())
        .await
        .expect("a paused queue that is shut down ends its getters")
        .unwrap();
    assert!(ended.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_every_part_and_delete_empties_the_queue() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q: PgQueue<String> = PgQueue::builder(unique("stats"))
        .url(server.url())
        .backoff(Duration::from_secs(60), Duration::from_secs(600))
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    q.add_all(["a", "b", "c"].map(String::from)).await.unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    q.add_rate_limited("failing".to_owned()).await.unwrap();
    let held = q.try_get().await.unwrap().into_lease().unwrap();
    q.add(held.item().clone()).await.unwrap(); // re-added while leased
    bury(&admin, &q, "dead", 2).await;
    let stats = q.stats(10).await.unwrap();
    assert_eq!(stats.depth, 2);
    assert_eq!(stats.delayed, 2, "later and the rate-limited retry");
    assert_eq!(stats.in_flight, 1);
    assert_eq!(stats.in_flight_dirty, 1);
    assert_eq!(stats.failing, 1);
    assert_eq!(stats.dead, 2);
    assert!(!stats.shut_down && !stats.paused);
    assert_eq!(stats.leases.len(), 1);
    assert_eq!(stats.leases[0].item, "\"a\"");
    assert_eq!(stats.failures, [("\"failing\"".to_owned(), 1)]);
    assert!(
        stats
            .next_delayed_in
            .is_some_and(|d| d <= Duration::from_secs(60))
    );

    q.delete().await.unwrap();
    assert!(held.done().await.unwrap_err().is_lease_lost());
    let stats = q.stats(10).await.unwrap();
    assert_eq!(
        (
            stats.depth,
            stats.delayed,
            stats.in_flight,
            stats.failing,
            stats.dead
        ),
        (0, 0, 0, 0, 0)
    );
    // The handle goes on on the empty queue.
    q.add("again".to_owned()).await.unwrap();
    assert_eq!(drain(&q).await, ["again"]);
}
