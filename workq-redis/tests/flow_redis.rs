//! Flow control on Redis: every rule of the shared flow suite (`workq_conformance::flow`),
//! alone and driving a pool of `Workers` (whose steps are batched on Redis), over
//! `RedisQueue` on a `redis-server` the test starts itself; then what is Redis's own: the
//! settings kept on the server for every process (the last handle built wins, the others
//! follow and say so), limits across handles built separately as processes would build
//! them, a restart from the AOF, the operator's view, and `delete` leaving no key behind.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use workq_conformance::flow::{FlowFactory, FlowSpec, Unsupported, group_of};
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

/// `spec`'s settings on a builder of queue `name`.
fn flow_builder(url: &str, name: &str, spec: &FlowSpec) -> Builder<String> {
    let mut builder = RedisQueue::builder(name)
        .url(url)
        .lease_duration(Duration::from_secs(10))
        // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
        .poll_interval(Duration::from_secs(30))
        .group_by(|item: &String| group_of(item).to_owned());
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

impl FlowFactory for RedisFlow {
    type Q = RedisQueue<String>;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<RedisQueue<String>, Unsupported> {
        let name = format!("flow-{}", self.next.fetch_add(1, Ordering::Relaxed));
        Ok(flow_builder(&self.server.url(), &name, &spec)
            .build()
            .await
            .expect("connect to the test server"))
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
