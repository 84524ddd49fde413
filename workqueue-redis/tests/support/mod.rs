//! Test support: a `redis-server` of the test's own, and the behaviour suite's view of a
//! queue (one trait, implemented for the in-memory queue and for the Redis queue).

#![allow(dead_code)]

pub(crate) mod server;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use workqueue::rate_limiter::{ExponentialFailure, MaxOf, RateLimiter, TokenBucket};
use workqueue::{AddOptions, TryGetError, WorkQueue};
use workqueue_redis::{RateLimit, RedisQueue};

pub(crate) use server::RedisServer;

/// The rate limiter a rule asks for; both backends build the same one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    /// Exponential backoff: base and cap.
    pub(crate) base: Duration,
    pub(crate) max: Duration,
    /// A token bucket: rate and burst.
    pub(crate) bucket: Option<(f64, u32)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            bucket: None,
        }
    }
}

/// A queue as the behaviour suite sees it: `WorkQueue`'s methods, made async.
pub(crate) trait Backend: Clone + Send + Sync + 'static {
    /// What `get` hands out.
    type Lease: Send + 'static;
    fn add(&self, item: &str) -> impl Future<Output = ()> + Send;
    fn add_after(&self, item: &str, delay: Duration) -> impl Future<Output = ()> + Send;
    fn add_rate_limited(&self, item: &str) -> impl Future<Output = ()> + Send;
    fn add_with(&self, item: &str, options: AddOptions) -> impl Future<Output = ()> + Send;
    fn forget(&self, item: &str) -> impl Future<Output = ()> + Send;
    fn num_requeues(&self, item: &str) -> impl Future<Output = usize> + Send;
    fn len(&self) -> impl Future<Output = usize> + Send;
    fn get(&self) -> impl Future<Output = Option<Self::Lease>> + Send;
    fn try_get(&self) -> impl Future<Output = Result<Self::Lease, TryGetError>> + Send;
    fn shut_down(&self) -> impl Future<Output = ()> + Send;
    fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send;
    fn is_shutting_down(&self) -> impl Future<Output = bool> + Send;
    fn item(lease: &Self::Lease) -> String;
    fn priority(lease: &Self::Lease) -> i32;
    fn done(lease: Self::Lease) -> impl Future<Output = ()> + Send;
}

/// Makes fresh, empty queues for one test.
pub(crate) trait Factory: Send + Sync {
    type Queue: Backend;
    fn queue(&self, opts: Opts) -> impl Future<Output = Self::Queue> + Send;
}

// ===== in memory =====

#[derive(Clone)]
pub(crate) struct Memory(WorkQueue<String>);

pub(crate) struct MemoryFactory;

impl Factory for MemoryFactory {
    type Queue = Memory;

    async fn queue(&self, opts: Opts) -> Memory {
        let exponential = ExponentialFailure::new(opts.base, opts.max);
        let queue = match opts.bucket {
            None => WorkQueue::builder().rate_limiter(exponential).build(),
            Some((qps, burst)) => {
                let limiters: Vec<Box<dyn RateLimiter<String>>> = vec![
                    Box::new(exponential),
                    Box::new(TokenBucket::new(qps, burst as usize)),
                ];
                WorkQueue::builder()
                    .rate_limiter(MaxOf::new(limiters))
                    .build()
            }
        };
        Memory(queue)
    }
}

impl Backend for Memory {
    type Lease = workqueue::Lease<String>;

    async fn add(&self, item: &str) {
        self.0.add(item.to_owned());
    }
    async fn add_after(&self, item: &str, delay: Duration) {
        self.0.add_after(item.to_owned(), delay);
    }
    async fn add_rate_limited(&self, item: &str) {
        self.0.add_rate_limited(item.to_owned());
    }
    async fn add_with(&self, item: &str, options: AddOptions) {
        self.0.add_with(item.to_owned(), options);
    }
    async fn forget(&self, item: &str) {
        self.0.forget(&item.to_owned());
    }
    async fn num_requeues(&self, item: &str) -> usize {
        self.0.num_requeues(&item.to_owned())
    }
    async fn len(&self) -> usize {
        self.0.len()
    }
    async fn get(&self) -> Option<Self::Lease> {
        self.0.get().await
    }
    async fn try_get(&self) -> Result<Self::Lease, TryGetError> {
        self.0.try_get()
    }
    async fn shut_down(&self) {
        self.0.shut_down();
    }
    async fn shut_down_with_drain(&self) {
        self.0.shut_down_with_drain().await;
    }
    async fn is_shutting_down(&self) -> bool {
        self.0.is_shutting_down()
    }
    fn item(lease: &Self::Lease) -> String {
        lease.item().clone()
    }
    fn priority(lease: &Self::Lease) -> i32 {
        lease.priority()
    }
    async fn done(lease: Self::Lease) {
        lease.done();
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
    type Lease = workqueue_redis::Lease<String>;

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
