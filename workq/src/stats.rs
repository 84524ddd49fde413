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
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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

/// One group's figures ([`WorkQueue::top_groups`](crate::WorkQueue::top_groups), and
/// [`admin::Stats::groups`](crate::admin::Stats::groups) on every backend).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// How long its oldest ready item has waited since it became ready; `None` when it has
    /// none ready or the backend does not track it (the in-memory queue does not).
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "oldest_ready_s",
            with = "crate::admin::serde_helpers::opt_secs",
            default
        )
    )]
    pub oldest_ready: Option<Duration>,
}

impl GroupStats {
    /// Group `name` with `ready` items ready, `in_flight` leases out and in-flight limit
    /// `limit`, the age of its oldest ready item untold.
    pub fn new(
        name: impl Into<String>,
        ready: usize,
        in_flight: usize,
        limit: Option<usize>,
    ) -> Self {
        GroupStats {
            name: name.into(),
            ready,
            in_flight,
            limit,
            oldest_ready: None,
        }
    }
}

impl FlowStats {
    /// `groups` groups kept, `groups_ready` of them with ready items, `groups_saturated` at
    /// their in-flight limit.
    pub fn new(groups: usize, groups_ready: usize, groups_saturated: usize) -> Self {
        FlowStats {
            groups_ready,
            groups_saturated,
            groups,
        }
    }
}
