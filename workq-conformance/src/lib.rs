//! The rules every backend of the `workq` family is held to, as suites each crate runs in its
//! own tests, and the servers those tests start. Not published: a dev-dependency of the
//! crates of this workspace.
//!
//! - [`behaviour`]: the `Queue` rules of client-go's workqueue (order, dedup, delays, rate
//!   limits, shutdown, priorities) as async functions over a small view of a queue
//!   ([`behaviour::Backend`]), with that view for the in-memory `WorkQueue`.
//!   [`for_each_rule!`] names every rule.
//! - [`workers`] (feature `workers`): `workq::Workers` pools driven over a backend's queue
//!   through the `workq::Queue` trait, with the same outcomes, retries, give-ups, panics,
//!   timeouts, stops and summaries everywhere. [`for_each_workers_rule!`] names every rule.
//! - [`periodic`] (feature `periodic`): `workq::periodic` runners over several handles of
//!   one queue, on a fake clock: one item per tick across the handles, pause, catch-up,
//!   jitter. [`for_each_periodic_rule!`] names every rule.
//! - [`flow`]: flow control (groups taking turns, concurrency limits, hand-out rates) as rules
//!   over the `workq::Queue` trait, with a [`flow::FlowFactory`] a backend implements (or
//!   answers [`flow::Unsupported`] while it has none). [`for_each_flow_rule!`] and
//!   [`for_each_flow_workers_rule!`] name every rule.
//! - [`trace`] (feature `otel`): trace links from an add's span to the lease that hands the
//!   item out, as rules over the `workq::Queue` trait with a [`trace::TraceFactory`] a
//!   backend implements, and the in-memory exporters a backend's own trace tests read.
//!   [`for_each_trace_rule!`] names every rule.
//! - [`admin`]: the operator's contract (`workq::admin::Admin`) as rules over
//!   `Box<dyn Admin>`, with the [`admin::AdminFactory`] a backend implements to run them.
//!   [`for_each_admin_rule!`] names every rule.
//! - [`servers`]: a `redis-server`, a PostgreSQL server and an nginx of a test's own, on free
//!   loopback ports in temporary directories, stopped when dropped.
//!
//! A crate runs a suite by implementing its trait for its queues and instantiating every
//! rule with a macro of its own, one test per rule:
//!
//! ```ignore
//! macro_rules! behaviour_suite {
//!     ($($rule:ident),* $(,)?) => {
//!         $(
//!             #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//!             async fn $rule() {
//!                 workq_conformance::behaviour::rules::$rule(&MyFactory::start()).await;
//!             }
//!         )*
//!     };
//! }
//! workq_conformance::for_each_rule!(behaviour_suite);
//! ```
//!
//! The in-memory runs are `workq`'s own (`workq/tests/conformance.rs`); each backend runs the
//! suites on its server in its tests.

pub mod admin;
pub mod behaviour;
pub mod flow;
#[cfg(feature = "periodic")]
pub mod periodic;
pub mod servers;
#[cfg(feature = "otel")]
pub mod trace;
#[cfg(feature = "workers")]
pub mod workers;

use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh name for this test process: `prefix-0`, `prefix-1`, ... (queues on a shared
/// server, data directories).
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
