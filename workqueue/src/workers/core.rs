//! What both flavours of workers share: the counters, the in-flight slots, the stop hook and
//! the rules that turn a handler's outcome into queue calls.

use std::any::Any;
use std::fmt;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{GiveUp, GiveUpCallback, GiveUpReason, Outcome, StopToken, Summary};
use crate::{Lease, WorkQueue};

/// How one handler call ended.
pub(crate) enum Handled {
    /// It returned an outcome.
    Outcome(Outcome),
    /// It returned a failure with this message.
    Failed(String),
    /// It panicked with this message.
    Panicked(String),
    /// It ran past the per-item timeout and was cancelled (async workers only).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    TimedOut(Duration),
}

/// How a failed item goes back to the queue.
enum Requeue {
    /// With the rate limiter's delay.
    RateLimited,
    /// After this delay.
    After(Duration),
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
}

/// One pool's shared state.
pub(crate) struct Core<T> {
    pub(crate) queue: WorkQueue<T>,
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
    /// came (see [`Summary::unfinished`]).
    unfinished: Mutex<Vec<T>>,
    /// Workers still running; guarded so that waiters and the stop hook cannot miss a change.
    running: Mutex<usize>,
    /// Notified when a worker exits and when the pool is stopped.
    changed: Condvar,
    /// The stop hook's key in the token, removed when the last worker exits.
    stop_key: Mutex<Option<usize>>,
}

impl<T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> Core<T> {
    /// Builds the shared state of `count` workers and hooks it to `stop`.
    pub(crate) fn start(
        queue: WorkQueue<T>,
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
            stop: stop.clone(),
            shutdown_timeout,
            counters: Counters::default(),
            slots: (0..count).map(|_| Mutex::new(None)).collect(),
            unfinished: Mutex::new(Vec::new()),
            running: Mutex::new(count),
            changed: Condvar::new(),
            stop_key: Mutex::new(None),
        });
        // Weak: the token may outlive the pool by far (one token for a whole program).
        let weak: Weak<Self> = Arc::downgrade(&core);
        let key = stop.on_stop(move || {
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
    pub(crate) fn leave_unprocessed(&self, lease: Lease<T>) {
        let item = lease.item().clone();
        drop(lease);
        self.unfinished.lock().push(item);
    }

    /// The stop hook: shut the queue down (waking every getter), keeping the delayed items
    /// it drops, and wake whoever waits for the pool.
    fn on_stop(&self) {
        // The shut down hands back what it dropped, in the same critical section: a delayed
        // add cannot land between a count and the shut down. Queued items stay in the queue
        // and are counted when a summary is taken.
        let dropped = self.queue.shut_down_taking_delayed();
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

    /// Notes that worker `slot` took `lease`.
    /// The span one item's processing runs in: `workqueue.item`, with the queue's name, the
    /// item, the priority it was handed out with and its retries so far.
    pub(crate) fn span(&self, lease: &Lease<T>) -> tracing::Span {
        tracing::info_span!(
            "workqueue.item",
            queue = self.queue.name().unwrap_or(""),
            item = ?lease.item(),
            priority = lease.priority(),
            retries = self.queue.num_requeues(lease.item()),
        )
    }

    pub(crate) fn begin(&self, slot: usize, lease: &Lease<T>) {
        *self.slots[slot].lock() = Some(lease.item().clone());
    }

    /// Applies what the handler did with the item of `lease`, then drops the lease.
    ///
    /// A retry is added back after the lease is dropped (client-go adds, then marks done;
    /// the queue's rules give the same result either way), so that a shut down cannot fall
    /// between an accepted re-add and the summary: either the add is refused and the item is
    /// listed in `unfinished`, or it is accepted and the stop's shut down hands it back.
    pub(crate) fn finish(&self, slot: usize, lease: Lease<T>, handled: Handled) {
        let item = lease.item();
        let requeue = match handled {
            Handled::Outcome(Outcome::Done) => {
                self.queue.forget(item);
                self.counters.succeeded.fetch_add(1, Ordering::Relaxed);
                None
            }
            Handled::Outcome(Outcome::Retry) => self.retry(item, None),
            Handled::Outcome(Outcome::RetryAfter(delay)) => {
                self.queue.forget(item);
                tracing::debug!(
                    queue = self.queue.name(),
                    item = ?item,
                    ?delay,
                    "processing item again after a delay"
                );
                Some(Requeue::After(delay))
            }
            Handled::Outcome(Outcome::GiveUp) => {
                let retries = self.queue.num_requeues(item);
                self.give_up(item, GiveUpReason::Handler, retries, None);
                None
            }
            Handled::Failed(error) => self.retry(item, Some(error)),
            Handled::Panicked(message) => {
                self.counters.panicked.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    panic = %message,
                    "handler panicked; handling it as a failure"
                );
                self.retry(item, Some(format!("handler panicked: {message}")))
            }
            Handled::TimedOut(timeout) => {
                self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = self.queue.name(),
                    item = ?item,
                    ?timeout,
                    "handler timed out; handling it as a failure"
                );
                self.retry(item, Some(format!("handler timed out after {timeout:?}")))
            }
        };
        let requeue = requeue.map(|how| (how, item.clone()));
        drop(lease);
        if let Some((how, item)) = requeue {
            let accepted = match how {
                Requeue::RateLimited => self.queue.add_rate_limited_accepted(item.clone()),
                Requeue::After(delay) => self.queue.add_after_accepted(item.clone(), delay),
            };
            if accepted {
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
            } else {
                tracing::debug!(
                    queue = self.queue.name(),
                    item = ?item,
                    "the queue is shut down: the retry is left unfinished"
                );
                self.unfinished.lock().push(item);
            }
        }
        *self.slots[slot].lock() = None;
        self.counters.processed.fetch_add(1, Ordering::Release);
    }

    /// A failure: retry with the rate limiter's delay, or give up after `max_retries`.
    fn retry(&self, item: &T, error: Option<String>) -> Option<Requeue> {
        let retries = self.queue.num_requeues(item);
        if self.max_retries.is_some_and(|max| retries >= max) {
            self.give_up(item, GiveUpReason::MaxRetries, retries, error);
            return None;
        }
        tracing::debug!(
            queue = self.queue.name(),
            item = ?item,
            retries = retries + 1,
            error = error.as_deref(),
            "retrying item"
        );
        Some(Requeue::RateLimited)
    }

    /// Forgets `item`, logs the give-up and tells the callback.
    fn give_up(&self, item: &T, reason: GiveUpReason, retries: usize, error: Option<String>) {
        self.queue.forget(item);
        self.counters.given_up.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            queue = self.queue.name(),
            item = ?item,
            %reason,
            retries,
            error = error.as_deref(),
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
    }

    /// The counts so far, and the items being processed now.
    pub(crate) fn summary(&self) -> Summary<T> {
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
            in_flight: self
                .slots
                .iter()
                .filter_map(|slot| slot.lock().clone())
                .collect(),
            left_in_queue: unfinished.len()
                + if self.stop.is_stopped() {
                    self.queue.len()
                } else {
                    0
                },
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

/// An instant a century from now, for timeouts too long to add.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
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
