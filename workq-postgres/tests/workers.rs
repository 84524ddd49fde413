//! `Workers` on PostgreSQL: every rule of the shared suite (`workq_conformance::workers`)
//! runs over `PgQueue` on a server the test starts itself, through the `workq::Queue` trait,
//! with the outcomes, retries and give-ups the in-memory queue has (`workq`'s tests run the
//! same rules in memory).

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{PgServer, unique};
use workq::Workers;
use workq_conformance::workers::{Backend, eventually, rules};
use workq_postgres::PgQueue;

struct Postgres {
    server: PgServer,
}

impl Backend for Postgres {
    type Q = PgQueue<String>;
    const SHARED: bool = true;

    async fn queue(&self) -> PgQueue<String> {
        PgQueue::builder(unique("workers"))
            .url(self.server.url())
            .backoff(Duration::from_millis(5), Duration::from_secs(1))
            .token_bucket(None)
            .lease_duration(Duration::from_secs(10))
            .build()
            .await
            .expect("connect to the test server")
    }

    async fn shut_down_everyone(queue: &PgQueue<String>) {
        queue.shut_down_fleet().await.unwrap();
    }

    async fn delayed(queue: &PgQueue<String>) -> usize {
        queue.delayed_len().await.unwrap()
    }

    async fn expiring(&self, lease: Duration) -> Option<(PgQueue<String>, PgQueue<String>)> {
        let name = unique("workers");
        let handle = || async {
            PgQueue::builder(name.clone())
                .url(self.server.url())
                .backoff(Duration::from_millis(5), Duration::from_secs(1))
                .token_bucket(None)
                .lease_duration(lease)
                .auto_renew(false)
                .build()
                .await
                .expect("connect to the test server")
        };
        Some((handle().await, handle().await))
    }
}

/// Instantiates every rule on PostgreSQL.
macro_rules! workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(server) = super::PgServer::start() else {
                        return;
                    };
                    super::rules::$rule(&super::Postgres { server }).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_workers_rule!(workers_suite);

/// A server killed for longer than the retry deadline: the workers log, back off and keep
/// going, and process what is added once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_workers_ride_out_a_server_outage() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let queue: PgQueue<String> = PgQueue::builder(unique("outage"))
        .url(server.url())
        .retry_deadline(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(200))
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
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
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
