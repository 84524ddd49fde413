//! What the workload drivers need of a peer: [`Peer`], written once per queue crate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

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
    /// Says why the workers ended, if they can end before they are stopped (a worker whose
    /// fetch failed), so that a run stops waiting for them at once.
    ended: Option<oneshot::Receiver<String>>,
}

impl Running {
    pub(crate) fn new(stop: impl FnOnce() -> BoxFuture<Result<()>> + Send + 'static) -> Self {
        Self {
            stop: Box::new(stop),
            ended: None,
        }
    }

    /// The same workers, whose end before [`Running::stop`] `ended` reports with its cause.
    pub(crate) fn ending(self, ended: oneshot::Receiver<String>) -> Self {
        Self {
            ended: Some(ended),
            ..self
        }
    }

    /// Resolves, with the cause, once the workers have ended on their own; never while they
    /// run, nor when their end cannot be observed.
    pub(crate) async fn ended(&mut self) -> String {
        if let Some(ended) = self.ended.as_mut()
            && let Ok(cause) = ended.await
        {
            return cause;
        }
        std::future::pending().await
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

    /// The same, in one of the `processes` worker processes of a W7 phase (each with its own
    /// connections, beside the producer's); [`Peer::open`]'s unless the peer sizes its pool
    /// by them.
    fn open_shared(
        url: &str,
        name: &str,
        processes: u32,
    ) -> impl Future<Output = Result<Self>> + Send {
        let _ = processes;
        Self::open(url, name)
    }

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

    /// Why the peer cannot burn down a backlog of `items` jobs, all due, added before its
    /// workers start (W7B), if it cannot.
    fn backlog_not_applicable(items: usize) -> Option<String> {
        let _ = items;
        None
    }

    /// How it is set up, for the report: its throughput settings.
    fn settings() -> String;
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn idle() -> Running {
        Running::new(|| Box::pin(async { Ok(()) }))
    }

    #[test]
    fn workers_that_end_on_their_own_say_why_and_others_never_end() {
        let (end, ending) = oneshot::channel();
        let mut failed = idle().ending(ending);
        end.send("the fetch failed".to_owned()).unwrap();
        assert_eq!(
            failed.ended().now_or_never().as_deref(),
            Some("the fetch failed")
        );
        // Stopped the usual way: the sender is dropped without a word.
        let (end, ending) = oneshot::channel::<String>();
        let mut stopped = idle().ending(ending);
        drop(end);
        assert_eq!(stopped.ended().now_or_never(), None);
        assert_eq!(idle().ended().now_or_never(), None);
    }
}
