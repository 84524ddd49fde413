//! A stale holder changes nothing, on every path of a failed item: its rate-limited retry, its
//! retry after a delay and its give-up are fenced by the lease's token like its done
//! (`Queue::retry_and_done` is one call of `workqueue_retry_done`). No failure is counted,
//! nothing is forgotten or re-added, and `Workers` count the call as a lost lease; the
//! current holder's calls do all of it.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::{PgServer, unique};
use workq::{AddOptions, Outcome, Queue, QueueLease, Workers};
use workq_postgres::{Lease, PgQueue};

/// A queue whose leases last 300 ms and are not renewed, with a backoff of zero (a retry is
/// ready at once) and no token bucket.
async fn queue(server: &PgServer) -> PgQueue<String> {
    handle(server, &unique("fenced"), false).await
}

/// A handle on the queue `name` (see [`queue`]), its leases renewed if `renew`.
async fn handle(server: &PgServer, name: &str, renew: bool) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(renew)
        .poll_interval(Duration::from_millis(100))
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(None)
        .max_stalls(0)
        .build()
        .await
        .unwrap()
}

/// `x` with two failures counted, handed to a holder whose lease then expires and is taken
/// over by a second holder: (stale, current).
async fn stale_and_current(q: &PgQueue<String>) -> (Lease<String>, Lease<String>) {
    q.add_rate_limited("x".to_owned()).await.unwrap();
    q.add_rate_limited("x".to_owned()).await.unwrap();
    assert_eq!(q.num_requeues("x".to_owned()).await.unwrap(), 2);
    let stale = q.try_get().await.unwrap().into_lease().unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let current = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(current.item(), "x");
    assert!(current.token() > stale.token());
    (stale, current)
}

/// After the current holder's plain done: nothing was re-added (nothing ready or delayed).
async fn nothing_pending(q: &PgQueue<String>, current: Lease<String>) {
    current.done().await.unwrap();
    assert!(
        q.try_get().await.unwrap().into_lease().is_none(),
        "re-added"
    );
    assert_eq!(q.delayed_len().await.unwrap(), 0, "re-added with a delay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_rate_limited_retry_changes_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let (stale, current) = stale_and_current(&q).await;
    let error = Queue::retry_and_done(&q, stale, AddOptions::default().rate_limited(), false)
        .await
        .unwrap_err();
    assert!(PgQueue::<String>::is_lease_lost(&error), "{error}");
    assert_eq!(
        q.num_requeues("x".to_owned()).await.unwrap(),
        2,
        "no failure counted"
    );
    nothing_pending(&q, current).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_retry_after_changes_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let (stale, current) = stale_and_current(&q).await;
    let error = Queue::retry_and_done(
        &q,
        stale,
        AddOptions::default().after(Duration::from_secs(60)),
        true,
    )
    .await
    .unwrap_err();
    assert!(PgQueue::<String>::is_lease_lost(&error), "{error}");
    assert_eq!(
        q.num_requeues("x".to_owned()).await.unwrap(),
        2,
        "nothing forgotten"
    );
    nothing_pending(&q, current).await;
}

/// A give-up is a done with a forget (`Workers` send it through their steps): fenced too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_give_up_changes_nothing() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let (stale, current) = stale_and_current(&q).await;
    let step = Queue::done_and_next_many(&q, vec![(stale, true)], 1)
        .await
        .unwrap();
    assert!(
        matches!(&step.done[..], [Err(e)] if e.is_lease_lost()),
        "{:?}",
        step.done
    );
    assert!(step.next.is_empty());
    let error = Queue::done_and_next(&q, current, true).await;
    assert!(error.is_ok(), "the current holder's give-up: {error:?}");
    assert_eq!(q.num_requeues("x".to_owned()).await.unwrap(), 0);
}

/// The current holder's retries do what one-by-one calls would: a rate-limited retry counts a
/// failure and queues the item again (at once here: the backoff is zero); a retry after a
/// delay forgets the failures and delays the item; a retry on a shut-down handle changes
/// nothing and hands the lease back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_holders_retries_requeue_and_count() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let (_stale, current) = stale_and_current(&q).await;
    let back = Queue::retry_and_done(&q, current, AddOptions::default().rate_limited(), false)
        .await
        .unwrap();
    assert!(back.is_none());
    assert_eq!(q.num_requeues("x".to_owned()).await.unwrap(), 3);
    assert_eq!(q.processing_len().await.unwrap(), 0, "the lease is done");
    let again = q
        .try_get()
        .await
        .unwrap()
        .into_lease()
        .expect("queued again");
    let back = Queue::retry_and_done(
        &q,
        again,
        AddOptions::default().after(Duration::from_secs(60)),
        true,
    )
    .await
    .unwrap();
    assert!(back.is_none());
    assert_eq!(
        q.num_requeues("x".to_owned()).await.unwrap(),
        0,
        "forgotten"
    );
    assert_eq!(q.delayed_len().await.unwrap(), 1, "delayed");
    assert_eq!(q.processing_len().await.unwrap(), 0);
    // A retry on a shut-down handle: the lease comes back, still held, nothing changed.
    q.add("y".to_owned()).await.unwrap();
    let y = q.try_get().await.unwrap().into_lease().unwrap();
    q.shut_down();
    let back = Queue::retry_and_done(&q, y, AddOptions::default().rate_limited(), false)
        .await
        .unwrap()
        .expect("handed back");
    assert_eq!(q.num_requeues("y".to_owned()).await.unwrap(), 0);
    assert_eq!(q.processing_len().await.unwrap(), 1);
    QueueLease::release(back).await.unwrap();
}

/// Through `Workers`: a handler that runs past its lease while another consumer takes the
/// item over, then fails. Its retry is refused whole (no failure counted, no re-add, counted
/// as a lost lease), and so is a give-up (no `on_give_up` for an item someone else holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_whose_lease_was_lost_change_nothing_on_failure() {
    let Some(server) = PgServer::start() else {
        return;
    };
    for outcome in [
        Outcome::Retry,
        Outcome::RetryAfter(Duration::from_secs(60)),
        Outcome::GiveUp,
    ] {
        let q = queue(&server).await;
        q.add_rate_limited("x".to_owned()).await.unwrap();
        q.add_rate_limited("x".to_owned()).await.unwrap();
        let started = Arc::new(tokio::sync::Notify::new());
        let signal = started.clone();
        let gave_up = Arc::new(AtomicUsize::new(0));
        let counted = gave_up.clone();
        let workers = Workers::new(q.clone())
            .count(1)
            .on_give_up(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .spawn_async(move |_: String| {
                let signal = signal.clone();
                async move {
                    signal.notify_one();
                    tokio::time::sleep(Duration::from_millis(900)).await;
                    outcome
                }
            });
        started.notified().await;
        // Another consumer (whose leases are renewed) takes the item once the worker's lease
        // has expired.
        let elsewhere = handle(&server, q.name(), true).await;
        let other = loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Some(lease) = elsewhere.try_get().await.unwrap().into_lease() {
                break lease;
            }
        };
        // The worker's call ends while `other` holds the item.
        tokio::time::sleep(Duration::from_millis(900)).await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 1, "{outcome:?}: {summary:?}");
        assert_eq!(summary.lease_lost, 1, "{outcome:?}: {summary:?}");
        assert_eq!(
            q.num_requeues("x".to_owned()).await.unwrap(),
            2,
            "{outcome:?}: the failure count moved"
        );
        assert_eq!(
            gave_up.load(Ordering::SeqCst),
            0,
            "{outcome:?}: on_give_up fired"
        );
        nothing_pending(&elsewhere, other).await;
    }
}
