//! In-process queues: [`MemorySource`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use workq::metrics::QueueProbe;
use workq::metrics::{MetricsProvider, QueueMetrics};

use crate::source::Outcome;
use crate::{
    Action, ItemDetail, ItemPage, PageRequest, QueueView, Source, SourceError, SourceStatus,
};

#[derive(Default)]
struct Counters {
    adds: AtomicU64,
    completions: AtomicU64,
    retries: AtomicU64,
}

struct Entry {
    probe: QueueProbe,
    /// Present when the queue reports its events to this source.
    counters: Option<Arc<Counters>>,
}

/// In-process [`workq::WorkQueue`]s, read-only: their sizes come from their
/// [`QueueProbe`]s, and adds, completions and retries are counted when the source is the
/// queue's [metrics provider](workq::Builder::metrics).
///
/// ```
/// use workq_dashboard::MemorySource;
///
/// let source = MemorySource::new();
/// let queue: workq::WorkQueue<u32> =
///     workq::WorkQueue::builder().name("pods").metrics(source.clone()).build();
/// queue.add(1);
/// ```
#[derive(Clone, Default)]
pub struct MemorySource {
    queues: Arc<Mutex<BTreeMap<String, Entry>>>,
}

impl std::fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySource")
            .field("queues", &self.queues.lock().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MemorySource {
    /// No queues yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shows the queue read by `probe` as `name` (without counters; a queue built with this
    /// source as its metrics provider is added by itself, with them).
    pub fn with_queue(self, name: impl Into<String>, probe: QueueProbe) -> Self {
        self.queues.lock().insert(
            name.into(),
            Entry {
                probe,
                counters: None,
            },
        );
        self
    }

    fn view(name: &str, entry: &Entry) -> Option<QueueView> {
        let stats = entry.probe.stats()?;
        let c = entry.counters.as_deref();
        Some(QueueView {
            depth: stats.len,
            delayed: stats.delayed,
            in_flight: stats.processing,
            longest_running_s: stats.longest_running.as_secs_f64(),
            unfinished_work_s: stats.unfinished_work.as_secs_f64(),
            adds_total: c.map(|c| c.adds.load(Ordering::Relaxed)),
            completions_total: c.map(|c| c.completions.load(Ordering::Relaxed)),
            retries_total: c.map(|c| c.retries.load(Ordering::Relaxed)),
            ..QueueView::named(name)
        })
    }

    fn views(&self) -> Vec<QueueView> {
        let mut queues = self.queues.lock();
        // A dropped queue's probe reads `None`: forget it.
        queues.retain(|_, e| e.probe.stats().is_some());
        queues
            .iter()
            .filter_map(|(name, e)| Self::view(name, e))
            .collect()
    }
}

struct Recorder(Arc<Counters>);

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

impl MetricsProvider for MemorySource {
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        let counters = Arc::new(Counters::default());
        self.queues.lock().insert(
            name.to_owned(),
            Entry {
                probe,
                counters: Some(counters.clone()),
            },
        );
        Box::new(Recorder(counters))
    }
}

impl Source for MemorySource {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn has_actions(&self) -> bool {
        false
    }

    fn has_items(&self) -> bool {
        false
    }

    async fn status(&self) -> SourceStatus {
        SourceStatus {
            up: true,
            error: None,
            server: "this process".to_owned(),
            warnings: Vec::new(),
        }
    }

    async fn queues(&self) -> Result<Vec<QueueView>, SourceError> {
        Ok(self.views())
    }

    async fn queue(&self, name: &str) -> Result<QueueView, SourceError> {
        self.views()
            .into_iter()
            .find(|v| v.name == name)
            .ok_or(SourceError::NotFound)
    }

    async fn items(&self, _name: &str, _request: &PageRequest) -> Result<ItemPage, SourceError> {
        Err(SourceError::Unsupported)
    }

    async fn item(&self, _name: &str, _item: &str) -> Result<ItemDetail, SourceError> {
        Err(SourceError::Unsupported)
    }

    async fn act(&self, _name: &str, _action: &Action) -> Result<Outcome, SourceError> {
        Err(SourceError::Unsupported)
    }
}
