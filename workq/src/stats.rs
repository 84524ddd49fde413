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
