// Workers: the controller loop every client-go user writes, written once. The public
// documentation is on `Workers`.

mod core;
#[cfg(feature = "tokio")]
mod step;
mod stop;
mod unfinished;

/// The accessors every running pool has ([`ThreadWorkers`], `AsyncWorkers`), written once:
/// expanded inside each pool's `impl` block, with the type of its queue.
macro_rules! pool_accessors {
    ($queue:ty) => {
        /// The token that stops this pool.
        pub fn stop_token(&self) -> &StopToken {
            &self.core.stop
        }

        /// The queue the workers take items from.
        pub fn queue(&self) -> &$queue {
            &self.core.queue
        }

        /// Stops the pool without waiting: workers take no new item and the queue is shut
        /// down. The same as stopping its [`StopToken`].
        pub fn stop(&self) {
            self.core.stop.stop();
        }

        /// What the workers have done so far, and what they are processing now.
        ///
        /// On a backend whose calls need a round trip, a snapshot taken after the stop counts
        /// in [`left_in_queue`](Summary::left_in_queue) only the `unfinished` items; the
        /// summary the waiting calls return reads the queue's length too.
        pub fn stats(&self) -> Summary<T> {
            self.core.summary()
        }
    };
}
use pool_accessors;
mod threaded;

#[cfg(feature = "tokio")]
mod asynchronous;

use std::any::Any;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::{Queue, WorkQueue};

#[cfg(feature = "tokio")]
pub use asynchronous::AsyncWorkers;
pub use stop::{StopToken, Stopped};
pub use threaded::ThreadWorkers;

/// What became of an item: the handler's answer to the worker.
///
/// Handlers may also return anything that is [`IntoOutcome`]: `()` (done), or a `Result`
/// whose `Ok` is done (or holds an `Outcome`) and whose `Err` is a failure to retry.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::Outcome;
///
/// fn reconcile(key: &str) -> Outcome {
///     match key {
///         "default/ready" => Outcome::Done,
///         "default/starting" => Outcome::RetryAfter(Duration::from_secs(30)), // poll again later
///         "default/invalid" => Outcome::GiveUp, // retrying cannot help
///         _ => Outcome::Retry, // a transient failure: back off
///     }
/// }
/// # assert_eq!(reconcile("default/ready"), Outcome::Done);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Processed: the rate limiter [forgets](WorkQueue::forget) the item's failures.
    Done,
    /// Failed: retry after the rate limiter's delay
    /// ([`add_rate_limited`](WorkQueue::add_rate_limited)), unless the item has been retried
    /// [`max_retries`](Workers::max_retries) times already, in which case it is given up.
    Retry,
    /// Process the item again after this delay ([`add_after`](WorkQueue::add_after)). Not a
    /// failure: the item's failure count is [forgotten](WorkQueue::forget) first, as
    /// controller-runtime does for `RequeueAfter`.
    RetryAfter(Duration),
    /// Stop trying: the item is forgotten and the give-up is reported.
    GiveUp,
}

/// What a handler may return: anything that converts to an [`Outcome`], or to a failure.
///
/// `Ok(outcome)` is the outcome; `Err(error)` is a failure, handled as [`Outcome::Retry`],
/// logged, and passed with its type to the [`on_give_up`](Workers::on_give_up) callback
/// (as a [`HandlerError`], read back with [`HandlerError::downcast_ref`]).
///
/// Implemented for [`Outcome`], for `()` (done), and for `Result<O, E>` where `O` is
/// `IntoOutcome` and `E` is [`Display`](fmt::Display) + `Send + Sync + 'static`: `Ok(())`,
/// `Ok(Outcome::…)`, or an error of any such type (`String`, `&'static str`,
/// `std::io::Error`, `anyhow::Error`, ...).
///
/// # Examples
///
/// ```
/// use workq::IntoOutcome;
/// use workq::Outcome;
///
/// assert_eq!(().into_outcome(), Ok(Outcome::Done));
/// assert_eq!(Ok::<_, String>(Outcome::Retry).into_outcome(), Ok(Outcome::Retry));
/// let error = Err::<(), _>(std::io::Error::other("timeout")).into_outcome().unwrap_err();
/// assert_eq!(error.to_string(), "timeout");
/// assert_eq!(error.downcast_ref::<std::io::Error>().unwrap().kind(), std::io::ErrorKind::Other);
/// ```
pub trait IntoOutcome {
    /// The outcome, or the error of a failure.
    ///
    /// # Errors
    ///
    /// The failure, for a value that stands for one (`Err(error)`).
    fn into_outcome(self) -> Result<Outcome, HandlerError>;
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Result<Outcome, HandlerError> {
        Ok(self)
    }
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Result<Outcome, HandlerError> {
        Ok(Outcome::Done)
    }
}

impl<O, E> IntoOutcome for Result<O, E>
where
    O: IntoOutcome,
    E: fmt::Display + Send + Sync + 'static,
{
    fn into_outcome(self) -> Result<Outcome, HandlerError> {
        match self {
            Ok(outcome) => outcome.into_outcome(),
            Err(error) => Err(HandlerError::new(error)),
        }
    }
}

/// A handler's error, kept with its type: [`downcast_ref`](Self::downcast_ref) gives it
/// back, [`Display`](fmt::Display) shows its message. Cheap to clone (shared).
///
/// Two handler errors are equal when their messages are.
#[derive(Clone)]
pub struct HandlerError {
    error: Arc<dyn Any + Send + Sync>,
    message: Arc<str>,
}

impl HandlerError {
    /// Wraps `error`, keeping its type and its message.
    pub fn new<E: fmt::Display + Send + Sync + 'static>(error: E) -> Self {
        Self {
            message: error.to_string().into(),
            error: Arc::new(error),
        }
    }

    /// The error, if it is an `E`.
    pub fn downcast_ref<E: 'static>(&self) -> Option<&E> {
        self.error.downcast_ref()
    }

    /// The error's message (its `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HandlerError").field(&self.message).finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl PartialEq for HandlerError {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for HandlerError {}

/// How the last attempt at an item failed, as reported in [`GiveUp::error`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The handler returned this error.
    Error(HandlerError),
    /// The handler panicked with this message.
    Panicked(String),
    /// The handler ran past the per-item timeout of async workers.
    TimedOut(Duration),
}

impl Failure {
    /// The handler's error, if it returned one and it is an `E`.
    pub fn downcast_ref<E: 'static>(&self) -> Option<&E> {
        match self {
            Failure::Error(error) => error.downcast_ref(),
            _ => None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(error) => fmt::Display::fmt(error, f),
            Failure::Panicked(message) => write!(f, "handler panicked: {message}"),
            Failure::TimedOut(timeout) => write!(f, "handler timed out after {timeout:?}"),
        }
    }
}

/// Why an item was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The handler returned [`Outcome::GiveUp`].
    Handler,
    /// The item failed again after [`max_retries`](Workers::max_retries) retries.
    MaxRetries,
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GiveUpReason::Handler => "the handler gave up",
            GiveUpReason::MaxRetries => "too many retries",
        })
    }
}

/// A report that an item was given up, passed to the [`on_give_up`](Workers::on_give_up)
/// callback.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GiveUp<T> {
    /// The item.
    pub item: T,
    /// Why.
    pub reason: GiveUpReason,
    /// How many times it had been retried (the rate limiter's
    /// [`num_requeues`](WorkQueue::num_requeues)).
    pub retries: usize,
    /// The last failure: the handler's error (with its type), the panic, or the timeout;
    /// `None` when the handler gave up itself ([`Outcome::GiveUp`]).
    pub error: Option<Failure>,
}

/// What a pool of workers did: returned when it stops, or as a snapshot by `stats`.
///
/// Every handler call counts once in `processed` and at most once in one of `succeeded`,
/// `retried`, `given_up` and `lease_lost` (a retry the shut-down queue refused is in none of
/// them); `panicked` and `timed_out` count the calls that ended that way (and are also in
/// one of the others).
///
/// # Examples
///
/// ```
/// use workq::{WorkQueue, Workers};
///
/// let queue = WorkQueue::new();
/// queue.add(1_u32);
/// queue.shut_down(); // workers process what is queued, then end
/// let summary = Workers::new(queue).spawn_threads(|_: &u32| ()).wait();
/// assert_eq!(summary.processed, 1);
/// assert_eq!(summary.succeeded, 1);
/// assert!(summary.is_drained());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary<T> {
    /// Handler calls that finished (one per attempt).
    pub processed: u64,
    /// Calls whose outcome was [`Outcome::Done`].
    pub succeeded: u64,
    /// Calls after which the item was put back in the queue: [`Outcome::Retry`],
    /// [`Outcome::RetryAfter`], an error, a panic or a timeout, when the queue accepted the
    /// re-add. A retry the shut-down queue refused is not counted here but listed in
    /// [`unfinished`](Self::unfinished); a retry accepted and then dropped by the stop's shut
    /// down is counted here and listed there too.
    pub retried: u64,
    /// Calls after which the item was given up.
    pub given_up: u64,
    /// Calls in which the handler panicked.
    pub panicked: u64,
    /// Calls that ran past the per-item `timeout` of async workers and were cancelled.
    pub timed_out: u64,
    /// Calls whose lease was lost before the worker ended it (on a shared backend, the lease
    /// expired and the item may be another worker's now): the backend refused the worker's
    /// `done`, retry or give-up, so the call changed nothing (no failure counted, nothing
    /// re-added or forgotten, no give-up callback).
    pub lease_lost: u64,
    /// Items still being processed when the summary was taken: empty once the workers
    /// drained, listed if the [`shutdown_timeout`](Workers::shutdown_timeout) passed first.
    pub in_flight: Vec<T>,
    /// Items the workers did not process because they were stopped: the items still queued
    /// (once the pool is stopped) plus every item in [`unfinished`](Self::unfinished). Zero
    /// while the workers run and the queue accepts adds.
    pub left_in_queue: usize,
    /// The items the workers touched and did not finish that the queue no longer holds, so
    /// that a caller can persist them and process them later: the delayed items the stop
    /// dropped when it shut the queue down (delayed retries among them), retries the queue
    /// refused because it was already shut down, and items a worker was handed during the
    /// stop and left unprocessed. Items still queued are not listed: they are in the queue
    /// (take them with [`WorkQueue::try_get`]). Each item appears once per time it was
    /// dropped.
    ///
    /// On a backend shared by many processes (where stopping the pool stops only its own
    /// handle) the queue keeps such items instead: delayed retries stay on the server, and a
    /// retry or a hand-out the stopped handle cannot take is released back to the queue, so
    /// this list stays empty there.
    pub unfinished: Vec<T>,
}

impl<T> Summary<T> {
    /// Returns `true` if no item was still being processed.
    pub fn is_drained(&self) -> bool {
        self.in_flight.is_empty()
    }
}

impl<T> fmt::Display for Summary<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "processed {} (succeeded {}, retried {}, given up {}; panicked {}, timed out {}), \
             {} in flight, {} left in queue",
            self.processed,
            self.succeeded,
            self.retried,
            self.given_up,
            self.panicked,
            self.timed_out,
            self.in_flight.len(),
            self.left_in_queue,
        )?;
        if self.lease_lost > 0 {
            write!(f, ", {} leases lost", self.lease_lost)?;
        }
        Ok(())
    }
}

/// A callback told about each item given up.
type GiveUpCallback<T> = Arc<dyn Fn(&GiveUp<T>) + Send + Sync>;

/// Configures and starts a pool of workers over a [`Queue`](crate::Queue): by default the
/// in-memory [`WorkQueue`].
///
/// Workers: the controller loop every client-go user writes, written once.
///
/// A client-go controller runs `N` goroutines that each loop: `Get` an item, process it,
/// `Forget` it on success or `AddRateLimited` it on error (giving up after a few retries),
/// always `Done`, until the queue shuts down. [`Workers`] runs that loop for you over a
/// [`WorkQueue`]; you write only the handler, which says what became of the item with an
/// [`Outcome`]:
///
/// | the handler returns | the worker does | counted as |
/// | --- | --- | --- |
/// | [`Outcome::Done`], `()`, `Ok(())` | [`forget`](WorkQueue::forget) | succeeded |
/// | [`Outcome::Retry`], `Err(error)` | [`add_rate_limited`](WorkQueue::add_rate_limited), or gives up once the item has been retried [`max_retries`](Workers::max_retries) times | retried (or given up) |
/// | [`Outcome::RetryAfter`]`(d)` | `forget`, then [`add_after`](WorkQueue::add_after)`(item, d)` (controller-runtime's `RequeueAfter`) | retried |
/// | [`Outcome::GiveUp`] | `forget`, and reports it | given up |
/// | (panics) | as `Retry`; the worker keeps running | panicked, and retried (or given up) |
/// | (runs past the `timeout`, async only) | as `Retry` | timed out, and retried (or given up) |
///
/// In every case the item's lease is marked done after the outcome is applied (a retry is
/// added back while the lease is still held), so a re-add never races with the item being
/// processed. Giving up is never silent: it is
/// logged with `tracing::warn!` and passed to the [`on_give_up`](Workers::on_give_up)
/// callback.
///
/// Each item is processed inside a `tracing` span named `workqueue.item`, with the fields
/// `queue` (the queue's name, or empty), `item` (its `Debug` form), `priority` and `retries`
/// (its [`num_requeues`](WorkQueue::num_requeues) when handed out), so the handler's own
/// events and spans nest under it. With the feature `otel` the span links to the spans the
/// item was added in (the lease's `links`; see the `otel` module).
///
/// Two flavours share the rules: [`Workers::spawn_threads`] runs plain threads with a
/// blocking handler, and `Workers::spawn_async` (feature `tokio`, on by default) runs tokio
/// tasks with an async handler.
///
/// # Backends
///
/// [`Workers`] run over any [`Queue`]: the in-memory [`WorkQueue`], or a
/// backend shared by many processes (`workq_redis::RedisQueue`), with the same rules and
/// the same summary. The loop ends every lease explicitly: `done` after a success or a
/// give-up; for a retry it adds the item back first and then marks it done (the queue keeps
/// the re-add until the lease ends), in one step that a shared backend fences like the
/// `done` ([`Queue::retry_and_done`]). A worker whose lease was lost (it expired, and the item
/// is another worker's now) changes nothing on any path: no failure is counted, nothing is
/// re-added or forgotten, no give-up is reported, and the call counts as
/// [`lease_lost`](Summary::lease_lost). A backend's failure never stops the pool and never
/// loses an item: a failed `get` is logged and retried with backoff (50 ms doubling to 5 s),
/// and a retry or a `done` that fails leaves the lease to expire, so the item is handed out
/// again. [`Workers::spawn_threads`] is for the in-memory queue only.
///
/// # Stopping
///
/// Every pool has a [`StopToken`] ([`Workers::stop_token`] to bring your own). When it
/// stops, workers take no new item, the queue is [shut down](WorkQueue::shut_down) (as
/// client-go controllers do with `defer queue.ShutDown()`), and the items being processed
/// finish. The waiting calls ([`ThreadWorkers::wait`], [`ThreadWorkers::shut_down`], and
/// `AsyncWorkers::wait`, `shut_down` and `run_until`) then
/// return a [`Summary`]: what was processed, retried, given up, panicked, and, if the
/// [`shutdown_timeout`](Workers::shutdown_timeout) passed first, what was still in flight.
/// Workers also end on their own once the queue is shut down by someone else and has handed
/// out its last item.
///
///
/// # Items
///
/// Items must be [`Debug`](fmt::Debug) too, so that retries and give-ups can name them in
/// their `tracing` events.
///
/// # Default
///
/// One worker (controller-runtime's `MaxConcurrentReconciles` default), up to
/// [`DEFAULT_MAX_RETRIES`] retries, no give-up callback (give-ups are still logged), a new
/// [`StopToken`], no shutdown timeout and no per-item timeout.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::{Outcome, StopToken, WorkQueue, Workers};
///
/// let queue: WorkQueue<String> = WorkQueue::new();
/// let stop = StopToken::new();
/// let workers = Workers::new(queue.clone())
///     .count(8)
///     .max_retries(5)
///     .on_give_up(|gave_up| eprintln!("giving up on {}: {:?}", gave_up.item, gave_up.error))
///     .stop_token(stop.clone())
///     .shutdown_timeout(Duration::from_secs(30))
///     .spawn_threads(|key: &String| if key.is_empty() { Outcome::GiveUp } else { Outcome::Done });
///
/// stop.stop(); // from anywhere: a signal handler, another thread
/// let summary = workers.wait();
/// assert!(summary.is_drained());
/// ```
#[must_use = "workers do nothing until spawned"]
pub struct Workers<T, Q = WorkQueue<T>> {
    queue: Q,
    count: usize,
    max_retries: Option<usize>,
    on_give_up: Option<GiveUpCallback<T>>,
    stop: StopToken,
    shutdown_timeout: Option<Duration>,
    #[cfg(feature = "tokio")]
    timeout: Option<Duration>,
}

/// How many times [`Workers`] retry a failing item by default before giving it up: 15, as
/// Kubernetes' own controllers do (`maxRetries` in the endpoints and service controllers).
/// With [`default_controller`](crate::rate_limiter::default_controller) that is about 160 s
/// of backoff in all.
pub const DEFAULT_MAX_RETRIES: usize = 15;

impl<T, Q> fmt::Debug for Workers<T, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers")
            .field("count", &self.count)
            .field("max_retries", &self.max_retries)
            .field("on_give_up", &self.on_give_up.is_some())
            .field("stop", &self.stop)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

impl<T, Q> Workers<T, Q>
where
    T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
    Q: Queue<Item = T>,
{
    /// Starts configuring workers for `queue` (a handle; the pool keeps it): a
    /// [`WorkQueue`], or any other backend's [`Queue`].
    pub fn new(queue: Q) -> Self {
        Self {
            queue,
            count: 1,
            max_retries: Some(DEFAULT_MAX_RETRIES),
            on_give_up: None,
            stop: StopToken::new(),
            shutdown_timeout: None,
            #[cfg(feature = "tokio")]
            timeout: None,
        }
    }

    /// Runs `count` workers, each processing one item at a time (default 1).
    ///
    /// # Panics
    ///
    /// The spawn methods panic if `count` is 0.
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// How many workers the pool will run ([`count`](Self::count); 1 by default): what a
    /// wrapper that reports the pool's size (a controller's
    /// `controller_runtime_max_concurrent_reconciles`) reads after the caller's settings.
    pub fn worker_count(&self) -> usize {
        self.count
    }

    /// Gives an item up when it fails after `max_retries` retries (default
    /// [`DEFAULT_MAX_RETRIES`]), so it is processed at most `max_retries + 1` times in a row
    /// without success. 0 gives up at the first failure.
    ///
    /// The count is the queue's rate limiter's
    /// [`num_requeues`](WorkQueue::num_requeues), as in client-go's examples: a limiter that
    /// counts nothing per item (a lone [`TokenBucket`](crate::rate_limiter::TokenBucket))
    /// never gives up.
    pub fn max_retries(mut self, max_retries: usize) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// Never gives up a failing item (only [`Outcome::GiveUp`] does).
    pub fn retry_forever(mut self) -> Self {
        self.max_retries = None;
        self
    }

    /// Calls `callback` for each item given up, on the worker that gave it up, after the
    /// item is forgotten and before its lease is dropped. A panic in the callback is caught
    /// and logged.
    pub fn on_give_up(mut self, callback: impl Fn(&GiveUp<T>) + Send + Sync + 'static) -> Self {
        self.on_give_up = Some(Arc::new(callback));
        self
    }

    /// Stops the workers when `stop` is stopped, instead of a token of their own. Share one
    /// token between several pools, a [`Parallelizer`](crate::Parallelizer) and your signal
    /// handling to stop them all at once.
    pub fn stop_token(mut self, stop: StopToken) -> Self {
        self.stop = stop;
        self
    }

    /// After a stop, waits at most `timeout` for the items in flight (default: no limit).
    ///
    /// When it passes, the waiting call returns a [`Summary`] listing them in
    /// [`in_flight`](Summary::in_flight). Async workers still running are then aborted
    /// (their handler futures are dropped, which releases their leases); worker threads
    /// cannot be interrupted and are left to finish on their own. [`Duration::MAX`] (or any
    /// timeout too long for the clock to count) means no limit.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// Cancels a handler call that runs longer than `timeout` and handles it as a failure
    /// ([`Outcome::Retry`]), counted in [`Summary::timed_out`].
    ///
    /// Async workers only ([`spawn_async`](Self::spawn_async)): the handler's future is
    /// dropped at its next `.await`. Threads cannot be interrupted, so
    /// [`spawn_threads`](Self::spawn_threads) ignores it. [`Duration::MAX`] (or any timeout
    /// too long for the clock to count) means no limit.
    #[cfg(feature = "tokio")]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Starts the workers as tokio tasks, each awaiting `handler(item)` for each lease it
    /// takes (the item is a clone; the worker keeps the lease until the future is done).
    ///
    /// # Panics
    ///
    /// If the count is 0, or if called outside a tokio runtime (as `tokio::spawn` does). The
    /// runtime needs its time driver (`enable_time` or `enable_all`) when a
    /// [`timeout`](Self::timeout) or [`shutdown_timeout`](Self::shutdown_timeout) is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workq::{Outcome, WorkQueue, Workers};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// let workers = Workers::new(queue.clone())
    ///     .count(4)
    ///     .timeout(Duration::from_secs(10))
    ///     .spawn_async(|key: String| async move {
    ///         println!("reconciling {key}");
    ///         Outcome::Done
    ///     });
    /// queue.add("default/web-0".to_owned());
    /// # while workers.stats().processed < 1 { tokio::task::yield_now().await; }
    /// let summary = workers.shut_down().await;
    /// # assert_eq!(summary.succeeded, 1);
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub fn spawn_async<F, Fut>(self, handler: F) -> AsyncWorkers<T, Q>
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future + Send + 'static,
        Fut::Output: IntoOutcome,
    {
        assert!(self.count > 0, "workers: count must be at least 1");
        let timeout = self.timeout;
        AsyncWorkers::spawn(self.into_core(), timeout, handler)
    }

    fn into_core(self) -> Arc<core::Core<T, Q>> {
        core::Core::start(
            self.queue,
            self.count,
            self.max_retries,
            self.on_give_up,
            self.stop,
            self.shutdown_timeout,
        )
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> Workers<T, WorkQueue<T>> {
    /// Starts the workers as threads named `workq-worker-<i>` (with the queue's name if
    /// it has one), each calling `handler` with the item of each lease it takes.
    ///
    /// In memory only: a thread blocks in [`WorkQueue::blocking_get`], and a backend that
    /// talks to a server over the network is async (its calls need a runtime, and a blocked
    /// thread per worker buys nothing over a task); use
    /// [`spawn_async`](Workers::spawn_async) there.
    ///
    /// # Panics
    ///
    /// If the count is 0, or the system cannot start a thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::{WorkQueue, Workers};
    ///
    /// let queue = WorkQueue::new();
    /// let workers = Workers::new(queue.clone())
    ///     .count(2)
    ///     .spawn_threads(|key: &&str| -> Result<(), std::io::Error> {
    ///         println!("reconciling {key}");
    ///         Ok(())
    ///     });
    /// queue.add("default/web-0");
    /// # while workers.stats().processed < 1 { std::thread::yield_now(); }
    /// let summary = workers.shut_down();
    /// # assert_eq!(summary.succeeded, 1);
    /// ```
    pub fn spawn_threads<F, R>(self, handler: F) -> ThreadWorkers<T>
    where
        F: Fn(&T) -> R + Send + Sync + 'static,
        R: IntoOutcome,
    {
        assert!(self.count > 0, "workers: count must be at least 1");
        ThreadWorkers::spawn(self.into_core(), handler)
    }
}
