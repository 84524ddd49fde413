//! [`ThreadWorkers`]: workers on plain threads, with a blocking handler.

use std::fmt;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::core::{Core, Handled, panic_message, ready_now};
use super::{IntoOutcome, StopToken, Summary};
use crate::WorkQueue;

/// A running pool of worker threads, from [`Workers::spawn_threads`](super::Workers::spawn_threads).
///
/// Dropping it leaves the threads running; they end when the pool's [`StopToken`] is
/// stopped, or when the queue is shut down and empty.
#[must_use = "dropped, the pool runs on with no handle to stop it or read its summary"]
pub struct ThreadWorkers<T> {
    core: Arc<Core<T, WorkQueue<T>>>,
    threads: Vec<JoinHandle<()>>,
}

impl<T> fmt::Debug for ThreadWorkers<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadWorkers")
            .field("threads", &self.threads.len())
            .field("stop", &self.core.stop)
            .finish_non_exhaustive()
    }
}

/// Marks a worker as exited when its thread ends, even by unwinding.
struct ExitGuard<'a, T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static>(
    &'a Core<T, WorkQueue<T>>,
);

impl<T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> Drop for ExitGuard<'_, T> {
    fn drop(&mut self) {
        self.0.worker_exited();
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> ThreadWorkers<T> {
    pub(super) fn spawn<F, R>(core: Arc<Core<T, WorkQueue<T>>>, handler: F) -> Self
    where
        F: Fn(&T) -> R + Send + Sync + 'static,
        R: IntoOutcome,
    {
        let handler = Arc::new(handler);
        let prefix = match core.queue.name() {
            Some(name) => format!("workq-worker-{name}"),
            None => "workq-worker".to_owned(),
        };
        let count = core.count();
        let threads = (0..count)
            .map(|slot| {
                let core = core.clone();
                let handler = handler.clone();
                std::thread::Builder::new()
                    .name(format!("{prefix}-{slot}"))
                    .spawn(move || worker(&core, slot, &*handler))
                    .unwrap_or_else(|err| panic!("workers: cannot start a thread: {err}"))
            })
            .collect();
        Self { core, threads }
    }

    super::pool_accessors!(WorkQueue<T>);

    /// Waits until the workers have exited and returns what they did.
    ///
    /// Workers exit when the pool is stopped (they finish the item in hand first), or when
    /// the queue is shut down and has nothing left to hand out. Once the pool is stopped, at
    /// most the [`shutdown_timeout`](super::Workers::shutdown_timeout) is waited; threads
    /// still busy then are left running and their items are listed in
    /// [`Summary::in_flight`].
    ///
    /// # Blocking
    ///
    /// Blocks the calling thread.
    pub fn wait(self) -> Summary<T> {
        let drained = self.core.blocking_wait();
        if drained {
            for thread in self.threads {
                let _ = thread.join();
            }
        }
        self.core.summary()
    }

    /// Stops the pool, then [`wait`](Self::wait)s for it.
    ///
    /// # Blocking
    ///
    /// Blocks the calling thread until the items in flight are finished, or the shutdown
    /// timeout passes.
    pub fn shut_down(self) -> Summary<T> {
        self.stop();
        self.wait()
    }
}

/// One worker thread's loop.
fn worker<T, F, R>(core: &Core<T, WorkQueue<T>>, slot: usize, handler: &F)
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    F: Fn(&T) -> R,
    R: IntoOutcome,
{
    let _exit = ExitGuard(core);
    // A lease the queue handed out with the last done.
    let mut next = None;
    while !core.stop.is_stopped() {
        let Some(lease) = next.take().or_else(|| core.queue.blocking_get()) else {
            break;
        };
        if core.stop.is_stopped() {
            // Handed out as the stop shut the queue down: intake has stopped, so leave it,
            // and list it in `unfinished`.
            in_memory(core.leave_unprocessed(lease));
            break;
        }
        let span = in_memory(core.span(lease.item(), lease.priority()));
        #[cfg(feature = "otel")]
        crate::otel::link_span(&span, lease.links(), lease.links_dropped());
        let _entered = span.enter();
        core.begin(slot, &lease);
        let handled =
            match panic::catch_unwind(AssertUnwindSafe(|| handler(lease.item()).into_outcome())) {
                Ok(Ok(outcome)) => Handled::Outcome(outcome),
                Ok(Err(error)) => Handled::Failed(error),
                Err(payload) => Handled::Panicked(panic_message(payload.as_ref())),
            };
        next = in_memory(core.finish(slot, lease, handled));
    }
    if let Some(lease) = next {
        in_memory(core.leave_unprocessed(lease));
    }
}

/// Runs the shared worker code on the in-memory queue, whose calls complete at once (a
/// thread never waits on a future).
fn in_memory<F: std::future::Future>(future: F) -> F::Output {
    ready_now(future).expect("the in-memory queue's calls complete at once")
}
