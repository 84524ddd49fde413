//! A stale holder changes nothing: its `done` with a forget (what `Workers` send after a
//! success) is refused whole, and the failure count that the item's current holder may be
//! failing on stays, whether the handle is running or shut down. Its failure paths
//! (`Queue::retry_and_done`: a rate-limited retry, a retry after a delay, and a give-up) are
//! fenced the same way: no failure counted or forgotten, nothing re-added, no give-up
//! reported; the current holder's apply.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::server::RedisServer;
use workq::{AddOptions, Outcome, Queue, TryGet, Workers};
use workq_redis::{Error, RateLimit, RedisQueue};

async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .rate_limit(RateLimit::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .build()
        .await
        .unwrap()
}

/// The next item (reclaiming expired leases), within 5 s.
async fn next(q: &RedisQueue<String>) -> workq_redis::Lease<String> {
    tokio::time::timeout(Duration::from_secs(5), q.get())
        .await
        .expect("an item within 5 s")
        .unwrap()
        .expect("not shut down")
}

#[tokio::test]
async fn a_stale_holders_forget_changes_nothing() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "stale-forget").await;
    q.add("key".to_string()).await.unwrap();
    let stale = next(&q).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    let fresh = next(&q).await;
    assert!(fresh.token() > stale.token());
    q.add_rate_limited("key".to_string()).await.unwrap();
    q.add_rate_limited("key".to_string()).await.unwrap();
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 2);

    let out = Queue::done_and_next(&q, stale, true).await;
    assert!(matches!(out, Err(Error::LeaseLost)), "{out:?}");
    assert_eq!(
        q.num_requeues("key".to_string()).await.unwrap(),
        2,
        "a refused done forgets nothing"
    );

    // On a handle that is shut down, the done goes alone: refused, it forgets nothing either.
    let other = queue(&server, "stale-forget").await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    let current = next(&q).await;
    other.shut_down();
    let out = Queue::done_and_next(&other, fresh, true).await;
    assert!(matches!(out, Err(Error::LeaseLost)), "{out:?}");
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 2);

    // The holder's own done with a forget forgets.
    assert!(
        Queue::done_and_next(&q, current, true)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 0);
}

/// A queue whose item `key` has failed once (`num_requeues` 1) and is held by `fresh`, after
/// `stale`'s lease expired and the item was reclaimed.
async fn stale_and_fresh(
    q: &RedisQueue<String>,
) -> (workq_redis::Lease<String>, workq_redis::Lease<String>) {
    q.add_rate_limited("key".to_string()).await.unwrap();
    let stale = next(q).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    let fresh = next(q).await;
    assert!(fresh.token() > stale.token());
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 1);
    (stale, fresh)
}

/// Nothing changed since `stale_and_fresh`: one failure, the item held and not re-added
/// (neither queued nor delayed), `failures` (the server's count of rate-limited adds) as it was.
async fn unchanged(q: &RedisQueue<String>, failures: u64) {
    assert_eq!(
        q.num_requeues("key".to_string()).await.unwrap(),
        1,
        "the failure count moved"
    );
    assert_eq!(q.counters().await.unwrap().retries, failures);
    assert_eq!(q.len().await.unwrap(), 0, "re-added");
    assert_eq!(q.delayed_len().await.unwrap(), 0, "re-added with a delay");
    assert_eq!(q.processing_len().await.unwrap(), 1, "the holder's claim");
}

/// Once `fresh` is done, the queue holds nothing: no re-add was kept for the item.
async fn nothing_left(q: &RedisQueue<String>, fresh: workq_redis::Lease<String>) {
    fresh.done().await.unwrap();
    // Longer than any delay these queues give (10 ms at most).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(q.try_get().await.unwrap(), TryGet::Empty));
}

#[tokio::test]
async fn a_stale_holders_rate_limited_retry_changes_nothing() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "stale-retry").await;
    let (stale, fresh) = stale_and_fresh(&q).await;
    let failures = q.counters().await.unwrap().retries;
    let out = Queue::retry_and_done(&q, stale, AddOptions::default().rate_limited(), false).await;
    assert!(matches!(out, Err(Error::LeaseLost)), "{out:?}");
    unchanged(&q, failures).await;
    nothing_left(&q, fresh).await;
}

#[tokio::test]
async fn a_stale_holders_retry_after_changes_nothing() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "stale-after").await;
    let (stale, fresh) = stale_and_fresh(&q).await;
    let failures = q.counters().await.unwrap().retries;
    let after = AddOptions::default().after(Duration::from_millis(5));
    let out = Queue::retry_and_done(&q, stale, after, true).await;
    assert!(matches!(out, Err(Error::LeaseLost)), "{out:?}");
    unchanged(&q, failures).await;
    nothing_left(&q, fresh).await;
}

#[tokio::test]
async fn the_current_holders_retries_apply() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "current-retry").await;
    let (stale, fresh) = stale_and_fresh(&q).await;
    stale.abandon();
    // A rate-limited retry: one more failure, queued again once the delay passed.
    let out = Queue::retry_and_done(&q, fresh, AddOptions::default().rate_limited(), false).await;
    assert!(out.unwrap().is_none());
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 2);
    assert_eq!(q.processing_len().await.unwrap(), 0, "done");
    let again = next(&q).await;
    assert_eq!(again.item(), "key");
    // A retry after a delay: the failures forgotten, delayed, then handed out.
    let out = Queue::retry_and_done(
        &q,
        again,
        AddOptions::default().after(Duration::from_millis(200)),
        true,
    )
    .await;
    assert!(out.unwrap().is_none());
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 0);
    assert_eq!(q.delayed_len().await.unwrap(), 1);
    assert_eq!(q.processing_len().await.unwrap(), 0, "done");
    let last = next(&q).await;
    assert_eq!(last.item(), "key");
    // A handle that is shut down refuses the re-add and hands the lease back, unchanged.
    let other = queue(&server, "current-retry").await;
    other.shut_down();
    let out = Queue::retry_and_done(&other, last, AddOptions::default().rate_limited(), false)
        .await
        .unwrap();
    let back = out.expect("the lease is handed back");
    assert_eq!(q.num_requeues("key".to_string()).await.unwrap(), 0);
    assert_eq!(q.processing_len().await.unwrap(), 1, "still held");
    back.done().await.unwrap();
    assert!(matches!(q.try_get().await.unwrap(), TryGet::Empty));
}

/// What a `Workers` handler answers for an item whose lease it lost while it ran.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Retry,
    RetryAfter,
    GiveUp,
}

/// A pool's worker holds `key` (failed once), its lease expires while its handler runs and
/// another consumer takes the item; then the handler answers `answer`. The pool's failure
/// path must change nothing: the failure count stays, nothing is re-added, no give-up is
/// reported, and the summary counts the call as a lost lease.
async fn a_stale_worker_changes_nothing(name: &str, answer: Answer) {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, name).await;
    q.add_rate_limited("key".to_string()).await.unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let give_ups = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let workers = {
        let (started, go, calls) = (started.clone(), go.clone(), calls.clone());
        let give_ups = give_ups.clone();
        Workers::new(q.clone())
            .count(1)
            .max_retries(5)
            .on_give_up(move |_| {
                give_ups.fetch_add(1, Ordering::SeqCst);
            })
            .spawn_async(move |item: String| {
                let (started, go, calls) = (started.clone(), go.clone(), calls.clone());
                async move {
                    calls.lock().unwrap().push(item);
                    started.notify_one();
                    go.notified().await;
                    match answer {
                        Answer::Retry => Outcome::Retry,
                        Answer::RetryAfter => Outcome::RetryAfter(Duration::from_millis(5)),
                        Answer::GiveUp => Outcome::GiveUp,
                    }
                }
            })
    };
    started.notified().await;
    // The queue does not renew: the worker's lease expires, and another consumer takes it.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let fresh = next(&q).await;
    let failures = q.counters().await.unwrap().retries;
    go.notify_one();
    let deadline = Instant::now() + Duration::from_secs(5);
    while workers.stats().lease_lost == 0 {
        assert!(Instant::now() < deadline, "{:?}", workers.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    unchanged(&q, failures).await;
    assert_eq!(give_ups.load(Ordering::SeqCst), 0, "a give-up was reported");
    let summary = workers.stats();
    assert_eq!((summary.retried, summary.given_up), (0, 0), "{summary:?}");
    nothing_left(&q, fresh).await;
    let summary = workers.shut_down().await;
    assert_eq!(summary.lease_lost, 1, "{summary:?}");
    assert_eq!(*calls.lock().unwrap(), ["key"], "handled again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_retry_changes_nothing() {
    a_stale_worker_changes_nothing("stale-worker-retry", Answer::Retry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_retry_after_changes_nothing() {
    a_stale_worker_changes_nothing("stale-worker-after", Answer::RetryAfter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_give_up_changes_nothing() {
    a_stale_worker_changes_nothing("stale-worker-give-up", Answer::GiveUp).await;
}
