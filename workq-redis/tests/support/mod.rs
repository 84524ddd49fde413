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

/// The next lease of `queue`, within a bound.
pub(crate) async fn next(queue: &RedisQueue<String>) -> workq_redis::Lease<String> {
    tokio::time::timeout(Duration::from_secs(10), queue.get())
        .await
        .expect("a get that must be served")
        .unwrap()
        .expect("not shut down")
}

/// The keys of queue `name` (default prefix) on `server`, sorted.
pub(crate) async fn keys_of(server: &RedisServer, name: &str) -> Vec<String> {
    let mut con = raw(server).await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("wq:{{{name}}}:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// The calls of every command the server has run so far, by name (`INFO commandstats`, the
/// commands run by scripts included).
pub(crate) async fn command_calls(
    con: &redis::aio::MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let mut con = con.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?;
            Some((name.to_owned(), calls.parse::<u64>().ok()?))
        })
        .collect()
}

/// The commands an add of a new item, a get and a done with nothing re-added run on a queue
/// without priorities, flow control or trace links (`INFO commandstats`): what they ran
/// before either existed, and still run, with or without the feature `otel`.
pub(crate) const PLAIN_COMMANDS: (u64, u64, u64) = (14, 16, 9);

/// The commands [`PLAIN_COMMANDS`] counts, run on `queue` (whose scripts are loaded, and
/// which holds nothing): an add of `item`, its get and its done.
pub(crate) async fn plain_commands(
    con: &redis::aio::MultiplexedConnection,
    queue: &RedisQueue<String>,
    item: &str,
) -> (u64, u64, u64) {
    let (added, add) = commands_run_by(con, queue.add(item.to_owned())).await;
    added.unwrap();
    let (lease, get) = commands_run_by(con, next(queue)).await;
    let (done, finish) = commands_run_by(con, lease.done()).await;
    done.unwrap();
    (add, get, finish)
}

/// How many commands `op` made the server run inside its scripts and beside them: every
/// command but the script calls themselves (`EVALSHA`, `EVAL`) and the measure's `INFO`.
/// Nothing else may use the server meanwhile.
pub(crate) async fn commands_run_by<F: std::future::Future>(
    con: &redis::aio::MultiplexedConnection,
    op: F,
) -> (F::Output, u64) {
    let before = command_calls(con).await;
    let output = op.await;
    let after = command_calls(con).await;
    let ran = after
        .iter()
        .filter(|(name, _)| !["evalsha", "eval", "info"].contains(&name.as_str()))
        .map(|(name, n)| n - before.get(name).copied().unwrap_or(0))
        .sum();
    (output, ran)
}

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

/// Instantiates the rules `$rule` of a shared suite on [`RedisFactory`] (the caller names the
/// suite's `rules` module with a `use`): in a module `redis`, one test per rule, each on a
/// server of its own, and with the feature `cluster` the test `$cluster`, every rule one
/// after the other on one three-node Redis Cluster.
#[allow(unused_macros, reason = "each test binary uses some of it")]
macro_rules! on_redis_factory {
    ($cluster:ident; $($rule:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::support::RedisFactory::start() else {
                        return;
                    };
                    super::rules::$rule(&factory).await;
                }
            )*
        }
        /// Every rule, one after the other, on one three-node Redis Cluster.
        #[cfg(feature = "cluster")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $cluster() {
            let Some(factory) = support::RedisFactory::start_cluster() else {
                return;
            };
            $(
                rules::$rule(&factory).await;
            )*
        }
    };
}
#[allow(unused_imports, reason = "each test binary uses some of it")]
pub(crate) use on_redis_factory;

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

impl RedisFactory {
    /// A builder of a fresh queue `prefix-N` on the server (or the cluster), with the suites'
    /// lease and poll settings.
    pub(crate) fn builder(&self, prefix: &str) -> workq_redis::Builder<String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let builder = RedisQueue::builder(format!("{prefix}-{n}")).url(self.server.url());
        #[cfg(feature = "cluster")]
        let builder = match &self.cluster {
            Some(cluster) => builder.cluster(cluster.urls()),
            None => builder,
        };
        builder
            .lease_duration(Duration::from_secs(10))
            // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
            .poll_interval(Duration::from_secs(10))
    }
}

impl Factory for RedisFactory {
    type Queue = Redis;

    async fn queue(&self, opts: Opts) -> Redis {
        let mut limit = RateLimit::exponential(opts.base, opts.max);
        if let Some((qps, burst)) = opts.bucket {
            limit = limit.with_bucket(qps, burst);
        }
        let queue = self
            .builder("suite")
            .rate_limit(limit)
            .build()
            .await
            .expect("connect to the test server");
        Redis(queue)
    }
}

/// The trace link suite's queues (feature `otel`): plain or grouped, and with leases that
/// expire for the rule of a lost lease.
#[cfg(feature = "otel")]
impl workq_conformance::trace::TraceFactory for RedisFactory {
    type Q = RedisQueue<String>;

    async fn queue(&self, grouped: bool) -> RedisQueue<String> {
        let builder = self.builder("trace");
        let builder = if grouped {
            builder.group_by(|item: &String| workq_conformance::flow::group_of(item).to_owned())
        } else {
            builder
        };
        builder.build().await.expect("connect to the test server")
    }

    async fn expiring_queue(&self, lease: Duration) -> Option<RedisQueue<String>> {
        let queue = self
            .builder("trace-expiring")
            .lease_duration(lease)
            .auto_renew(false)
            .build()
            .await
            .expect("connect to the test server");
        Some(queue)
    }

    /// Nothing sent: the server reclaims the item once the lease expires.
    fn crash(lease: workq_redis::Lease<String>) {
        lease.abandon();
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
