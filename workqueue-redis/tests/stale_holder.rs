//! A stale holder changes nothing: its `done` with a forget (what `Workers` send after a
//! success) is refused whole, and the failure count that the item's current holder may be
//! failing on stays, whether the handle is running or shut down.

mod support;

use std::time::Duration;

use support::server::RedisServer;
use workqueue::Queue;
use workqueue_redis::{Error, RateLimit, RedisQueue};

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
async fn next(q: &RedisQueue<String>) -> workqueue_redis::Lease<String> {
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
    other.shut_down().await.unwrap();
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
