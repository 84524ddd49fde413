//! No setting panics: `Duration::MAX` (or a rate so low that a retry takes longer than a
//! century) means "no limit", or `build()` refuses it naming the setting. Every call still
//! works: adds, gets, renewals, dones, retries, `Workers`.

mod support;

use std::time::Duration;

use support::{PgServer, unique};
use workq::admin::Admin;
use workq::{AddOptions, Outcome, Workers};
use workq_postgres::{Builder, Error, PgAdmin, PgQueue};

fn builder(server: &PgServer) -> Builder<String> {
    PgQueue::builder(unique("settings")).url(server.url())
}

/// An add, a get, a renewal and a done on `q`.
async fn one_item(q: &PgQueue<String>) {
    q.add("a".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().expect("handed out");
    lease.renew().await.unwrap();
    assert!(!lease.is_lost());
    lease.done().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 0);
}

/// A lease that never expires: renewed, done, and its deadline in the database a century or
/// more away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_duration_max_is_a_lease_that_never_expires() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = builder(&server)
        .lease_duration(Duration::MAX)
        .build()
        .await
        .unwrap();
    one_item(&q).await;
    q.add("b".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let years: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_until - now())::float8 / (365 * 86400)
         FROM workqueue_items WHERE item = '\"b\"'",
    )
    .fetch_one(q.pool())
    .await
    .unwrap();
    assert!(years > 99.0, "{years} years");
    assert!(!lease.is_lost());
    lease.done().await.unwrap();
}

/// `max_hold(Duration::MAX)`: renewed for as long as it is held. A lease of 500 ms held for
/// six of them is still this holder's, and nobody else takes the item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_max_renews_as_long_as_the_lease_is_held() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("max-hold");
    let q = PgQueue::<String>::builder(&name)
        .url(server.url())
        .lease_duration(Duration::from_millis(500))
        .max_hold(Duration::MAX)
        .build()
        .await
        .unwrap();
    let other = PgQueue::<String>::builder(&name)
        .url(server.url())
        .lease_duration(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    q.add("a".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            other.try_get().await.unwrap().into_lease().is_none(),
            "the item was taken from its holder"
        );
    }
    assert!(!lease.is_lost());
    lease.done().await.unwrap();
}

/// `retry_deadline(Duration::MAX)`: retried until it succeeds; every call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_deadline_max_retries_without_limit() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = builder(&server)
        .retry_deadline(Duration::MAX)
        .build()
        .await
        .unwrap();
    one_item(&q).await;
    q.add_all(["x", "y"].map(String::from)).await.unwrap();
    let next = q.try_get_many(2).await.unwrap();
    let out = q
        .done_and_get_many(next.into_iter().map(|l| (l, false)).collect(), 2)
        .await
        .unwrap();
    assert!(out.done.iter().all(Result::is_ok));
}

/// `poll_interval(Duration::MAX)`: getters never poll, and a blocked getter is still woken by
/// an add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_interval_max_means_woken_only() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = builder(&server)
        .poll_interval(Duration::MAX)
        .build()
        .await
        .unwrap();
    one_item(&q).await;
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    q.add("woken".to_owned()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), getter)
        .await
        .expect("woken by the add")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "woken");
    lease.done().await.unwrap();
}

/// Backoffs and delays of `Duration::MAX`, and a token bucket so slow that a retry takes
/// longer than a century: each add is delayed (by a century at most), nothing overflows, and
/// the bucket keeps counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_backoffs_delays_and_bucket_intervals_are_capped() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let century = Duration::from_secs(100 * 365 * 86_400);
    let q = builder(&server)
        .backoff(Duration::MAX, Duration::MAX)
        .build()
        .await
        .unwrap();
    for _ in 0..3 {
        let added = q.add_rate_limited("slow".to_owned()).await.unwrap();
        assert_eq!(added.delay, century);
    }
    assert_eq!(q.num_requeues("slow".to_owned()).await.unwrap(), 3);
    let added = q
        .add_after("later".to_owned(), Duration::MAX)
        .await
        .unwrap();
    assert_eq!(added.delay, century);
    assert_eq!(q.delayed_len().await.unwrap(), 2);

    let q = builder(&server)
        .backoff(Duration::ZERO, Duration::ZERO)
        .token_bucket(Some((1e-300, 1)))
        .build()
        .await
        .unwrap();
    let first = q.add_rate_limited("a".to_owned()).await.unwrap();
    assert_eq!(first.delay, Duration::ZERO, "the burst");
    // Then a century per retry (less the time the adds take), up to a thousand years.
    let minute = Duration::from_secs(60);
    let millennium = Duration::from_secs(1000 * 365 * 86_400 + 250 * 86_400);
    for i in 0..20 {
        let added = q.add_rate_limited(format!("b{i}")).await.unwrap();
        assert!(added.delay + minute >= century, "{:?}", added.delay);
        assert!(added.delay <= millennium, "{:?}", added.delay);
    }
    let batch = q
        .add_all_with((0..5).map(|i| (format!("c{i}"), AddOptions::default().rate_limited())))
        .await
        .unwrap();
    for added in batch {
        assert!(added.delay + minute >= century, "{:?}", added.delay);
        assert!(added.delay <= millennium, "{:?}", added.delay);
    }
    assert_eq!(q.delayed_len().await.unwrap(), 25);
}

/// A renewal interval as long as the lease (leases would expire while held) is refused by
/// `build()`, naming the setting; so is a lease under 10 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_work_are_refused_by_name() {
    let Some(server) = PgServer::start() else {
        return;
    };
    for renew in [Duration::from_secs(30), Duration::MAX] {
        let refused = builder(&server)
            .lease_duration(Duration::from_secs(30))
            .renew_every(renew)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, Error::Config(m) if m.contains("renew_every")),
            "{refused}"
        );
    }
    let refused = builder(&server)
        .lease_duration(Duration::from_millis(5))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::Config(m) if m.contains("lease_duration")),
        "{refused}"
    );
    // Without automatic renewal the interval does not matter.
    builder(&server)
        .auto_renew(false)
        .renew_every(Duration::MAX)
        .build()
        .await
        .unwrap();
}

/// `Workers` on a queue whose every duration is `Duration::MAX`: items are processed,
/// retried after a delay and given up, and the pool stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_run_on_a_queue_of_unlimited_settings() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = builder(&server)
        .lease_duration(Duration::MAX)
        .max_hold(Duration::MAX)
        .retry_deadline(Duration::MAX)
        .poll_interval(Duration::MAX)
        .backoff(Duration::ZERO, Duration::MAX)
        .build()
        .await
        .unwrap();
    let workers = Workers::new(q.clone())
        .count(2)
        .spawn_async(|item: String| async move {
            match item.as_str() {
                "later" => Outcome::RetryAfter(Duration::MAX),
                "drop" => Outcome::GiveUp,
                _ => Outcome::Done,
            }
        });
    q.add_all(["a", "later", "drop", "b"].map(String::from))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while workers.stats().processed < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            workers.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = workers.shut_down().await;
    assert_eq!(summary.succeeded, 2, "{summary:?}");
    assert_eq!(summary.retried, 1, "{summary:?}");
    assert_eq!(summary.given_up, 1, "{summary:?}");
    assert_eq!(q.delayed_len().await.unwrap(), 1);
}

/// A `PgAdmin` whose statement timeout is `Duration::MAX`, or longer than PostgreSQL takes
/// (30 days, over `i32::MAX` milliseconds), answers: no limit. The first panicked adding the
/// connection's wait to it; the second set a `statement_timeout` the server refuses, and
/// every call failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_statement_timeout_past_what_postgresql_takes_is_no_limit() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = builder(&server).build().await.unwrap();
    q.add("a".to_owned()).await.unwrap();
    let name = q.name().to_owned();
    for timeout in [Duration::MAX, Duration::from_secs(30 * 86_400)] {
        let admin = PgAdmin::new(&server.url())
            .unwrap()
            .statement_timeout(timeout);
        let summary = Admin::summary(&admin, &name).await.unwrap();
        assert_eq!(summary.depth, 1, "{timeout:?}");
        let purged = Admin::purge_dead_letters(&admin, &name).await.unwrap();
        assert_eq!(purged, 0, "{timeout:?}: a call in steps");
    }
}
