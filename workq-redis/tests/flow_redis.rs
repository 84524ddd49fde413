//! Flow control on Redis: every rule of the shared flow suite (`workq_conformance::flow`),
//! alone and driving a pool of `Workers` (whose steps are batched on Redis), over
//! `RedisQueue` on a `redis-server` the test starts itself; then what is Redis's own: the
//! settings kept on the server for every process (the last handle built wins, the others
//! follow and say so), limits across handles built separately as processes would build
//! them, a restart from the AOF, the operator's view, and `delete` leaving no key behind.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use workq_conformance::flow::{FlowFactory, FlowSpec, Unsupported};
use workq_redis::{Builder, RedisQueue};

use support::RedisServer;

/// Queues with flow control on a server of the test's own.
struct RedisFlow {
    server: RedisServer,
    next: AtomicUsize,
}

impl RedisFlow {
    fn start() -> Option<Self> {
        Some(RedisFlow {
            server: support::server::require()?,
            next: AtomicUsize::new(0),
        })
    }
}

/// A handle on queue `name` built as `spec` says.
fn flow_builder(url: &str, name: &str, spec: &FlowSpec) -> Builder<String> {
    workq_conformance::with_flow_spec!(
        RedisQueue::builder(name)
            .url(url)
            .lease_duration(Duration::from_secs(10))
            // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
            .poll_interval(Duration::from_secs(30)),
        spec
    )
}

impl RedisFlow {
    fn name(&self) -> String {
        format!("flow-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

impl FlowFactory for RedisFlow {
    type Q = RedisQueue<String>;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<RedisQueue<String>, Unsupported> {
        Ok(flow_builder(&self.server.url(), &self.name(), &spec)
            .build()
            .await
            .expect("connect to the test server"))
    }

    /// Handles built one by one, each with its own connections, as processes build them.
    async fn flow_handles(
        &self,
        spec: FlowSpec,
        n: usize,
    ) -> Result<Vec<RedisQueue<String>>, Unsupported> {
        let name = self.name();
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            handles.push(
                flow_builder(&self.server.url(), &name, &spec)
                    .build()
                    .await
                    .expect("connect to the test server"),
            );
        }
        Ok(handles)
    }

    async fn expiring_flow_queue(
        &self,
        spec: FlowSpec,
        lease: Duration,
    ) -> Result<RedisQueue<String>, Unsupported> {
        Ok(flow_builder(&self.server.url(), &self.name(), &spec)
            .lease_duration(lease)
            .auto_renew(false)
            .build()
            .await
            .expect("connect to the test server"))
    }

    /// Nothing sent: the lease expires on the server.
    fn crash(lease: workq_redis::Lease<String>) {
        lease.abandon();
    }
}

/// Instantiates every flow rule on Redis.
macro_rules! flow_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::RedisFlow::start() else {
                        return;
                    };
                    workq_conformance::flow::rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_rule!(flow_suite);

/// Instantiates every flow rule that drives a pool of `Workers` on Redis.
macro_rules! flow_workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow_workers {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::RedisFlow::start() else {
                        return;
                    };
                    workq_conformance::flow::workers_rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_workers_rule!(flow_workers_suite);
