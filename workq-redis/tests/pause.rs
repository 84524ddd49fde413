//! Pausing a queue for every process (`pause`, `resume`, `is_paused`) and the running totals
//! (`counters`), over a live `redis-server`.

mod support;

use std::time::Duration;

use support::server::{RedisServer, require};
use workq_redis::RedisQueue;

async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::<String>::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_takes_adds_and_hands_out_nothing_until_resumed() {
    let Some(server) = require() else { return };
    let producer = queue(&server, "p").await;
    let worker = queue(&server, "p").await;
    producer.add("a".to_string()).await.unwrap();
    let held = worker.try_get().await.unwrap().into_lease().unwrap();

    assert!(producer.pause().await.unwrap(), "it was running");
    assert!(!producer.pause().await.unwrap(), "already paused");
    assert!(
        worker.is_paused().await.unwrap(),
        "every handle sees the pause"
    );
    producer.add("b".to_string()).await.unwrap();
    producer
        .add_after("c".to_string(), Duration::from_millis(1))
        .await
        .unwrap();
    assert!(worker.try_get().await.unwrap().is_empty());
    // The lease out lives on: renew and done work while paused.
    held.renew().await.unwrap();
    held.done().await.unwrap();

    let blocked = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.get().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!blocked.is_finished(), "a paused queue hands nothing out");
    assert_eq!(
        producer.len().await.unwrap(),
        2,
        "the add and the due delayed add"
    );

    assert!(producer.resume().await.unwrap(), "it was paused");
    assert!(!producer.resume().await.unwrap(), "already running");
    let lease = tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("the resume wakes a blocked getter")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "b");
    lease.done().await.unwrap();
    assert_eq!(
        worker.try_get().await.unwrap().into_lease().unwrap().item(),
        "c"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_shut_down_for_the_fleet_ends_its_getters() {
    let Some(server) = require() else { return };
    let q = queue(&server, "ps").await;
    q.add("a".to_string()).await.unwrap();
    q.pause().await.unwrap();
    let blocked = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    q.shut_down_fleet().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("the getter ends")
        .unwrap()
        .unwrap();
    assert!(got.is_none(), "nothing is handed out while paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_count_adds_completions_and_failures() {
    let Some(server) = require() else { return };
    let q = queue(&server, "c").await;
    assert_eq!(q.counters().await.unwrap().adds, 0);
    q.add("a".to_string()).await.unwrap();
    q.add("a".to_string()).await.unwrap(); // a duplicate: not an add
    q.add("b".to_string()).await.unwrap();
    let a = q.try_get().await.unwrap().into_lease().unwrap();
    q.add("a".to_string()).await.unwrap(); // re-added while processing: counts
    a.done().await.unwrap();
    q.add_rate_limited("z".to_string()).await.unwrap();
    q.add_after("d".to_string(), Duration::from_millis(1))
        .await
        .unwrap();
    // The retry (first delay 5 ms) and the delayed add come due.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let len = q.len().await.unwrap();
    assert_eq!(len, 4, "b, a again, z and d (promoted by len)");
    let c = q.counters().await.unwrap();
    assert_eq!((c.adds, c.completions, c.retries), (5, 1, 1));
}
