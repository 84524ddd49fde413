//! What a 10,000-object relist costs a controller on a shared Redis queue: the time until
//! every listed key is in Redis, and the scripts the server ran for it (`INFO commandstats`),
//! with the keys added in batches (`Queue::add_all_with`, 200 per script run, one round
//! trip) and one by one (the trait's provided method, a round trip each).
//!
//! The reconcile holds its first key, so what is measured is the list's way into the queue,
//! nothing else. Each run uses a fresh queue name on the same server.
//!
//! ```sh
//! cargo run --release -p workq-kube --example redis_relist                     # its own redis-server
//! cargo run --release -p workq-kube --example redis_relist -- redis://127.0.0.1:6379/
//! ```
//!
//! Figures from a busy machine are indications, not benchmarks.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use tokio::sync::watch;
use workq::{AddOptions, Outcome, Queue};
// The tests' `redis-server` of our own on a free port.
use workq_conformance::servers::redis as server;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;
use workq_redis::RedisQueue;

/// Objects listed.
const OBJECTS: usize = 10_000;

/// A queue that adds a batch one key at a time: the trait's provided `add_all_with`, the
/// cost of a backend without batching.
#[derive(Clone)]
struct OneByOne(RedisQueue<String>);

impl Queue for OneByOne {
    type Item = String;
    type Lease = workq_redis::Lease<String>;
    type Error = workq_redis::Error;

    fn name(&self) -> Option<&str> {
        Some(self.0.name())
    }

    fn add_with(
        &self,
        item: String,
        options: AddOptions,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        Queue::add_with(&self.0, item, options)
    }

    fn forget(&self, item: &String) -> impl Future<Output = Result<(), Self::Error>> + Send {
        Queue::forget(&self.0, item)
    }

    fn num_requeues(
        &self,
        item: &String,
    ) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        Queue::num_requeues(&self.0, item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        Queue::len(&self.0)
    }

    fn get(&self) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        Queue::get(&self.0)
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.0)
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        Queue::shut_down_with_drain(&self.0)
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        Queue::is_shutting_down(&self.0)
    }
}

/// Scripts the server has run so far.
async fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Lists the server's objects into a controller on `queue`; returns the time until every key
/// is in the queue, and the scripts run meanwhile.
async fn relist<Q>(api: &FakeApiServer, url: &str, queue: Q) -> (Duration, u64)
where
    Q: Queue<Item = String>,
{
    let (open, gate) = watch::channel(false);
    let before = script_calls(url).await;
    let started = Instant::now();
    let controller = Controller::with_queue(
        queue,
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        move |_: Arc<ConfigMap>, _: Arc<()>| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                Outcome::Done
            }
        },
        Arc::new(()),
    );
    while controller.feed_stats().added < OBJECTS as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let scripts = script_calls(url).await - before;
    open.send_replace(true);
    controller.stop();
    drop(controller);
    (elapsed, scripts)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::args().nth(1) {
        Some(url) => (url, None),
        None => {
            let server = server::RedisServer::start_with(server::Durability::None, &[])
                .ok_or("redis-server not found: install it, or pass a Redis URL")?;
            (server.url(), Some(server))
        }
    };
    let api = FakeApiServer::start().await;
    for index in 0..OBJECTS {
        api.apply(&ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("web-{index:05}")),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "relist of {OBJECTS} objects into Redis (load average {})",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for run in 0..2 {
        let batched: RedisQueue<String> =
            RedisQueue::connect(&url, &format!("relist-batched-{run}")).await?;
        let (time, scripts) = relist(&api, &url, batched).await;
        println!(
            "  batched     {:>8.1} ms  {scripts:>6} scripts",
            time.as_secs_f64() * 1e3
        );
        let single: RedisQueue<String> =
            RedisQueue::connect(&url, &format!("relist-one-by-one-{run}")).await?;
        let (time, scripts) = relist(&api, &url, OneByOne(single)).await;
        println!(
            "  one by one  {:>8.1} ms  {scripts:>6} scripts",
            time.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
