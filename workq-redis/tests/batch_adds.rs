//! Batched adds equal one-by-one adds, rate-limited ones included: `Queue::add_all_with(..,
//! rate_limited)` spends the server's token bucket in the batch's order and gives each item
//! the delay, failure count and priority that `add_with` one item at a time gives, on two
//! fresh queues side by side.

mod support;

use std::time::{Duration, Instant};

use support::server::{RedisServer, require};
use workq::admin::{End, ItemState, PageQuery};
use workq::{AddOptions, Queue};
use workq_redis::{RateLimit, RedisQueue};

/// 1 s of backoff for a first failure; a bucket of 100 tokens refilled at one every 2 s.
async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .rate_limit(
            RateLimit::exponential(Duration::from_secs(1), Duration::from_secs(1))
                .with_bucket(0.5, 100),
        )
        .check_persistence(false)
        .build()
        .await
        .unwrap()
}

/// The delayed items, soonest due first: (item text, due in).
async fn delayed(q: &RedisQueue<String>) -> Vec<(String, Duration)> {
    let page = q
        .page(&PageQuery::new(ItemState::Delayed, 1000).from(End::First))
        .await
        .unwrap();
    page.items
        .into_iter()
        .map(|e| (e.item, e.due_in.expect("a due time")))
        .collect()
}

/// The delayed items, soonest due first: (item text, when it is due counted from `start`).
async fn due_from(q: &RedisQueue<String>, start: Instant) -> Vec<(String, Duration)> {
    // The page is read after this instant: a due time it gives is at least this far on.
    let read = start.elapsed();
    delayed(q)
        .await
        .into_iter()
        .map(|(item, due_in)| (item, read + due_in))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_batch_spends_the_bucket_in_its_order_as_one_by_one_adds_do() {
    let Some(server) = require() else { return };
    let batch = queue(&server, "batch").await;
    let single = queue(&server, "single").await;
    let items: Vec<String> = (0..150).map(|i| format!("i{i:03}")).collect();
    let limited = AddOptions::default().rate_limited();
    let start = Instant::now();
    let added = Queue::add_all_with(&batch, items.clone(), limited)
        .await
        .unwrap();
    let batch_took = start.elapsed();
    assert_eq!(added, items.len());
    let batched = due_from(&batch, start).await;
    let start = Instant::now();
    for item in &items {
        assert!(
            Queue::add_with(&single, item.clone(), limited)
                .await
                .unwrap()
        );
    }
    let single_took = start.elapsed();
    let one_by_one = due_from(&single, start).await;
    let order = |list: &[(String, Duration)]| -> Vec<String> {
        list.iter().map(|(i, _)| i.clone()).collect()
    };
    let expected: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    assert_eq!(order(&batched), expected, "the batch's due order");
    assert_eq!(order(&one_by_one), expected, "the one-by-one due order");
    for (how, list, took) in [
        ("batched", &batched, batch_took),
        ("one by one", &one_by_one, single_took),
    ] {
        for (k, (item, due)) in list.iter().enumerate() {
            // The first 100 take a token each and wait the backoff alone: 1 s from their
            // add. Each later one waits for its token, which the bucket (full at the first
            // add) has 2 s after the one before, whenever the add was made.
            let (earliest, latest) = if k < 100 {
                (Duration::from_secs(1), Duration::from_secs(1) + took)
            } else {
                let token = Duration::from_secs(2 * (k as u64 - 99));
                (token, token + Duration::from_millis(500))
            };
            // The page's own round trip makes a due time read up to that much early.
            assert!(
                *due + Duration::from_millis(200) >= earliest && *due <= latest,
                "{item} {how}: due {due:?} after the first add, expected {earliest:?} to {latest:?}"
            );
        }
    }
    for item in [&items[0], &items[99], &items[100], &items[149]] {
        assert_eq!(batch.num_requeues(item.clone()).await.unwrap(), 1);
        assert_eq!(single.num_requeues(item.clone()).await.unwrap(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_batch_with_repeats_and_a_priority_equals_one_by_one_adds() {
    let Some(server) = require() else { return };
    let batch = queue(&server, "batch-mixed").await;
    let single = queue(&server, "single-mixed").await;
    let items: Vec<String> = ["a", "b", "a", "c", "b", "a"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let options = AddOptions::default().rate_limited().priority(3);
    assert_eq!(
        Queue::add_all_with(&batch, items.clone(), options)
            .await
            .unwrap(),
        items.len()
    );
    for item in &items {
        assert!(
            Queue::add_with(&single, item.clone(), options)
                .await
                .unwrap()
        );
    }
    let (batched, one_by_one) = (delayed(&batch).await, delayed(&single).await);
    let order = |list: &[(String, Duration)]| -> Vec<String> {
        list.iter().map(|(i, _)| i.clone()).collect()
    };
    assert_eq!(order(&batched), order(&one_by_one));
    for item in ["a", "b", "c"] {
        let (b, s) = (
            batch
                .item_detail(&format!("{item:?}"))
                .await
                .unwrap()
                .unwrap(),
            single
                .item_detail(&format!("{item:?}"))
                .await
                .unwrap()
                .unwrap(),
        );
        assert_eq!(b.failures, s.failures, "{item}");
        assert_eq!(b.priority, s.priority, "{item}");
        assert_eq!(b.priority, Some(3), "{item}");
    }
    assert_eq!(batch.num_requeues("a".to_owned()).await.unwrap(), 3);
    // A handle that is shut down takes none of a batch, as it takes no add.
    batch.shut_down();
    single.shut_down();
    assert_eq!(
        Queue::add_all_with(&batch, vec!["d".to_owned()], options)
            .await
            .unwrap(),
        0
    );
    assert!(
        !Queue::add_with(&single, "d".to_owned(), options)
            .await
            .unwrap()
    );
}
