//! Metrics: what a named queue reports, and to whom.
//!
//! A queue built with a [`name`](crate::Builder::name) and a
//! [`metrics`](crate::Builder::metrics) provider reports every add, hand-out, done, retry
//! and rate-limiter delay to a [`QueueMetrics`] the provider creates for it. This is
//! client-go's `MetricsProvider` idea, with one object per queue instead of one per series.
//! A queue without a name or without a provider records nothing and reads no clock for it.
//!
//! Values that client-go refreshes on a 500 ms ticker (unfinished work, longest running
//! processor) are read when scraped instead, through the [`QueueProbe`] the provider is
//! given; so are the delayed items. No thread is involved.
//!
//! The rules are client-go's (`queue.go`, `metrics.go`):
//!
//! | event | call |
//! | --- | --- |
//! | an item becomes dirty: added (or due) while neither queued nor marked for re-queue, including while it is processed | [`QueueMetrics::add`] (depth + 1, adds + 1) |
//! | an item is handed out | [`QueueMetrics::get`] with the time since it became dirty (depth - 1) |
//! | a lease is dropped | [`QueueMetrics::done`] with the time since the hand-out |
//! | `add_after`, `add_rate_limited`, or `add_with` with a delay or rate limiting, while running | [`QueueMetrics::retry`] |
//! | `add_rate_limited` (or `add_with(.., rate_limited)`) | [`QueueMetrics::rate_limited`] with the limiter's delay |
//!
//! With the `prometheus` feature, `prometheus::PrometheusMetrics` exports Kubernetes'
//! series (`workqueue_depth`, `workqueue_adds_total`, ...) into a `prometheus-client`
//! registry, so existing dashboards work unchanged.
//!
//! # Examples
//!
//! A provider of your own, counting adds:
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use workq::WorkQueue;
//! use workq::metrics::{MetricsProvider, QueueMetrics, QueueProbe};
//!
//! #[derive(Default)]
//! struct Adds(Arc<AtomicU64>);
//!
//! struct Recorder(Arc<AtomicU64>);
//!
//! impl QueueMetrics for Recorder {
//!     fn add(&self) {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!     }
//! }
//!
//! impl MetricsProvider for Adds {
//!     fn new_queue(&self, _name: &str, _probe: QueueProbe) -> Box<dyn QueueMetrics> {
//!         Box::new(Recorder(self.0.clone()))
//!     }
//! }
//!
//! let adds = Arc::new(AtomicU64::new(0));
//! let queue = WorkQueue::builder().name("pods").metrics(Adds(adds.clone())).build();
//! queue.add("default/web-0");
//! queue.add("default/web-0");
//! assert_eq!(adds.load(Ordering::Relaxed), 1); // the second add was deduplicated
//! ```

#[cfg(feature = "prometheus")]
pub mod prometheus;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::flow::FlowLimits;
use crate::stats::{FlowStats, GroupStats, QueueStats};

/// Creates the recorder of each named queue. This is client-go's `MetricsProvider`.
pub trait MetricsProvider: Send + Sync + 'static {
    /// Returns the recorder for the queue named `name`. `probe` reads the queue's gauges
    /// (delayed items, unfinished work, longest running processor) when they are needed,
    /// typically at scrape time; it holds the queue weakly.
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics>;
}

impl<P: MetricsProvider + ?Sized> MetricsProvider for Arc<P> {
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        (**self).new_queue(name, probe)
    }
}

/// Receives one queue's events. Every method defaults to doing nothing.
///
/// The queue calls these while it holds its lock, so they must be quick and must not call
/// back into the queue (use the [`QueueProbe`] from another thread, at scrape time).
pub trait QueueMetrics: Send + Sync + 'static {
    /// An item became dirty: client-go's `adds` + 1 and `depth` + 1.
    fn add(&self) {}

    /// An item was handed out after waiting `queued_for` since it became dirty: `depth` - 1,
    /// and an observation of `queue_duration_seconds`.
    fn get(&self, queued_for: Duration) {
        let _ = queued_for;
    }

    /// A lease was dropped after `worked_for`: an observation of `work_duration_seconds`.
    fn done(&self, worked_for: Duration) {
        let _ = worked_for;
    }

    /// A delayed or rate-limited add while the queue runs: `retries` + 1.
    fn retry(&self) {}

    /// The rate limiter delayed an item by `delay` (beyond client-go, kubernetes#138256).
    fn rate_limited(&self, delay: Duration) {
        let _ = delay;
    }
}

/// Reads a queue's depth by priority: `None` once the queue is gone.
type ReadDepths = Arc<dyn Fn() -> Option<Vec<(i32, usize)>> + Send + Sync>;

/// Reads a queue's flow control figures and its top groups: `None` once the queue is gone
/// or if it has no flow control.
type ReadFlow = Arc<dyn Fn(usize) -> Option<(FlowStats, Vec<GroupStats>)> + Send + Sync>;

/// Reads a queue's [`QueueStats`] on demand, without keeping the queue alive.
#[derive(Clone)]
pub struct QueueProbe {
    /// Returns the stats, or `None` once the queue is gone.
    read: Arc<dyn Fn() -> Option<QueueStats> + Send + Sync>,
    /// Returns the depth by priority, if the queue can tell.
    depths: Option<ReadDepths>,
    /// Returns the flow control figures, if the queue has flow control.
    flow: Option<ReadFlow>,
    /// The queue's flow control limits, if it has flow control.
    limits: Option<Arc<FlowLimits>>,
}

impl QueueProbe {
    /// Wraps a function that reads the stats; public so that providers can be tested
    /// without a queue.
    pub fn new(read: impl Fn() -> Option<QueueStats> + Send + Sync + 'static) -> Self {
        Self {
            read: Arc::new(read),
            depths: None,
            flow: None,
            limits: None,
        }
    }

    /// Adds the queue's flow control limits, for views that show them
    /// ([`admin::Stats::limits`](crate::admin::Stats::limits)).
    #[must_use]
    pub fn with_flow_limits(mut self, limits: FlowLimits) -> Self {
        self.limits = Some(Arc::new(limits));
        self
    }

    /// The queue's flow control limits, if it has flow control.
    pub fn flow_limits(&self) -> Option<&FlowLimits> {
        self.limits.as_deref()
    }

    /// Adds a function that reads the queue's flow control figures
    /// ([`WorkQueue::flow_stats`](crate::WorkQueue::flow_stats)) and its `top` groups
    /// ([`WorkQueue::top_groups`](crate::WorkQueue::top_groups)), for providers that report
    /// them; it returns `None` for a queue without flow control.
    #[must_use]
    pub fn with_flow(
        mut self,
        read: impl Fn(usize) -> Option<(FlowStats, Vec<GroupStats>)> + Send + Sync + 'static,
    ) -> Self {
        self.flow = Some(Arc::new(read));
        self
    }

    /// The queue's flow control figures and its `top` groups by ready items now; `None` if
    /// the queue is gone or has no flow control. A walk over the groups under the queue's
    /// lock: call it at scrape time only.
    pub fn flow(&self, top: usize) -> Option<(FlowStats, Vec<GroupStats>)> {
        self.flow.as_ref().and_then(|read| read(top))
    }

    /// Adds a function that reads the queue's depth by priority
    /// ([`WorkQueue::depth_by_priority`](crate::WorkQueue::depth_by_priority)), for
    /// providers that report it.
    #[must_use]
    pub fn with_depth_by_priority(
        mut self,
        read: impl Fn() -> Option<Vec<(i32, usize)>> + Send + Sync + 'static,
    ) -> Self {
        self.depths = Some(Arc::new(read));
        self
    }

    /// The queue's depth by priority now, highest first; `None` if the queue has been
    /// dropped or cannot tell. It walks the queue's items under its lock: call it at scrape
    /// time only.
    pub fn depth_by_priority(&self) -> Option<Vec<(i32, usize)>> {
        self.depths.as_ref().and_then(|read| read())
    }

    /// The queue's stats now, or `None` if the queue has been dropped.
    ///
    /// It reads without changing the queue: items that are due but not yet moved to the
    /// ready queue count as delayed, and no [`QueueMetrics`] method is called, so a
    /// provider may call it while holding its own locks.
    pub fn stats(&self) -> Option<QueueStats> {
        (self.read)()
    }
}

impl fmt::Debug for QueueProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueProbe").finish_non_exhaustive()
    }
}
