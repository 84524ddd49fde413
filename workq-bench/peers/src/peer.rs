//! What the workload drivers need of a peer: [`Peer`], written once per queue crate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Every error of a peer, as text for the report.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T> = std::result::Result<T, Error>;

/// A future the drivers can move between tasks.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the workers call for every job they run, with the job's id: the driver's handler
/// (it counts, measures lateness, or sleeps and records, depending on the workload).
pub(crate) type Handler = Arc<dyn Fn(u64) -> BoxFuture<()> + Send + Sync>;

/// One job to add.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    /// Its id, carried in its payload; the key of the dedup workload.
    pub(crate) id: u64,
    /// Run no earlier than this long after the add (zero: at once).
    pub(crate) delay: Duration,
    /// Added through the peer's unique-job feature, keyed by `id`.
    pub(crate) unique: bool,
}

impl Job {
    pub(crate) fn now(id: u64) -> Self {
        Self {
            id,
            delay: Duration::ZERO,
            unique: false,
        }
    }
}

/// Workers started by [`Peer::work`]; [`Running::stop`] stops them, letting the jobs in hand
/// finish.
pub(crate) struct Running {
    stop: Box<dyn FnOnce() -> BoxFuture<Result<()>> + Send>,
}

impl Running {
    pub(crate) fn new(stop: impl FnOnce() -> BoxFuture<Result<()>> + Send + 'static) -> Self {
        Self {
            stop: Box::new(stop),
        }
    }

    pub(crate) async fn stop(self) -> Result<()> {
        (self.stop)().await
    }
}

/// A queue crate measured beside ours.
pub(crate) trait Peer: Clone + Send + Sync + Sized + 'static {
    /// Its `impl` in the report: the crate's name.
    const NAME: &'static str;
    /// The variable the server's URL is read from.
    const URL_VAR: &'static str;

    /// A handle on queue `name` at `url`, for adding jobs and counting what is left; creates
    /// the peer's tables or keys where it needs them.
    fn open(url: &str, name: &str) -> impl Future<Output = Result<Self>> + Send;

    /// Adds `jobs` with the peer's batch insert (one call).
    fn add(&self, jobs: &[Job]) -> impl Future<Output = Result<()>> + Send;

    /// Starts workers running `concurrency` jobs at a time on this queue, in this process,
    /// each job through `handler`; returns once they run.
    fn work(
        &self,
        concurrency: usize,
        handler: Handler,
    ) -> impl Future<Output = Result<Running>> + Send;

    /// Jobs not finished yet: waiting, delayed or running.
    fn pending(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes the queue and every job of it.
    fn delete(&self) -> impl Future<Output = Result<()>> + Send;

    /// Why the peer cannot run `workload`, if it cannot.
    fn not_applicable(workload: &str) -> Option<&'static str> {
        let _ = workload;
        None
    }

    /// How it is set up, for the report: its throughput settings.
    fn settings() -> String;
}
