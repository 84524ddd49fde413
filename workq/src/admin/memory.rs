//! [`MemoryAdmin`]: the queues of this process, through their metrics probes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::{
    Admin, AdminError, BoxFuture, Capabilities, Counters, QueueSummary, ServerStatus, Stats,
};
use crate::metrics::{MetricsProvider, QueueMetrics, QueueProbe};
use crate::periodic::ScheduleInfo;

/// The in-process [`WorkQueue`](crate::WorkQueue)s of this process, read-only: their figures
/// come from their [`QueueProbe`]s, and adds, completions and retries are counted when the
/// `MemoryAdmin` is the queue's [metrics provider](crate::Builder::metrics).
///
/// It answers the figures ([`queues`](Admin::queues), [`summary`](Admin::summary),
/// [`stats`](Admin::stats), listing no lease) and nothing more
/// ([`Capabilities::figures_only`]): every other call is [`AdminError::Unsupported`]. A
/// queue is known by its name from its first registration until it is dropped; a second
/// queue registered under a name takes the place of the first.
///
/// Clones share one list of queues.
///
/// # Examples
///
/// ```
/// use workq::WorkQueue;
/// use workq::admin::{Admin, MemoryAdmin};
///
/// # futures::executor::block_on(async {
/// let admin = MemoryAdmin::new();
/// let queue: WorkQueue<u32> = WorkQueue::builder().name("pods").metrics(admin.clone()).build();
/// queue.add(1);
/// queue.add(1);
/// let pods = admin.summary("pods").await.unwrap();
/// assert_eq!(pods.depth, 1);
/// assert_eq!(pods.counters.unwrap().adds, 1, "the duplicate add is not counted");
/// drop(queue);
/// assert!(admin.queues().await.unwrap().is_empty());
/// # });
/// ```
#[derive(Clone, Default)]
pub struct MemoryAdmin {
    queues: Arc<Mutex<Queues>>,
}

/// The queues by name, and the number the next registration gets.
#[derive(Default)]
struct Queues {
    by_name: BTreeMap<String, Entry>,
    next_id: u64,
}

/// One queue: how to read it, and its counts when it reports to us.
#[derive(Clone)]
struct Entry {
    /// Tells this registration from a later one under the same name.
    id: u64,
    probe: QueueProbe,
    /// Present when the queue reports its events to this admin.
    counts: Option<Arc<Counts>>,
}

/// The running totals of a queue that reports to us.
#[derive(Default)]
struct Counts {
    adds: AtomicU64,
    completions: AtomicU64,
    retries: AtomicU64,
}

impl fmt::Debug for MemoryAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAdmin")
            .field(
                "queues",
                &self.queues.lock().by_name.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl MemoryAdmin {
    /// No queues yet: build queues with it as their [metrics
    /// provider](crate::Builder::metrics), or add them with [`with_queue`](Self::with_queue).
    pub fn new() -> Self {
        Self::default()
    }

    /// Shows the queue read by `probe` as `name` (without counters; a queue built with this
    /// admin as its metrics provider is added by itself, with them).
    #[must_use]
    pub fn with_queue(self, name: impl Into<String>, probe: QueueProbe) -> Self {
        self.register(name.into(), probe, None);
        self
    }

    /// Shows `probe` as `name`, in place of any queue of that name.
    fn register(&self, name: String, probe: QueueProbe, counts: Option<Arc<Counts>>) {
        let mut queues = self.queues.lock();
        let id = queues.next_id;
        queues.next_id += 1;
        queues.by_name.insert(name, Entry { id, probe, counts });
    }

    /// Every live queue's figures, by name; forgets the queues that are gone.
    ///
    /// The probes are read without this admin's lock (a probe takes its queue's lock, and
    /// may be any code): the entries are copied out first.
    fn summaries(&self) -> Vec<QueueSummary> {
        let entries: Vec<(String, Entry)> = self
            .queues
            .lock()
            .by_name
            .iter()
            .map(|(name, entry)| (name.clone(), entry.clone()))
            .collect();
        let mut summaries = Vec::with_capacity(entries.len());
        let mut gone = Vec::new();
        for (name, entry) in entries {
            match summary_of(&name, &entry) {
                Some(summary) => summaries.push(summary),
                None => gone.push((name, entry.id)),
            }
        }
        if !gone.is_empty() {
            // A dropped queue's probe reads `None`: forget it, unless a queue registered
            // under its name since.
            let mut queues = self.queues.lock();
            for (name, id) in gone {
                if queues
                    .by_name
                    .get(&name)
                    .is_some_and(|entry| entry.id == id)
                {
                    queues.by_name.remove(&name);
                }
            }
        }
        summaries
    }

    /// One queue's figures, if it is live.
    fn find(&self, name: &str) -> Result<QueueSummary, AdminError> {
        let entry = self.queues.lock().by_name.get(name).cloned();
        entry
            .and_then(|entry| summary_of(name, &entry))
            .ok_or(AdminError::NotFound)
    }
}

/// A count as the contract has it.
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The figures of `entry`, or `None` if its queue is gone.
fn summary_of(name: &str, entry: &Entry) -> Option<QueueSummary> {
    let stats = entry.probe.stats()?;
    let mut summary = QueueSummary::named(name);
    summary.depth = count(stats.len);
    summary.delayed = count(stats.delayed);
    summary.in_flight = count(stats.processing);
    summary.longest_lease = stats.longest_running;
    summary.lease_age_sum = stats.unfinished_work;
    summary.counters = entry.counts.as_deref().map(|c| {
        Counters::new(
            c.adds.load(Ordering::Relaxed),
            c.completions.load(Ordering::Relaxed),
            c.retries.load(Ordering::Relaxed),
        )
    });
    Some(summary)
}

/// Counts one queue's events for its [`Counters`].
struct Recorder(Arc<Counts>);

impl QueueMetrics for Recorder {
    fn add(&self) {
        self.0.adds.fetch_add(1, Ordering::Relaxed);
    }

    fn done(&self, _worked_for: Duration) {
        self.0.completions.fetch_add(1, Ordering::Relaxed);
    }

    fn retry(&self) {
        self.0.retries.fetch_add(1, Ordering::Relaxed);
    }
}

impl MetricsProvider for MemoryAdmin {
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        let counts = Arc::new(Counts::default());
        self.register(name.to_owned(), probe, Some(counts.clone()));
        Box::new(Recorder(counts))
    }
}

impl Admin for MemoryAdmin {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::figures_only()
    }

    fn status(&self) -> ServerStatus {
        ServerStatus::new(true, "this process")
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        Box::pin(async move { Ok(self.summaries()) })
    }

    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        Box::pin(async move { self.find(queue) })
    }

    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        Box::pin(async move {
            let entry = self.queues.lock().by_name.get(queue).cloned();
            let entry = entry.ok_or(AdminError::NotFound)?;
            let summary = summary_of(queue, &entry).ok_or(AdminError::NotFound)?;
            let mut stats = Stats::new(summary);
            if let Some((flow, groups)) = entry.probe.flow(limit) {
                stats.flow = Some(flow);
                stats.groups = groups;
            }
            stats.limits = entry.probe.flow_limits().cloned();
            Ok(stats)
        })
    }

    fn schedules<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ScheduleInfo>, AdminError>> {
        Box::pin(async move {
            self.find(queue)?;
            Ok(crate::periodic::local::list(queue))
        })
    }
}
