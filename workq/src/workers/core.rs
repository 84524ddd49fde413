//! What both flavours of workers share: the counters, the in-flight slots, the stop hook and
//! the rules that turn a handler's outcome into queue calls, for any [`Queue`] backend.
//!
//! Every queue call goes through the [`Queue`] trait. The in-memory queue's calls complete at
//! once, so the thread flavour polls them once ([`ready_now`]); a backend's failures are
//! logged and never lose the item: a retry or a `done` that fails leaves the lease to expire,
//! and the item is handed out again then. A worker whose lease was lost changes nothing.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::unfinished::Unfinished;
use super::{
    Failure, GiveUp, GiveUpCallback, GiveUpReason, HandlerError, Outcome, StopToken, Summary,
};
use crate::{AddOptions, Queue, QueueLease};

/// How one handler call ended.
pub(crate) enum Handled {
    /// It returned an outcome.
    Outcome(Outcome),
    /// It returned this error.
    Failed(HandlerError),
    /// It panicked with this message.
    Panicked(String),
    /// It ran past the per-item timeout and was cancelled (async workers only).
    #[cfg_attr(
        not(feature = "tokio"),
        expect(dead_code, reason = "only async workers time out")
    )]
    TimedOut(Duration),
}

/// How a failed item goes back to the queue.
enum Requeue {
    /// With the rate limiter's delay.
    RateLimited,
    /// After this delay.
    After(Duration),
}

impl Requeue {
    fn options(&self) -> AddOptions {
        match self {
            Requeue::RateLimited => AddOptions::default().rate_limited(),
            Requeue::After(delay) => AddOptions::default().after(*delay),
        }
    }
}

/// The counters behind [`Summary`].
#[derive(Default)]
struct Counters {
    /// Written last for each call (release), read first (acquire), so a snapshot that sees a
    /// call in `processed` sees its other counts too.
    processed: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    given_up: AtomicU64,
    panicked: AtomicU64,
    timed_out: AtomicU64,
    lease_lost: AtomicU64,
}

/// How a `done` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The backend applied it.
    Applied,
    /// The lease was lost: the backend changed nothing.
    Lost,
    /// It failed otherwise (logged); the item is handed out again when its lease expires.
    Failed,
}

/// One pool's shared state.
pub(crate) struct Core<T, Q> {
    pub(crate) queue: Q,
    /// Retries before giving up; `None` retries forever.
    max_retries: Option<usize>,
    on_give_up: Option<GiveUpCallback<T>>,
    pub(crate) stop: StopToken,
    pub(crate) shutdown_timeout: Option<Duration>,
    counters: Counters,
    /// The item each worker is processing, by worker index.
    slots: Box<[Mutex<Option<T>>]>,
    /// Items touched and not finished that the queue no longer holds: delayed items the stop
    /// dropped, retries the shut-down queue refused, items handed to a worker as the stop
    /// came (see [`Summary::unfinished`]). Shared with the step task, which releases the
    /// leases no worker took.
    pub(crate) unfinished: Unfinished<T>,
    /// Workers still running; guarded so that waiters and the stop hook cannot miss a change.
    running: Mutex<usize>,
    /// Notified when a worker exits and when the pool is stopped.
    changed: Condvar,
    /// The stop hook's key in the token, removed when the last worker exits.
    stop_key: Mutex<Option<usize>>,
    /// Where async workers send their `done`s when the backend batches steps
    /// ([`Queue::batch_limit`] above 1): a `Stepper<Q>`, kept as `Any` because this struct
    /// has no bound on `Q` to name its lease type with; unset otherwise.
    #[cfg(feature = "tokio")]
    pub(crate) stepper: std::sync::OnceLock<Box<dyn Any + Send + Sync>>,
}

impl<T, Q> Core<T, Q>
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
{
    /// Builds the shared state of `count` workers and hooks it to `stop`.
    pub(crate) fn start(
        queue: Q,
        count: usize,
        max_retries: Option<usize>,
        on_give_up: Option<GiveUpCallback<T>>,
        stop: StopToken,
        shutdown_timeout: Option<Duration>,
    ) -> Arc<Self> {
        let core = Arc::new(Self {
            queue,
            max_retries,
            on_give_up,
            stop,
            shutdown_timeout,
            counters: Counters::default(),
            slots: (0..count).map(|_| Mutex::new(None)).collect(),
            unfinished: Arc::default(),
            running: Mutex::new(count),
            changed: Condvar::new(),
            stop_key: Mutex::new(None),
            #[cfg(feature = "tokio")]
            stepper: std::sync::OnceLock::new(),
        });
        // Weak: the token may outlive the pool by far (one token for a whole program).
        let weak: Weak<Self> = Arc::downgrade(&core);
        let key = core.stop.on_stop(move || {
            if let Some(core) = weak.upgrade() {
                core.on_stop();
            }
        });
        *core.stop_key.lock() = key;
        core
    }

    /// The number of workers.
    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    /// Records that a worker was handed `lease` as the stop shut the queue down and leaves
    /// it unprocessed (it is listed in the summary's `unfinished`).
    /// The lease is released: on a backend that keeps the item (a shared one, whose other
    /// processes go on), it is handed out again and not listed.
    pub(crate) async fn leave_unprocessed(&self, lease: Q::Lease) {
        let item = lease.item().clone();
        match lease.release().await {
            Ok(true) => {}
            Ok(false) => self.unfinished.lock().push(item),
            Err(error) => tracing::warn!(
                queue = self.queue.name(),
                item = ?item,
                %error,
                "cannot release an item left unprocessed; the backend takes it back when its lease expires"
            ),
        }
    }

    /// The stop hook: shut the queue down (waking every getter), keeping the delayed items
    /// it drops, and wake whoever waits for the pool.
    fn on_stop(&self) {
        // The shut down hands back what it dropped, in the same critical section: a delayed
        // add cannot land between a count and the shut down. Queued items stay in the queue
        // and are counted when a summary is taken.
        let dropped = self.queue.shut_down();
        if !dropped.is_empty() {
            self.unfinished.lock().extend(dropped);
        }
        let _running = self.running.lock();
        self.changed.notify_all();
    }

    /// Called by each worker as it exits, however it exits.
    pub(crate) fn worker_exited(&self) {
        let mut running = self.running.lock();
        *running -= 1;
        if *running == 0
            && let Some(key) = self.stop_key.lock().take()
        {
            self.stop.remove_on_stop(key);
        }
        self.changed.notify_all();
    }

    /// The span one item's processing runs in: `workqueue.item`, with the queue's name, the
    /// item, the priority it was handed out with and its retries so far (left empty if the
    /// backend cannot tell; not asked for when no subscriber records the span).
    pub(crate) async fn span(&self, item: &T, priority: i32) -> tracing::Span {
        // The retries cost a round trip on a shared backend: asked for only when a subscriber
        // records spans of this level here.
        let retries = if tracing::span_enabled!(tracing::Level::INFO) {
            match self.queue.num_requeues(item).await {
                Ok(retries) => Some(retries),
                Err(error) => {
                    tracing::warn!(
                        queue = self.queue.name(),
                        item = ?item,
                        %error,
                        "cannot read the item's retries"
                    );
                    None
                }
            }
        } else {
            None
        };
        tracing::info_span!(
            "workqueue.item",
            queue = self.queue.name().unwrap_or(""),
            item = ?item,
            priority,
            retries,
        )
    }

    /// Notes that worker `slot` took `lease`.
    pub(crate) fn begin(&self, slot: usize, lease: &Q::Lease) {
        *self.slots[slot].lock() = Some(lease.item().clone());
    }

    /// Applies what the handler did with the item of `lease`, then ends the lease.
    ///
    /// A retry is added back while the lease is still held, then the lease is marked done
    /// (client-go's order, and the only safe one on a backend where a lease that is not done
    /// is handed out again), in one fenced step ([`Queue::retry_and_done`]): the queue keeps
    /// the re-add and queues the item when the lease ends. A shut down cannot fall between an
    /// accepted re-add and the summary: either the add is refused and the item is listed in
    /// `unfinished` (in memory) or released back to the backend, or it is accepted and the
    /// stop's shut down hands it back.
    ///
    /// Every write of the failure path is fenced like the `done`: a worker whose lease was
    /// lost (it expired and the item is another worker's now) changes nothing, neither the
    /// failure count nor the item's place, and fires no give-up; the call counts as
    /// [`lease_lost`](Summary::lease_lost).
    ///
    /// A backend's failure never loses the item: a retry or a `done` that fails leaves the
    /// lease to expire, and the item is handed out again then.
    ///
    /// Returns the next lease when the backend handed one out with the `done`
    /// ([`Queue::done_and_next`]): the worker processes it without a `get`.
    pub(crate) async fn finish(
        &self,
        slot: usize,
        lease: Q::Lease,
        handled: Handled,
    ) -> Option<Q::Lease> {
        let item = lease.item().clone();
        let next = match handled {
            Handled::Outcome(Outcome::Done) => {
                // A success forgets the item's failures, with the done.
                let (next, ended) = self.done(lease, true).await;
                self.tally(ended, &self.counters.succeeded);
                next
            }
            Handled::Outcome(Outcome::Retry) => self.retry(lease, None).await,
            Handled::Outcome(Outcome::RetryAfter(delay)) => {
                tracing::debug!(
                    queue = self.queue.name(),
                    item = ?item,
                    ?delay,
                    "processing item again after a delay"
                );
                self.requeue(lease, Requeue::After(delay)).await;
                None
            }
            Handled::Outcome(Outcome::GiveUp) => {
                let retries = self.num_requeues(&item).await;
                self.give_up(lease, GiveUpReason::Handler, retries, None)
                    .await
            }
            Handled::Failed(error) => self.retry(lease, Some(Failure::Error(error))).await,
            Handled::Panicked(message) => {
                self.counters.panicked.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    panic = %message,
                    "handler panicked; handling it as a failure"
                );
                self.retry(lease, Some(Failure::Panicked(message))).await
            }
            Handled::TimedOut(timeout) => {
                self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    ?timeout,
                    "handler timed out; handling it as a failure"
                );
                self.retry(lease, Some(Failure::TimedOut(timeout))).await
            }
        };
        *self.slots[slot].lock() = None;
        self.counters.processed.fetch_add(1, Ordering::Release);
        next
    }

    /// Counts a call in `counter`, or in `lease_lost` if its lease was lost.
    fn tally(&self, ended: Ended, counter: &AtomicU64) {
        match ended {
            Ended::Lost => &self.counters.lease_lost,
            Ended::Applied | Ended::Failed => counter,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// The pool's step task, if the backend batches steps.
    #[cfg(feature = "tokio")]
    pub(crate) fn stepper(&self) -> Option<&super::step::Stepper<Q>> {
        self.stepper
            .get()
            .and_then(|s| s.downcast_ref::<super::step::Stepper<Q>>())
    }

    /// Marks the lease done (forgetting the item's failures first if `forget`), logging a
    /// failure (the backend hands the item out again once the lease expires, so nothing is
    /// lost); returns the next lease if the backend handed one out with the done, and how
    /// the done ended.
    async fn done(&self, lease: Q::Lease, forget: bool) -> (Option<Q::Lease>, Ended) {
        let item = lease.item().clone();
        #[cfg(feature = "tokio")]
        let lease = match self.stepper() {
            None => lease,
            Some(stepper) => match stepper.done_and_next(lease, forget).await {
                Ok((outcome, next)) => {
                    let ended = match outcome {
                        Ok(()) => Ended::Applied,
                        Err(failure) => self.done_failed(&item, failure.lost, &failure.message),
                    };
                    return (next, ended);
                }
                // The steps have ended: end this lease on its own.
                Err(lease) => lease,
            },
        };
        match self.queue.done_and_next(lease, forget).await {
            Ok(next) => (next, Ended::Applied),
            Err(error) => (
                None,
                self.done_failed(&item, Q::is_lease_lost(&error), &error),
            ),
        }
    }

    /// Logs a `done` that failed; how it ended.
    fn done_failed(&self, item: &T, lost: bool, error: &dyn fmt::Display) -> Ended {
        if lost {
            tracing::warn!(
                queue = self.queue.name(),
                item = ?item,
                "the item's lease was lost before its done: another worker has it now, and nothing was changed"
            );
            Ended::Lost
        } else {
            tracing::warn!(
                queue = self.queue.name(),
                item = ?item,
                %error,
                "cannot mark the item done (or forget its failures); a shared backend hands it out again once its lease expires"
            );
            Ended::Failed
        }
    }

    /// Puts the item back in the queue as `how` says and ends the lease, in one fenced step.
    async fn requeue(&self, lease: Q::Lease, how: Requeue) {
        let item = lease.item().clone();
        // `RetryAfter` forgets the failures; a rate-limited retry counts one more.
        let forget = matches!(how, Requeue::After(_));
        match self
            .queue
            .retry_and_done(lease, how.options(), forget)
            .await
        {
            Ok(None) => {
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Some(lease)) => {
                tracing::debug!(
                    queue = self.queue.name(),
                    item = ?item,
                    "the queue is shut down: the retry is left unfinished"
                );
                self.leave_unprocessed(lease).await;
            }
            Err(error) if Q::is_lease_lost(&error) => {
                self.counters.lease_lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    "the item's lease was lost before its retry: another worker has it now, and nothing was changed"
                );
            }
            Err(error) => {
                // Whether the step applied is unknown: the backend hands the item out again
                // once its lease expires, and no retry is lost.
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    %error,
                    "cannot add the retry; the item is handed out again when its lease expires"
                );
            }
        }
    }

    /// The item's retries so far; 0 (logged) if the backend cannot tell.
    async fn num_requeues(&self, item: &T) -> usize {
        match self.queue.num_requeues(item).await {
            Ok(retries) => retries,
            Err(error) => {
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    %error,
                    "cannot read the item's retries; counting none"
                );
                0
            }
        }
    }

    /// A failure: retry with the rate limiter's delay, or give up after `max_retries`.
    async fn retry(&self, lease: Q::Lease, error: Option<Failure>) -> Option<Q::Lease> {
        let retries = self.num_requeues(lease.item()).await;
        if self.max_retries.is_some_and(|max| retries >= max) {
            return self
                .give_up(lease, GiveUpReason::MaxRetries, retries, error)
                .await;
        }
        tracing::debug!(
            queue = self.queue.name(),
            item = ?lease.item(),
            retries = retries + 1,
            error = error.as_ref().map(tracing::field::display),
            "retrying item"
        );
        self.requeue(lease, Requeue::RateLimited).await;
        None
    }

    /// Gives up on the item: forgets it and marks it done in one fenced step, then logs the
    /// give-up and tells the callback, unless the lease was lost (the item is another
    /// worker's, and nothing changed). A `done` that failed otherwise may have applied: the
    /// give-up is reported (if it did not apply, the item comes back with its failures and
    /// is given up again: a give-up is reported at least once, never silently dropped).
    async fn give_up(
        &self,
        lease: Q::Lease,
        reason: GiveUpReason,
        retries: usize,
        error: Option<Failure>,
    ) -> Option<Q::Lease> {
        let item = lease.item().clone();
        let (next, ended) = self.done(lease, true).await;
        self.tally(ended, &self.counters.given_up);
        if ended == Ended::Lost {
            return next;
        }
        tracing::warn!(
            queue = self.queue.name(),
            item = ?item,
            %reason,
            retries,
            error = error.as_ref().map(tracing::field::display),
            "giving up on item"
        );
        if let Some(callback) = &self.on_give_up {
            let report = GiveUp {
                item: item.clone(),
                reason,
                retries,
                error,
            };
            if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| callback(&report))) {
                tracing::error!(
                    queue = self.queue.name(),
                    item = ?item,
                    panic = %panic_message(payload.as_ref()),
                    "give-up callback panicked"
                );
            }
        }
        next
    }

    /// The counts so far, and the items being processed now. `left_in_queue` reads the
    /// queue's length if the backend answers at once (in memory); otherwise it counts only
    /// the `unfinished` items (see [`final_summary`](Self::final_summary)).
    pub(crate) fn summary(&self) -> Summary<T> {
        let queued = if self.stop.is_stopped() {
            ready_now(self.queue.len())
                .and_then(Result::ok)
                .unwrap_or(0)
        } else {
            0
        };
        self.summary_with(queued)
    }

    /// The summary, reading the queue's length from any backend.
    #[cfg_attr(
        not(feature = "tokio"),
        expect(dead_code, reason = "threaded workers sum up without waiting")
    )]
    pub(crate) async fn final_summary(&self) -> Summary<T> {
        let queued = if self.stop.is_stopped() {
            match self.queue.len().await {
                Ok(queued) => queued,
                Err(error) => {
                    tracing::warn!(
                        queue = self.queue.name(),
                        %error,
                        "cannot read the queue's length for the summary"
                    );
                    0
                }
            }
        } else {
            0
        };
        self.summary_with(queued)
    }

    fn summary_with(&self, queued: usize) -> Summary<T> {
        let counters = &self.counters;
        let processed = counters.processed.load(Ordering::Acquire);
        let unfinished = self.unfinished.lock().clone();
        Summary {
            processed,
            succeeded: counters.succeeded.load(Ordering::Relaxed),
            retried: counters.retried.load(Ordering::Relaxed),
            given_up: counters.given_up.load(Ordering::Relaxed),
            panicked: counters.panicked.load(Ordering::Relaxed),
            timed_out: counters.timed_out.load(Ordering::Relaxed),
            lease_lost: counters.lease_lost.load(Ordering::Relaxed),
            in_flight: self
                .slots
                .iter()
                .filter_map(|slot| slot.lock().clone())
                .collect(),
            left_in_queue: unfinished.len() + queued,
            unfinished,
        }
    }

    /// Blocks until every worker has exited, or until the shutdown timeout has passed since
    /// this call saw the stop. Returns `true` if they all exited.
    pub(crate) fn blocking_wait(&self) -> bool {
        let mut running = self.running.lock();
        let mut deadline: Option<Instant> = None;
        while *running > 0 {
            let limit = self.shutdown_timeout.filter(|_| self.stop.is_stopped());
            match limit {
                Some(timeout) => {
                    let deadline = *deadline.get_or_insert_with(|| {
                        Instant::now()
                            .checked_add(timeout)
                            .unwrap_or_else(far_future)
                    });
                    if self.changed.wait_until(&mut running, deadline).timed_out() {
                        return *running == 0;
                    }
                }
                None => self.changed.wait(&mut running),
            }
        }
        true
    }
}

/// An instant as far from now as a timeout too long to add can mean: a century, or less
/// where the platform's clock cannot count that far.
fn far_future() -> Instant {
    crate::clock::saturating_add(Instant::now(), Duration::MAX)
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(a panic payload that is not a string)".to_owned()
    }
}

/// Polls `future` once, with a waker that does nothing: its output if it is ready at once.
/// The in-memory queue's calls (all but `get` and the drain) are, so the thread flavour and
/// the synchronous snapshots run them with this.
pub(crate) fn ready_now<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}
