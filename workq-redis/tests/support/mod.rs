//! Test support: a `redis-server` of the test's own (`workq-conformance`'s), and the
//! behaviour suite's view of a queue (`workq_conformance::behaviour`'s trait) implemented
//! here for the Redis queue.

#![allow(dead_code, reason = "each test binary uses some of it")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use workq::{AddOptions, TryGetError};
use workq_conformance::behaviour::{Backend, Factory, Opts};
pub(crate) use workq_conformance::servers::redis as server;
use workq_redis::{RateLimit, RedisQueue};

pub(crate) use server::RedisServer;

/// What the `tracing` events of the current thread wrote, as text.
#[derive(Clone, Default)]
pub(crate) struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Writes the events of the current thread here (and of the tasks it runs: on a
    /// current-thread runtime, every task) until the guard is dropped.
    pub(crate) fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .finish(),
        )
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Sets `maxmemory-policy` on the running server at `url`.
pub(crate) async fn set_eviction(url: &str, policy: &str) {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(&mut con)
        .await
        .unwrap();
}

pub(crate) mod flow_check;

/// A connection of the test's own to `server`, for looking at the keys or acting on the
/// server beside the queue.
pub(crate) async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A `try_get` on a Redis queue and on the in-memory queue it is held against (a model
/// test): both hand out the same item at the same priority (the pair of leases), or neither
/// hands out anything; else the case fails, `at` saying where.
pub(crate) async fn try_get_both(
    redis: &RedisQueue<String>,
    memory: &workq::WorkQueue<String>,
    at: &str,
) -> Result<
    Option<(workq_redis::Lease<String>, workq::Lease<String>)>,
    proptest::test_runner::TestCaseError,
> {
    use proptest::test_runner::TestCaseError;

    let r = redis
        .try_get()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?
        .into_result();
    match (r, memory.try_get()) {
        (Ok(r), Ok(m)) if (r.item(), r.priority()) == (m.item(), m.priority()) => Ok(Some((r, m))),
        (Err(TryGetError::Empty), Err(TryGetError::Empty)) => Ok(None),
        (r, m) => Err(TestCaseError::fail(format!(
            "{at}: redis {:?}, memory {:?}",
            r.map(|l| (l.item().clone(), l.priority())),
            m.map(|l| (l.item().clone(), l.priority()))
        ))),
    }
}

/// Runs `cases` random cases of `strategy` (a model test), each on a fresh queue named
/// `prefix-N` on one server of the test's own: `case(url, name, value)`. Panics with
/// proptest's report (the minimal failing case) when one fails.
pub(crate) fn run_cases<S, F, Fut>(prefix: &str, cases: u32, strategy: S, case: F)
where
    S: proptest::strategy::Strategy,
    F: Fn(String, String, S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), proptest::test_runner::TestCaseError>>,
{
    use proptest::test_runner::{Config, TestRunner};

    let Some(server) = server::require() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let next = AtomicU64::new(0);
    let result = runner.run(&strategy, |value| {
        let name = format!("{prefix}-{}", next.fetch_add(1, Ordering::Relaxed));
        runtime.block_on(case(server.url(), name, value))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Fills `server` (started with `--enable-debug-command yes`) with `keys` keys and rewrites
/// its AOF with them, so that a restart takes a while to load it (and answers `LOADING`
/// meanwhile). Returns a connection to it that waits for any answer.
pub(crate) async fn fill_aof(server: &RedisServer, keys: u64) -> redis::aio::MultiplexedConnection {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(keys)
        .query_async(&mut con)
        .await
        .unwrap();
    let _: String = redis::cmd("BGREWRITEAOF")
        .query_async(&mut con)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut con)
            .await
            .unwrap();
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            return con;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the AOF rewrite did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ===== on Redis =====

#[derive(Clone)]
pub(crate) struct Redis(RedisQueue<String>);

/// Queues on a server (or cluster) of this test's own.
pub(crate) struct RedisFactory {
    pub(crate) server: Arc<RedisServer>,
    /// Set for a cluster: the queues connect to its nodes.
    cluster: Option<server::RedisCluster>,
    next: AtomicU64,
}

impl RedisFactory {
    /// Starts a server. A missing `redis-server` fails the test (naming the package), unless
    /// `WQ_SKIP_REDIS_TESTS=1` outside CI: then `None`.
    pub(crate) fn start() -> Option<Self> {
        Some(RedisFactory {
            server: Arc::new(server::require()?),
            cluster: None,
            next: AtomicU64::new(0),
        })
    }

    /// Starts a three-node cluster (see [`server::RedisCluster`]).
    pub(crate) fn start_cluster() -> Option<Self> {
        if !server::require_binary() {
            return None;
        }
        let cluster = server::RedisCluster::start()?;
        Some(RedisFactory {
            // Unused for queues; kept so the type stays one.
            server: Arc::new(server::require()?),
            cluster: Some(cluster),
            next: AtomicU64::new(0),
        })
    }
}

impl Factory for RedisFactory {
    type Queue = Redis;

    async fn queue(&self, opts: Opts) -> Redis {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut limit = RateLimit::exponential(opts.base, opts.max);
        if let Some((qps, burst)) = opts.bucket {
            limit = limit.with_bucket(qps, burst);
        }
        let builder = RedisQueue::builder(format!("suite-{n}")).url(self.server.url());
        #[cfg(feature = "cluster")]
        let builder = match &self.cluster {
            Some(cluster) => builder.cluster(cluster.urls()),
            None => builder,
        };
        let queue = builder
            .rate_limit(limit)
            .lease_duration(Duration::from_secs(10))
            // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
            .poll_interval(Duration::from_secs(10))
            .build()
            .await
            .expect("connect to the test server");
        Redis(queue)
    }
}

impl Backend for Redis {
    type Lease = workq_redis::Lease<String>;

    async fn add(&self, item: &str) {
        self.0.add(item.to_owned()).await.unwrap();
    }
    async fn add_after(&self, item: &str, delay: Duration) {
        self.0.add_after(item.to_owned(), delay).await.unwrap();
    }
    async fn add_rate_limited(&self, item: &str) {
        self.0.add_rate_limited(item.to_owned()).await.unwrap();
    }
    async fn add_with(&self, item: &str, options: AddOptions) {
        self.0.add_with(item.to_owned(), options).await.unwrap();
    }
    async fn forget(&self, item: &str) {
        self.0.forget(item.to_owned()).await.unwrap();
    }
    async fn num_requeues(&self, item: &str) -> usize {
        self.0.num_requeues(item.to_owned()).await.unwrap()
    }
    async fn len(&self) -> usize {
        self.0.len().await.unwrap()
    }
    async fn get(&self) -> Option<Self::Lease> {
        self.0.get().await.unwrap()
    }
    async fn try_get(&self) -> Result<Self::Lease, TryGetError> {
        self.0.try_get().await.unwrap().into_result()
    }
    /// client-go's `ShutDown` of the shared queue: the fleet-wide one (a handle's own
    /// `shut_down` stops only that handle, and has tests of its own).
    async fn shut_down(&self) {
        self.0.shut_down_fleet().await.unwrap();
    }
    /// This handle's drain: it waits for the leases this handle handed out.
    async fn shut_down_with_drain(&self) {
        self.0.shut_down_with_drain().await.unwrap();
    }
    async fn is_shutting_down(&self) -> bool {
        self.0.is_shutting_down().await.unwrap()
    }
    fn item(lease: &Self::Lease) -> String {
        lease.item().clone()
    }
    fn priority(lease: &Self::Lease) -> i32 {
        lease.priority()
    }
    async fn done(lease: Self::Lease) {
        lease.done().await.unwrap();
    }
}
