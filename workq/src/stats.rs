//! [`QueueStats`]: a snapshot of a queue's sizes, what the queue and its metrics probe read.

use std::time::Duration;

/// A snapshot of a queue's sizes and in-flight work, as [`QueueProbe::stats`](crate::metrics::QueueProbe::stats) and
/// [`WorkQueue::stats`](crate::WorkQueue::stats) return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueStats {
    /// Items waiting to be handed out ([`WorkQueue::len`](crate::WorkQueue::len)).
    pub len: usize,
    /// Items waiting for a delay to pass.
    pub delayed: usize,
    /// Leases out.
    pub processing: usize,
    /// The sum of how long each lease out has been held (client-go's
    /// `unfinished_work_seconds`). Measured only on queues that report metrics; zero
    /// otherwise.
    pub unfinished_work: Duration,
    /// How long the oldest lease out has been held (client-go's
    /// `longest_running_processor_seconds`). Measured only on queues that report metrics;
    /// zero otherwise.
    pub longest_running: Duration,
}

/// Flow control at a glance ([`WorkQueue::flow_stats`](crate::WorkQueue::flow_stats)): what
/// the `workqueue_groups_ready` and `workqueue_group_saturated` gauges report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FlowStats {
    /// Groups with items waiting to be handed out.
    pub groups_ready: usize,
    /// Groups at their in-flight limit.
    pub groups_saturated: usize,
    /// Groups the queue keeps (with items in any state, or a hand-out bucket still
    /// refilling).
    pub groups: usize,
}

/// One group's figures ([`WorkQueue::top_groups`](crate::WorkQueue::top_groups)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// The group's name, as the queue's group function gave it (`""` on an ungrouped queue).
    pub name: String,
    /// Its items waiting to be handed out.
    pub ready: usize,
    /// Its leases out.
    pub in_flight: usize,
    /// Its in-flight limit, if it has one.
    pub limit: Option<usize>,
}
