//! No setting panics: every duration of the `Builder` and of `RedisAdmin` at `Duration::MAX`
//! either means "no limit" (the queue builds, a get and a done go through, `Workers` process
//! an item, no lease is lost) or is refused by `build()` with an error naming the setting.

mod support;

use std::time::{Duration, Instant};

use support::server::{RedisServer, require};
use workq::admin::Admin;
use workq::{AddKind, Outcome, Workers};
use workq_redis::{Builder, Error, RateLimit, RedisAdmin, RedisQueue};

fn builder(server: &RedisServer, name: &str) -> Builder<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
}

/// A get and a done, a blocked get woken by an add and one sleeping until a delayed item is
/// due, then `Workers` processing an item (which shuts the handle down), on a queue built
/// by `builder`.
async fn works(builder: Builder<String>) {
    let q = builder.build().await.expect("builds");
    q.add("x".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().expect("handed out");
    assert!(!lease.is_lost());
    assert!(lease.valid_until() > Instant::now());
    lease.done().await.expect("done");
    // A blocked get, woken by an add.
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.add("y".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), getter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap()
        .unwrap();
    lease.done().await.expect("done");
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    q.add_after("later".to_owned(), Duration::from_millis(300))
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), getter)
        .await
        .expect("handed out when due")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "later");
    lease.done().await.unwrap();
    processes(&q, Duration::ZERO).await;
}

/// `Workers` process one item whose handler takes `work`: once, and done.
async fn processes(q: &RedisQueue<String>, work: Duration) {
    let workers = Workers::new(q.clone())
        .count(2)
        .spawn_async(move |_: String| async move {
            tokio::time::sleep(work).await;
            Outcome::Done
        });
    q.add("w".to_owned()).await.unwrap();
    let deadline = Instant::now() + work + Duration::from_secs(10);
    while workers.stats().processed < 1 {
        assert!(Instant::now() < deadline, "not processed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let summary = workers.shut_down().await;
    assert_eq!(
        (summary.processed, summary.succeeded, summary.lease_lost),
        (1, 1, 0),
        "{summary:?}"
    );
    assert_eq!(q.processing_len().await.unwrap(), 0);
    assert_eq!(q.len().await.unwrap(), 0);
    assert_eq!(q.stats(1).await.unwrap().summary.stalled, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_duration_max_is_a_lease_that_never_expires() {
    let Some(server) = require() else { return };
    works(builder(&server, "lease-max").lease_duration(Duration::MAX)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_max_renews_for_as_long_as_the_lease_is_held() {
    let Some(server) = require() else { return };
    let make = || {
        builder(&server, "hold-max")
            .lease_duration(Duration::from_millis(300))
            .max_hold(Duration::MAX)
    };
    works(make()).await;
    // The handler outlives the lease three times over: it is renewed all along.
    let q = make().build().await.unwrap();
    processes(&q, Duration::from_millis(1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_deadline_max_retries_for_as_long_as_it_takes() {
    let Some(server) = require() else { return };
    works(builder(&server, "deadline-max").retry_deadline(Duration::MAX)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_interval_max_waits_for_wake_ups() {
    let Some(server) = require() else { return };
    // A blocked getter is woken by adds, and sleeps until a delayed item's due time.
    works(builder(&server, "poll-max").poll_interval(Duration::MAX)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_timeout_max_waits_for_the_answer() {
    let Some(server) = require() else { return };
    works(builder(&server, "timeout-max").response_timeout(Duration::MAX)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_duration_at_max_together() {
    let Some(server) = require() else { return };
    works(
        builder(&server, "all-max")
            .lease_duration(Duration::MAX)
            .max_hold(Duration::MAX)
            .retry_deadline(Duration::MAX)
            .poll_interval(Duration::MAX)
            .response_timeout(Duration::MAX)
            .settings_check_interval(Duration::MAX)
            .renew_every(Duration::from_secs(3600))
            .rate_limit(RateLimit::exponential(Duration::MAX, Duration::MAX)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_every_not_shorter_than_the_lease_is_refused() {
    let Some(server) = require() else { return };
    for every in [Duration::MAX, Duration::from_secs(30)] {
        let error = builder(&server, "renew-max")
            .renew_every(every)
            .build()
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, Error::Config(message) if message.contains("renew_every")),
            "{error}"
        );
    }
    // Without automatic renewal the interval is not used, and any value builds.
    works(
        builder(&server, "renew-max")
            .auto_renew(false)
            .renew_every(Duration::MAX),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoffs_at_max_delay_the_retry_as_long_as_it_goes() {
    let Some(server) = require() else { return };
    let q = builder(&server, "backoff-max")
        .rate_limit(RateLimit::exponential(Duration::MAX, Duration::MAX).with_bucket(1.0, 1))
        .build()
        .await
        .unwrap();
    let added = q.add_rate_limited("r".to_owned()).await.unwrap();
    assert_eq!(added.kind, AddKind::Delayed);
    assert!(
        added.delay > Duration::from_secs(99 * 365 * 24 * 3600),
        "{:?}",
        added.delay
    );
    let added = q.add_after("a".to_owned(), Duration::MAX).await.unwrap();
    assert_eq!(added.kind, AddKind::Delayed);
    assert_eq!(q.delayed_len().await.unwrap(), 2);
    // A handler's retry goes through the same limiter: delayed, not lost, nothing panics.
    let workers = Workers::new(q.clone())
        .count(1)
        .spawn_async(|_: String| async { Outcome::Retry });
    q.add("w".to_owned()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers.stats().retried < 1 {
        assert!(Instant::now() < deadline, "{:?}", workers.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let summary = workers.shut_down().await;
    assert_eq!((summary.retried, summary.lease_lost), (1, 0), "{summary:?}");
    assert_eq!(q.delayed_len().await.unwrap(), 3);
    assert_eq!(q.num_requeues("w".to_owned()).await.unwrap(), 1);
    let stats = q.stats(3).await.unwrap();
    let next = stats.next_delayed_in.expect("a delayed item");
    assert!(next > Duration::from_secs(99 * 365 * 24 * 3600), "{next:?}");
}

/// `settings_check_interval(Duration::MAX)`: the handle reads the server's settings when it
/// is built, its watching task sleeps without a limit, and every call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_check_interval_max_reads_the_settings_once() {
    let Some(server) = require() else { return };
    let make = || {
        builder(&server, "check-max")
            .check_persistence(true)
            .settings_check_interval(Duration::MAX)
    };
    let q = make().build().await.unwrap();
    assert!(q.persistence().expect("read when built").is_durable());
    works(make()).await;
}

/// A `RedisAdmin` whose retry deadline and settings check interval are `Duration::MAX`: its
/// calls answer (the settings read when it opened, never again), and a handle made by its
/// `queue` (which takes the admin's retry deadline) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_with_every_duration_at_max_answers() {
    let Some(server) = require() else { return };
    let admin = RedisAdmin::new(&server.url(), "wq")
        .unwrap()
        .retry_deadline(Duration::MAX)
        .settings_check_interval(Duration::MAX);
    let q = admin.queue::<String>("admin-max").build().await.unwrap();
    q.add("a".to_owned()).await.unwrap();
    for _ in 0..2 {
        let summary = Admin::summary(&admin, "admin-max").await.unwrap();
        assert_eq!(summary.depth, 1);
        assert!(Admin::status(&admin).up);
    }
    assert!(admin.persistence().expect("read when opened").is_durable());
    let lease = q.try_get().await.unwrap().into_lease().expect("handed out");
    lease.done().await.unwrap();
    works(admin.queue("admin-max")).await;
}
