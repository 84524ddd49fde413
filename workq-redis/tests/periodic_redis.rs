//! Periodic work on Redis: every shared periodic rule (`workq_conformance::periodic`) over
//! handles of one queue with connections of their own, on a fake clock, and the fleet test:
//! three processes run one schedule on one queue on a real clock, and the queue holds
//! exactly one item per tick. Plus the records as the listing reads them.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use workq::periodic::{ScheduleUpdate, TickClaim, TickOutcome};
use workq::{AddOptions, Queue};
use workq_conformance::periodic::{Backend, fleet, rules};
use workq_redis::{Error, RedisQueue};

use support::RedisServer;

struct Redis {
    server: RedisServer,
    next: AtomicUsize,
}

impl Redis {
    fn start() -> Option<Self> {
        Some(Redis {
            server: support::server::require()?,
            next: AtomicUsize::new(0),
        })
    }
}

/// A handle on queue `name`, with a connection of its own.
async fn connect(url: String, name: String) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(url)
        .build()
        .await
        .expect("connect to the test server")
}

impl Backend for Redis {
    type Q = RedisQueue<String>;

    async fn handles(&self, n: usize) -> Vec<RedisQueue<String>> {
        let name = format!("periodic-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut handles = Vec::new();
        for _ in 0..n {
            handles.push(connect(self.server.url(), name.clone()).await);
        }
        handles
    }
}

/// Instantiates every periodic rule on Redis.
macro_rules! periodic_suite {
    ($($rule:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(backend) = super::Redis::start() else {
                        return;
                    };
                    super::rules::$rule(&backend).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_periodic_rule!(periodic_suite);

/// A child of [`three_processes_add_exactly_one_item_per_tick`]; does nothing when run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_fleet_child() {
    fleet::child(connect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_add_exactly_one_item_per_tick() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = connect(server.url(), "fleet".to_owned()).await;
    fleet::run("periodic_fleet_child", &server.url(), "fleet", &queue, 3).await;
    let listed = queue.schedules().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].spec.as_str()),
        ("fleet", "every 1s")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_reads_every_schedule_and_a_rate_limited_tick_is_refused() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = connect(server.url(), "listed".to_owned()).await;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
    for name in ["b-hourly", "a-nightly"] {
        queue
            .upsert_schedule(ScheduleUpdate::register(
                name,
                "every 1h",
                Some(at(3600)),
                at(0),
            ))
            .await
            .unwrap();
    }
    let claim = TickClaim::new("b-hourly", "every 1h", at(3600), Some(at(7200)), at(3600));
    assert_eq!(
        queue
            .add_on_tick(
                claim.clone(),
                "x".to_owned(),
                AddOptions::default().priority(5)
            )
            .await
            .unwrap(),
        TickOutcome::Added
    );
    let listed = queue.schedules().await.unwrap();
    let names: Vec<_> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a-nightly", "b-hourly"]);
    assert_eq!(listed[1].last_tick, Some(at(3600)));
    assert_eq!(listed[1].next_tick, Some(at(7200)));
    assert_eq!(listed[0].last_tick, None);
    let lease = Queue::get(&queue).await.unwrap().unwrap();
    assert_eq!((lease.item().as_str(), lease.priority()), ("x", 5));
    lease.done().await.unwrap();

    let refused = queue
        .add_on_tick(claim, "y".to_owned(), AddOptions::default().rate_limited())
        .await;
    assert!(matches!(refused, Err(Error::Unsupported(_))), "{refused:?}");
}

/// A server restart under a running schedule: the runner logs the failures, retries, and
/// takes the ticks that come due once the server is back (on a real clock, every second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_rides_out_a_server_restart() {
    use workq::periodic::{Periodic, Schedule};
    let Some(mut server) = support::server::require() else {
        return;
    };
    let queue: RedisQueue<String> = RedisQueue::builder("restart")
        .url(server.url())
        .retry_deadline(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let runner = Periodic::new(
        queue.clone(),
        "restart",
        Schedule::every(Duration::from_secs(1)),
        |tick| format!("{tick:?}"),
    )
    .spawn();
    let guard = Duration::from_secs(60);
    let first = tokio::time::timeout(guard, runner.wait_for(|s| s.added >= 1))
        .await
        .expect("a first tick");
    server.kill();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart();
    let after = tokio::time::timeout(guard, runner.wait_for(|s| s.added >= first.added + 2))
        .await
        .expect("ticks after the restart");
    assert!(!after.stopped, "{after:?}");
    assert!(after.errors >= 1, "the outage was not seen: {after:?}");
    runner.stop().await;
}
