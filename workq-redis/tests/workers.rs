//! `Workers` on Redis: each rule of the shared suite (`workq_conformance::workers`) runs,
//! unchanged, over `RedisQueue` on a `redis-server` the test starts itself, through the
//! `workq::Queue` trait. Same outcomes, retries, give-ups, panics, timeouts, stops and
//! summaries as the in-memory queue (alone, and seen as a backend whose steps `Workers`
//! batch: `workq`'s tests); where the backends differ by design (a shut down handle on Redis
//! keeps its delayed items on the server), the rule says so.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workq::Workers;
use workq_redis::{RateLimit, RedisQueue};

use support::RedisServer;
use workq_conformance::workers::{Backend, eventually, rules};

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

impl Backend for Redis {
    type Q = RedisQueue<String>;
    const SHARED: bool = true;

    async fn queue(&self) -> RedisQueue<String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        RedisQueue::builder(format!("workers-{n}"))
            .url(self.server.url())
            .rate_limit(RateLimit::exponential(
                Duration::from_millis(5),
                Duration::from_secs(1),
            ))
            .lease_duration(Duration::from_secs(10))
            .build()
            .await
            .expect("connect to the test server")
    }

    async fn shut_down_everyone(queue: &RedisQueue<String>) {
        queue.shut_down_fleet().await.unwrap();
    }

    async fn delayed(queue: &RedisQueue<String>) -> usize {
        queue.delayed_len().await.unwrap()
    }

    async fn expiring(&self, lease: Duration) -> Option<(RedisQueue<String>, RedisQueue<String>)> {
        let name = format!("workers-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let handle = || async {
            RedisQueue::builder(name.clone())
                .url(self.server.url())
                .rate_limit(RateLimit::exponential(
                    Duration::from_millis(5),
                    Duration::from_secs(1),
                ))
                .lease_duration(lease)
                .auto_renew(false)
                .build()
                .await
                .expect("connect to the test server")
        };
        Some((handle().await, handle().await))
    }
}

/// Instantiates every rule on Redis.
macro_rules! workers_suite {
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

workq_conformance::for_each_workers_rule!(workers_suite);

/// A server that goes away for longer than the retry deadline: the workers log, back off and
/// keep going, and process what is added once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_workers_ride_out_a_server_outage() {
    let Some(mut server) = support::server::require() else {
        return;
    };
    let queue: RedisQueue<String> = RedisQueue::builder("outage")
        .url(server.url())
        .retry_deadline(Duration::from_millis(200))
        .lease_duration(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let workers = Workers::new(queue.clone())
        .count(2)
        .spawn_async(move |item: String| {
            sink.lock().unwrap().push(item);
            async {}
        });
    queue.add("before".to_owned()).await.unwrap();
    eventually("the first item", || async {
        workers.stats().processed == 1
    })
    .await;
    server.kill();
    // Past the retry deadline: the workers' gets fail and back off.
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match queue.add("after".to_owned()).await {
            Ok(_) => break,
            Err(error) => {
                assert!(Instant::now() < deadline, "the server is back: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eventually("the item added after the outage", || async {
        workers.stats().processed == 2
    })
    .await;
    let summary = workers.shut_down().await;
    assert_eq!(summary.succeeded, 2);
    assert_eq!(*seen.lock().unwrap(), ["before", "after"]);
}
