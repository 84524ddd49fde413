//! [`AsyncWorkers`]: workers as tokio tasks, with an async handler.

use std::fmt;
use std::future::{Future, poll_fn};
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::core::{Core, Handled, panic_message};
use super::{IntoOutcome, StopToken, Summary};
use crate::{Queue, QueueLease, WorkQueue};

/// A running pool of worker tasks, from [`Workers::spawn_async`](super::Workers::spawn_async).
///
/// Dropping it leaves the tasks running (as dropping a tokio `JoinHandle` does); they end
/// when the pool's [`StopToken`] is stopped, or when the queue is shut down and empty.
///
/// `Q` is the queue's backend: [`WorkQueue`] unless the pool was built over another
/// [`Queue`].
#[must_use = "dropped, the pool runs on with no handle to stop it or read its summary"]
pub struct AsyncWorkers<T, Q = WorkQueue<T>> {
    core: Arc<Core<T, Q>>,
    tasks: Vec<JoinHandle<()>>,
}

impl<T, Q> fmt::Debug for AsyncWorkers<T, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncWorkers")
            .field("tasks", &self.tasks.len())
            .field("stop", &self.core.stop)
            .finish_non_exhaustive()
    }
}

/// Marks a worker as exited when its task ends, is aborted, or unwinds.
struct ExitGuard<T, Q>(Arc<Core<T, Q>>)
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>;

impl<T, Q> Drop for ExitGuard<T, Q>
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
{
    fn drop(&mut self) {
        self.0.worker_exited();
    }
}

impl<T, Q> AsyncWorkers<T, Q>
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
{
    pub(super) fn spawn<F, Fut>(
        core: Arc<Core<T, Q>>,
        timeout: Option<Duration>,
        handler: F,
    ) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: IntoOutcome,
    {
        let handler = Arc::new(handler);
        let limit = core.queue.batch_limit();
        if limit > 1 {
            let stepper = super::step::Stepper::start(
                core.queue.clone(),
                core.stop.clone(),
                limit,
                super::step::steps_for_pool(core.count(), limit, core.queue.steps_in_flight()),
                core.unfinished.clone(),
            );
            let _ = core.stepper.set(Box::new(stepper));
        }
        let tasks = (0..core.count())
            .map(|slot| tokio::spawn(worker(core.clone(), slot, handler.clone(), timeout)))
            .collect();
        Self { core, tasks }
    }

    super::pool_accessors!(Q);

    /// Waits until the workers have exited and returns what they did.
    ///
    /// Workers exit when the pool is stopped (they finish the item in hand first), or when
    /// the queue is shut down and has nothing left to hand out. Once the pool is stopped, at
    /// most the [`shutdown_timeout`](super::Workers::shutdown_timeout) is waited; tasks still
    /// busy then are aborted and their items listed in [`Summary::in_flight`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes leaves the workers running.
    pub async fn wait(self) -> Summary<T> {
        self.finish(std::future::pending::<()>()).await
    }

    /// Stops the pool, then [`wait`](Self::wait)s for it.
    pub async fn shut_down(self) -> Summary<T> {
        self.stop();
        self.wait().await
    }

    /// Runs until `signal` completes (or the pool is stopped some other way), then stops the
    /// pool and [`wait`](Self::wait)s for it. `signal` is any future: `tokio::signal::ctrl_c()`,
    /// a `oneshot` receiver, a [`StopToken::stopped`], a timer.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workq::{WorkQueue, Workers};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// queue.add(1_u32);
    /// let workers = Workers::new(queue).spawn_async(|n: u32| async move { n.to_string(); });
    /// // In a program: workers.run_until(tokio::signal::ctrl_c()).await
    /// let summary = workers.run_until(tokio::time::sleep(Duration::from_millis(10))).await;
    /// assert_eq!(summary.processed, 1);
    /// # }
    /// ```
    pub async fn run_until<S: Future>(self, signal: S) -> Summary<T> {
        self.finish(signal).await
    }

    async fn finish<S: Future>(mut self, signal: S) -> Summary<T> {
        let core = self.core.clone();
        let drained = {
            let mut join = pin!(join_all(&mut self.tasks));
            let mut signal = pin!(signal);
            let mut stopped = core.stop.stopped();
            let exited = tokio::select! {
                biased;
                () = &mut join => true,
                _ = &mut signal => {
                    core.stop.stop();
                    false
                }
                () = &mut stopped => false,
            };
            if exited {
                true
            } else {
                match core.shutdown_timeout {
                    None => {
                        join.await;
                        true
                    }
                    Some(limit) => tokio::time::timeout(limit, join).await.is_ok(),
                }
            }
        };
        let summary = core.final_summary().await;
        if !drained {
            for task in &self.tasks {
                task.abort();
            }
        }
        summary
    }
}

/// Waits for every task, in turn.
async fn join_all(tasks: &mut [JoinHandle<()>]) {
    for task in tasks {
        if let Err(error) = task.await
            && error.is_panic()
        {
            tracing::error!("a worker task panicked outside its handler");
        }
    }
}

/// One worker task's loop.
async fn worker<T, Q, F, Fut>(
    core: Arc<Core<T, Q>>,
    slot: usize,
    handler: Arc<F>,
    timeout: Option<Duration>,
) where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    let _exit = ExitGuard(core.clone());
    let mut stopped = core.stop.stopped();
    let mut backoff = BACKOFF_MIN;
    // A lease the backend handed out with the last done.
    let mut next: Option<Q::Lease> = None;
    loop {
        if let Some(lease) = next.take() {
            if core.stop.is_stopped() {
                // Once stopped, no new item is processed: hand it back.
                core.leave_unprocessed(lease).await;
                break;
            }
            next = process(&core, slot, &*handler, timeout, lease).await;
            continue;
        }
        let lease = match core.stepper() {
            // The pool's step task waits for all its idle workers, and answers at once when
            // the pool stops; a lease it took before the stop is handed back.
            Some(stepper) => match stepper.next().await {
                Ok(Some(lease)) if core.stop.is_stopped() => {
                    core.leave_unprocessed(lease).await;
                    break;
                }
                other => other,
            },
            // Biased: once stopped, no new item is taken. `get` is cancel safe, so dropping
            // it here loses nothing.
            None => tokio::select! {
                biased;
                () = &mut stopped => break,
                lease = core.queue.get() => lease.map_err(|e| e.to_string()),
            },
        };
        let lease = match lease {
            Ok(Some(lease)) => lease,
            Ok(None) => break,
            Err(error) => {
                // The backend is down past its own retries: keep trying, slower, until it
                // answers or the pool stops.
                tracing::warn!(
                    queue = core.queue.name(),
                    %error,
                    retry_in = ?backoff,
                    "cannot get an item; retrying"
                );
                tokio::select! {
                    biased;
                    () = &mut stopped => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        next = process(&core, slot, &*handler, timeout, lease).await;
    }
}

/// Processes one item in worker `slot`; returns the next lease if the backend handed one out
/// with the done.
async fn process<T, Q, F, Fut>(
    core: &Core<T, Q>,
    slot: usize,
    handler: &F,
    timeout: Option<Duration>,
    lease: Q::Lease,
) -> Option<Q::Lease>
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    let span = core.span(lease.item(), lease.priority()).await;
    #[cfg(feature = "otel")]
    crate::otel::link_span(&span, lease.links(), lease.links_dropped());
    core.begin(slot, &lease);
    let handled = run(handler, lease.item().clone(), timeout)
        .instrument(span.clone())
        .await;
    core.finish(slot, lease, handled).instrument(span).await
}

/// The first wait after a backend's `get` failed; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest wait between two attempts to `get` from a failing backend.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Calls the handler and awaits its future, catching panics and enforcing the timeout.
async fn run<T, F, Fut>(handler: &F, item: T, timeout: Option<Duration>) -> Handled
where
    F: Fn(T) -> Fut,
    Fut: Future,
    Fut::Output: IntoOutcome,
{
    let future = match panic::catch_unwind(AssertUnwindSafe(|| handler(item))) {
        Ok(future) => future,
        Err(payload) => return Handled::Panicked(panic_message(payload.as_ref())),
    };
    let mut future = pin!(future);
    // A panic inside `poll` unwinds through here: catch it, and drop the future.
    let guarded = poll_fn(|cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| {
            future.as_mut().poll(cx).map(IntoOutcome::into_outcome)
        })) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(Ok(outcome))) => Poll::Ready(Handled::Outcome(outcome)),
            Ok(Poll::Ready(Err(error))) => Poll::Ready(Handled::Failed(error)),
            Err(payload) => Poll::Ready(Handled::Panicked(panic_message(payload.as_ref()))),
        }
    });
    match timeout {
        Some(limit) => tokio::time::timeout(limit, guarded)
            .await
            .unwrap_or(Handled::TimedOut(limit)),
        None => guarded.await,
    }
}
