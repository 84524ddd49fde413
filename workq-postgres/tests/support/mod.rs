//! Test support: a PostgreSQL server of the test's own (`workq-conformance`'s), and the
//! shared behaviour suite's view of a queue (`workq_conformance::behaviour`'s trait)
//! implemented for the PostgreSQL queue.

#![allow(dead_code, reason = "each test binary uses some of it")]

use std::sync::Arc;
use std::time::Duration;

use workq::{AddOptions, TryGetError};
use workq_conformance::behaviour::{Backend, Factory, Opts};
pub(crate) use workq_conformance::servers::postgres::PgServer;
/// A fresh queue name for this test process.
pub(crate) use workq_conformance::unique_name as unique;
use workq_postgres::PgQueue;

#[derive(Clone)]
pub(crate) struct Pg(pub(crate) PgQueue<String>);

/// Queues on a server of this test's own.
pub(crate) struct PgFactory {
    pub(crate) server: Arc<PgServer>,
}

impl PgFactory {
    /// Starts a server. A missing PostgreSQL fails the test (naming the package), unless
    /// `WQ_SKIP_PG_TESTS=1` outside CI: then `None`.
    pub(crate) fn start() -> Option<Self> {
        Some(PgFactory {
            server: Arc::new(PgServer::start()?),
        })
    }
}

impl Factory for PgFactory {
    type Queue = Pg;

    async fn queue(&self, opts: Opts) -> Pg {
        let queue = PgQueue::builder(unique("suite"))
            .url(self.server.url())
            .backoff(opts.base, opts.max)
            .token_bucket(opts.bucket)
            .lease_duration(Duration::from_secs(10))
            // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
            .poll_interval(Duration::from_secs(10))
            .build()
            .await
            .expect("connect to the test server");
        Pg(queue)
    }
}

impl Backend for Pg {
    type Lease = workq_postgres::Lease<String>;

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

/// Waits until a statement of the queue whose text holds `needle` waits for a lock.
pub(crate) async fn waiting_for_a_lock(admin: &sqlx::PgPool, needle: &str) -> i32 {
    let started = std::time::Instant::now();
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'
               AND pid <> pg_backend_pid() LIMIT 1",
        )
        .bind(needle)
        .fetch_optional(admin)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no {needle} waits"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A builder of a fresh queue on `server` with the flow control `spec` describes, grouping
/// `"group/name"` items by `group` (`workq_conformance::flow`'s items). Getters poll every
/// 60 s and leases last a minute (a getter's sweep comes every 15 s): far above the wake-up
/// bounds the rules assert (10 s), so a wake-up is never a poll.
pub(crate) fn flow_builder(
    server: &PgServer,
    spec: &workq_conformance::flow::FlowSpec,
) -> workq_postgres::Builder<String> {
    let mut builder = PgQueue::builder(unique("flow"))
        .url(server.url())
        .lease_duration(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(60))
        .group_by(|item: &String| workq_conformance::flow::group_of(item).to_owned());
    if let Some(n) = spec.max_in_flight {
        builder = builder.max_in_flight(n);
    }
    if let Some(n) = spec.max_in_flight_per_group {
        builder = builder.max_in_flight_per_group(n);
    }
    for (group, n) in &spec.group_limits {
        builder = builder.group_max_in_flight(group.clone(), *n);
    }
    for (group, w) in &spec.group_weights {
        builder = builder.group_weight(group.clone(), *w);
    }
    if let Some((rate, burst)) = spec.hand_out_rate {
        builder = builder.hand_out_rate(rate, burst);
    }
    for (group, rate, burst) in &spec.group_rates {
        builder = builder.group_hand_out_rate(group.clone(), *rate, *burst);
    }
    builder
}
