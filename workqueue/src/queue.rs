//! [`WorkQueue`], its [`Builder`] and [`AddOptions`]: the shared handle around [`State`].
//!
//! Every call takes the one lock, first moves delayed items that are due to the ready queue
//! (one clock read, only when something is delayed), asks `State` what to do, releases the
//! lock, then wakes whoever must be woken. No rule of the queue lives here.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::clock::{Clock, ClockListener, RealClock};
use crate::error::TryGetError;
use crate::lease::Lease;
use crate::metrics::{MetricsProvider, QueueMetrics, QueueProbe, QueueStats};
use crate::rate_limiter::{self, RateLimiter};
use crate::state::{Added, State, item_hash};
use crate::sync::{self, AtomicUsize, Condvar, Mutex, Ordering};
use crate::waiters::{Signal, Waiters, Wakeups};

/// Options for [`WorkQueue::add_with`]: an optional delay, a rate-limited flag and an optional
/// priority. This is controller-runtime's `AddOpts`.
///
/// `AddOptions::default()` is a plain [`add`](WorkQueue::add): no delay, not rate limited, no
/// priority.
///
/// # Priorities
///
/// - Higher is handed out first, over the whole `i32` range; items of one priority come out in
///   the order they became ready.
/// - No priority given means: a new item gets priority 0; a queued or delayed item keeps its
///   priority. A plain add never raises a low-priority item (controller-runtime reads a missing
///   priority as 0 and raises it); `.priority(0)` raises it when asked.
/// - A re-add can raise a queued or delayed item's priority, never lower it. A raised item goes
///   behind the items already waiting at its new priority; a re-add at its own priority does
///   not move it.
/// - A delayed item keeps its priority. Items that become due in one step join the ready order
///   earliest-due first, ties in the order of their first delayed add, behind the items
///   already ready.
/// - An item being processed is not queued. Re-added while its [`Lease`] is out, it is queued
///   anew when the lease drops, at the tail of its priority, with the highest priority given by
///   the re-adds since it was handed out (0 if none gave one), which may be lower than before.
/// - [`Lease::priority`] is the priority the item was handed out with.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workqueue::{AddOptions, WorkQueue};
///
/// let queue = WorkQueue::new();
/// queue.add_with("default/web-0", AddOptions::default().priority(10));
/// queue.add_with("default/web-1", AddOptions::default().after(Duration::from_secs(5)));
/// assert_eq!(queue.len(), 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddOptions {
    /// Wait this long before the item is ready; zero means now.
    after: Duration,
    /// Ask the rate limiter for a delay too; the shorter of the two wins.
    rate_limited: bool,
    /// The priority; `None` keeps a known item's priority and gives a new one 0.
    priority: Option<i32>,
}

impl AddOptions {
    /// Adds the item once `delay` has passed (see [`WorkQueue::add_after`]).
    #[must_use]
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Delays the item by what the queue's rate limiter says (see
    /// [`WorkQueue::add_rate_limited`]). With [`after`](Self::after) too, the shorter delay
    /// wins, as in controller-runtime.
    #[must_use]
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self
    }

    /// Sets the priority: higher is handed out first; an item never given one has 0. A re-add
    /// can raise an item's priority, never lower it, and a raised item goes behind the items
    /// already waiting at its new priority. See [`AddOptions`] for the full rules.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The delay set with [`after`](Self::after).
    pub fn delay(&self) -> Duration {
        self.after
    }

    /// Whether [`rate_limited`](Self::rate_limited) was set.
    pub fn is_rate_limited(&self) -> bool {
        self.rate_limited
    }

    /// The priority set with [`priority`](Self::priority), if any.
    pub fn get_priority(&self) -> Option<i32> {
        self.priority
    }
}

/// Builds a [`WorkQueue`] with a name, a clock or a rate limiter of your choice.
///
/// # Default
///
/// No name, [`RealClock`], and [`rate_limiter::default_controller`] running on the queue's
/// clock.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workqueue::{WorkQueue, clock::FakeClock, rate_limiter::ExponentialFailure};
///
/// let queue: WorkQueue<String> = WorkQueue::builder()
///     .name("pods")
///     .clock(FakeClock::new())
///     .rate_limiter(ExponentialFailure::new(
///         Duration::from_millis(5),
///         Duration::from_secs(60),
///     ))
///     .build();
/// assert_eq!(queue.name(), Some("pods"));
/// ```
#[must_use]
pub struct Builder<T> {
    name: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    limiter: Option<Box<dyn RateLimiter<T>>>,
    metrics: Option<Box<dyn MetricsProvider>>,
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("custom_clock", &self.clock.is_some())
            .field("custom_rate_limiter", &self.limiter.is_some())
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Builder<T> {
    /// Names the queue. Named queues report metrics; the name is their `name` label.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Runs the queue (delays, and the default rate limiter's token bucket) on `clock`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Uses `limiter` for [`WorkQueue::add_rate_limited`], [`WorkQueue::forget`] and
    /// [`WorkQueue::num_requeues`].
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<T> + 'static) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// Reports the queue's metrics to `provider` (client-go's `MetricsProvider`). Only named
    /// queues report, as in client-go; see [`metrics`](crate::metrics) for the rules and
    /// `PrometheusMetrics` (feature
    /// `prometheus`) for Kubernetes' series.
    pub fn metrics(mut self, provider: impl MetricsProvider) -> Self {
        self.metrics = Some(Box::new(provider));
        self
    }

    /// Builds the queue.
    pub fn build(self) -> WorkQueue<T> {
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(RealClock));
        let limiter = self.limiter.unwrap_or_else(|| {
            Box::new(rate_limiter::default_controller_with_clock(clock.clone()))
        });
        let epoch = clock.now();
        let name = self.name;
        let provider = self.metrics;
        let shared = Arc::new_cyclic(|weak: &Weak<Shared<T>>| {
            let mut state = State::new();
            let hasher = state.hasher().clone();
            let metrics = match (&name, provider) {
                (Some(name), Some(provider)) => {
                    state.enable_times();
                    let weak = weak.clone();
                    let probe =
                        QueueProbe::new(move || weak.upgrade().map(|shared| shared.probe_stats()));
                    Some(provider.new_queue(name, probe))
                }
                _ => None,
            };
            let weak = weak.clone();
            let callback: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                if let Some(shared) = weak.upgrade() {
                    shared.on_clock_advance();
                }
            });
            let clock_driven = clock.subscribe(ClockListener::new(Arc::downgrade(&callback)));
            Shared {
                inner: Mutex::new(Inner {
                    state,
                    waiters: Waiters::default(),
                    drain: false,
                    drain_waiters: Waiters::default(),
                    timer: TimerState::default(),
                }),
                ready_hint: AtomicUsize::new(0),
                handles: AtomicUsize::new(1),
                timer_cv: Condvar::new(),
                clock,
                clock_driven,
                epoch,
                limiter,
                hasher,
                name,
                metrics,
                _clock_callback: clock_driven.then_some(callback),
            }
        });
        WorkQueue { shared }
    }
}

/// State of the background thread that wakes getters when delayed items come due.
#[derive(Default)]
struct TimerState {
    /// The thread, once started; taken and joined on shut down or when the last handle drops.
    thread: Option<JoinHandle<()>>,
    /// The deadline the thread sleeps until (nanoseconds since the epoch); `u64::MAX` when it
    /// sleeps with nothing delayed. An add with an earlier deadline wakes it.
    sleeping_until: u64,
}

/// Everything behind the lock.
pub(crate) struct Inner<T> {
    /// The rules.
    pub(crate) state: State<T>,
    /// Getters waiting for an item.
    waiters: Waiters,
    /// A drain is in progress; cleared by a plain shut down (client-go's `drain`).
    drain: bool,
    /// Callers of a drain waiting for the last lease.
    drain_waiters: Waiters,
    /// The delay timer thread.
    timer: TimerState,
}

/// What every handle, lease and the timer thread share.
pub(crate) struct Shared<T> {
    /// The state and the waiters.
    inner: Mutex<Inner<T>>,
    /// A copy of `state.len()`, written under the lock, read without it by getters that spin
    /// briefly before parking.
    ready_hint: AtomicUsize,
    /// Live `WorkQueue` handles; the timer thread ends when this reaches 0.
    handles: AtomicUsize,
    /// Wakes the timer thread.
    timer_cv: Condvar,
    /// The queue's clock.
    clock: Arc<dyn Clock>,
    /// The clock calls us when it advances: no timer thread is needed.
    clock_driven: bool,
    /// Time zero for the nanosecond timestamps in `state`.
    epoch: Instant,
    /// Delays for `add_rate_limited`.
    limiter: Box<dyn RateLimiter<T>>,
    /// A copy of the state's hasher: items are hashed before the lock is taken.
    hasher: foldhash::fast::RandomState,
    /// The queue's name, if any.
    name: Option<String>,
    /// Where a named queue with a metrics provider reports; `None` records nothing.
    metrics: Option<Box<dyn QueueMetrics>>,
    /// Keeps the callback a driving clock holds weakly alive.
    _clock_callback: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// A deduplicating, delaying, rate-limiting work queue: client-go's `workqueue` for Rust.
///
/// See the [crate documentation](crate) for a tour. `WorkQueue` is a cheap handle: clones
/// share one queue. It is `Send + Sync`.
///
/// `T` is the item, usually a small key such as `"namespace/name"`: equal items are one item
/// to the queue, and the queue clones an item to hand it out, so cloning should be cheap
/// (`Arc<str>`, a small `String`, an id).
pub struct WorkQueue<T> {
    shared: Arc<Shared<T>>,
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Default for WorkQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for WorkQueue<T> {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last handle: end the timer thread. Taking the lock orders this after the
            // thread's check of `handles`, so the notification cannot fall between its check
            // and its wait.
            let thread = {
                let mut inner = self.shared.inner.lock();
                inner.timer.thread.take()
            };
            self.shared.timer_cv.notify_all();
            join_unless_current(thread);
        }
    }
}

/// Joins the timer thread, unless this is the timer thread: a waker it calls may drop the
/// last handle (an executor dropping a woken task), and a thread cannot join itself. The
/// timer loop returns by itself once it sees the queue shut down or without handles.
fn join_unless_current(thread: Option<JoinHandle<()>>) {
    if let Some(thread) = thread
        && thread.thread().id() != std::thread::current().id()
    {
        let _ = thread.join();
    }
}

impl<T> fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.inner.lock();
        f.debug_struct("WorkQueue")
            .field("name", &self.shared.name)
            .field("len", &inner.state.len())
            .field("delayed", &inner.state.delayed_len())
            .field("processing", &inner.state.processing())
            .field("shutting_down", &inner.state.is_shutting_down())
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> WorkQueue<T> {
    /// Creates a queue on the real clock with [`rate_limiter::default_controller`], no name
    /// and no metrics.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Starts building a queue with a name, clock or rate limiter of your choice.
    pub fn builder() -> Builder<T> {
        Builder {
            name: None,
            clock: None,
            limiter: None,
            metrics: None,
        }
    }

    /// The queue's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.shared.name.as_deref()
    }

    /// Marks `item` as needing processing.
    ///
    /// - A new item joins the tail of the queue.
    /// - An item already waiting stays where it is (dedup).
    /// - An item waiting for a delay becomes ready now and its delayed add is dropped, so it
    ///   is processed once (client-go would process it twice, kubernetes#126027).
    /// - An item being processed is queued again when its [`Lease`] is dropped, however many
    ///   times it is added meanwhile, and never handed to a second worker meanwhile.
    /// - After [`shut_down`](Self::shut_down) adds are ignored.
    ///
    /// This is client-go's `Add`, and `add_with(item, AddOptions::default())`: a new item gets
    /// priority 0; an item already queued or delayed keeps its priority.
    ///
    /// # Examples
    ///
    /// ```
    /// use workqueue::WorkQueue;
    ///
    /// let queue = WorkQueue::new();
    /// queue.add("default/web-0");
    /// queue.add("default/web-1");
    /// queue.add("default/web-0");
    /// assert_eq!(queue.len(), 2);
    /// ```
    #[inline]
    pub fn add(&self, item: T) {
        self.shared.add_now(item, None, false);
    }

    /// Adds `item` once `delay` has passed.
    ///
    /// A zero delay adds at once. If the item is already waiting for a delay, the earlier
    /// ready time wins; if it is already queued, it stays queued once; if it is being
    /// processed, it is added when the delay has passed (and handed out again after its lease
    /// is dropped). Never blocks: the queue keeps delayed items in a heap and one timer for
    /// all of them. `Duration::MAX` saturates (the item waits "forever", until an `add` or
    /// shut down).
    ///
    /// This is client-go's `AddAfter`, and `add_with(item, AddOptions::default().after(delay))`
    /// (no priority given), except that, as in client-go, it counts in the retries metric even
    /// with a zero delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue::{WorkQueue, clock::FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// let queue = WorkQueue::builder().clock(clock.clone()).build();
    /// queue.add_after("default/web-0", Duration::from_secs(10));
    /// queue.add_after("default/web-0", Duration::from_secs(2)); // earliest wins
    /// clock.step(Duration::from_secs(2));
    /// assert_eq!(queue.len(), 1);
    /// ```
    #[inline]
    pub fn add_after(&self, item: T, delay: Duration) {
        self.shared.add_delayed(item, delay, None, true);
    }

    /// [`add_rate_limited`](Self::add_rate_limited), returning `false` if the queue was shut
    /// down and refused the item.
    pub(crate) fn add_rate_limited_accepted(&self, item: T) -> bool {
        let delay = self.shared.limiter.when(&item);
        self.shared.record(|metrics| metrics.rate_limited(delay));
        self.shared.add_delayed(item, delay, None, true)
    }

    /// Shuts the queue down as [`shut_down`](Self::shut_down) does, and returns the delayed
    /// items it dropped (and a clone of each item being processed whose delayed re-add it
    /// dropped), so that the caller can keep them.
    pub(crate) fn shut_down_taking_delayed(&self) -> Vec<T> {
        self.shared.shut_down(false, true)
    }

    /// Adds `item` after the delay the queue's rate limiter gives it
    /// (`add_after(item, limiter.when(&item))`).
    ///
    /// Use it when processing failed; call [`forget`](Self::forget) when it succeeds. This is
    /// client-go's `AddRateLimited`, and `add_with(item, AddOptions::default().rate_limited())`
    /// (no priority given). As in client-go, the limiter is asked even after shut
    /// down (its failure count advances) although the add itself is ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue::{WorkQueue, clock::FakeClock, rate_limiter::ExponentialFailure};
    ///
    /// let clock = FakeClock::new();
    /// let queue = WorkQueue::builder()
    ///     .clock(clock.clone())
    ///     .rate_limiter(ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1)))
    ///     .build();
    /// queue.add_rate_limited("default/web-0"); // waits 5 ms
    /// assert_eq!(queue.num_requeues(&"default/web-0"), 1);
    /// clock.step(Duration::from_millis(5));
    /// assert_eq!(queue.len(), 1);
    /// ```
    pub fn add_rate_limited(&self, item: T) {
        self.add_rate_limited_accepted(item);
    }

    /// Adds `item` with any combination of a delay, rate limiting and a priority.
    ///
    /// [`add`](Self::add), [`add_after`](Self::add_after) and
    /// [`add_rate_limited`](Self::add_rate_limited) are this with one option each. With both a
    /// delay and `rate_limited`, the limiter is asked and the shorter delay wins
    /// (controller-runtime's rule). Dedup, earliest-wins for delays and "never handed to two
    /// workers at once" hold as for every add; [`AddOptions`] explains how priorities order
    /// items. It counts in the retries metric when it asks for a delay or rate limiting. This
    /// is controller-runtime's `AddWithOpts`.
    ///
    /// # Differences from controller-runtime
    ///
    /// | controller-runtime's priority queue | `WorkQueue` |
    /// | --- | --- |
    /// | `AddWithOpts` is buffered and flushed by a goroutine | synchronous: visible to `len`, `try_get` and waiting getters when `add_with` returns |
    /// | `GetWithPriority` after `ShutDown` reports shutdown at once, leaving queued items | getters still receive the queued items after [`shut_down`](Self::shut_down), then `None` (client-go's rule) |
    /// | a second `ShutDown` panics (closes a closed channel) | `shut_down` again is harmless |
    /// | a missing `Priority` is 0, so a plain `Add` raises a priority -100 item to 0 | no priority keeps a queued or delayed item's priority; `.priority(0)` raises it when asked |
    /// | an item re-added while locked is queued at once in add order, counted by `Len`, skipped until `Done` | not queued (not in `len`) while its lease is out; queued at the tail of its priority when the lease drops (client-go's rule) |
    /// | `ShutDownWithDrain` is `ShutDown` | [`shut_down_with_drain`](Self::shut_down_with_drain) waits for the leases |
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue::{AddOptions, WorkQueue, clock::FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// let queue = WorkQueue::builder().clock(clock.clone()).build();
    /// queue.add_with("default/resync", AddOptions::default().priority(-100));
    /// queue.add_with("default/web-0", AddOptions::default());
    /// queue.add_with("default/resync", AddOptions::default()); // keeps -100
    /// queue.add_with(
    ///     "default/urgent",
    ///     AddOptions::default().after(Duration::from_secs(1)).priority(10),
    /// );
    /// clock.step(Duration::from_secs(1));
    ///
    /// let order: Vec<_> = std::iter::from_fn(|| {
    ///     let lease = queue.try_get().ok()?;
    ///     Some((*lease, lease.priority()))
    /// })
    /// .collect();
    /// assert_eq!(
    ///     order,
    ///     [("default/urgent", 10), ("default/web-0", 0), ("default/resync", -100)]
    /// );
    /// ```
    pub fn add_with(&self, item: T, options: AddOptions) {
        self.add_with_accepted(item, options);
    }

    /// [`add_with`](Self::add_with), returning `false` if the queue was shut down and
    /// refused the item.
    pub(crate) fn add_with_accepted(&self, item: T, options: AddOptions) -> bool {
        let mut delay = options.after;
        if options.rate_limited {
            let limited = self.shared.limiter.when(&item);
            self.shared.record(|metrics| metrics.rate_limited(limited));
            if delay.is_zero() || limited < delay {
                delay = limited;
            }
        }
        let retry = options.rate_limited || !options.after.is_zero();
        self.shared
            .add_delayed(item, delay, options.priority, retry)
    }

    /// Tells the rate limiter to stop tracking `item`: its failure count resets.
    ///
    /// Call it when the item was processed successfully. It does not touch the queue. This is
    /// client-go's `Forget`.
    pub fn forget(&self, item: &T) {
        self.shared.limiter.forget(item);
    }

    /// How many times the rate limiter has delayed `item` since it was last forgotten.
    ///
    /// This is client-go's `NumRequeues`.
    pub fn num_requeues(&self, item: &T) -> usize {
        self.shared.limiter.num_requeues(item)
    }

    /// The number of items waiting to be handed out now.
    ///
    /// Items waiting for a delay and items being processed (even if re-added) are not
    /// counted. This is client-go's `Len`; like it, the figure is informational, since other
    /// threads may change it at once.
    pub fn len(&self) -> usize {
        let mut inner = self.shared.inner.lock();
        let after = self.shared.promote(&mut inner);
        let len = inner.state.len();
        drop(inner);
        after.run(&self.shared);
        len
    }

    /// Returns `true` if no item is waiting to be handed out now (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of items waiting for a delay to pass (including delayed re-adds of items
    /// being processed).
    pub fn delayed_len(&self) -> usize {
        let mut inner = self.shared.inner.lock();
        let after = self.shared.promote(&mut inner);
        let len = inner.state.delayed_len();
        drop(inner);
        after.run(&self.shared);
        len
    }

    /// A snapshot of the queue's sizes and in-flight work.
    ///
    /// `unfinished_work` and `longest_running` are measured only on queues that report
    /// metrics (a [name](Builder::name) and a [provider](Builder::metrics)); elsewhere they
    /// are zero.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }

    /// The number of items being processed (leases not yet dropped).
    pub fn processing_len(&self) -> usize {
        self.shared.inner.lock().state.processing()
    }

    /// The number of distinct items the queue holds in any state: queued, delayed or being
    /// processed. Zero means the queue keeps nothing in memory for any item.
    pub fn tracked_len(&self) -> usize {
        self.shared.inner.lock().state.tracked()
    }

    /// Waits for the next item and hands it out under a [`Lease`].
    ///
    /// Returns `None` once the queue is shut down and has nothing left to hand out. Items
    /// come out in the order they became ready (higher priorities first). This is client-go's
    /// `Get`; the returned lease replaces `Done`.
    ///
    /// The future works on any executor (tokio, `futures::executor::block_on`, smol): the
    /// queue wakes it itself.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future before it completes loses no item. If it had been
    /// woken for an item, the wake-up passes to the next waiting getter.
    ///
    /// # Examples
    ///
    /// ```
    /// use workqueue::WorkQueue;
    ///
    /// # futures::executor::block_on(async {
    /// let queue = WorkQueue::new();
    /// queue.add("default/web-0");
    /// let lease = queue.get().await.unwrap();
    /// assert_eq!(*lease, "default/web-0");
    /// # });
    /// ```
    pub fn get(&self) -> Get<'_, T> {
        Get {
            queue: self,
            waiter: None,
        }
    }

    /// Hands out the next item, blocking the thread until there is one.
    ///
    /// Returns `None` once the queue is shut down and has nothing left to hand out.
    ///
    /// # Blocking
    ///
    /// Parks the calling thread; do not call it from async code (use [`get`](Self::get)).
    ///
    /// # Examples
    ///
    /// ```
    /// use workqueue::WorkQueue;
    ///
    /// let queue = WorkQueue::new();
    /// queue.add("default/web-0");
    /// queue.shut_down();
    /// let lease = queue.blocking_get().unwrap(); // queued items are still handed out
    /// assert_eq!(*lease, "default/web-0");
    /// drop(lease);
    /// assert!(queue.blocking_get().is_none());
    /// ```
    pub fn blocking_get(&self) -> Option<Lease<T>> {
        let shared = &self.shared;
        match self.try_get() {
            Ok(lease) => return Some(lease),
            Err(TryGetError::ShutDown) => return None,
            Err(TryGetError::Empty) => {}
        }
        // Spin briefly before parking: under load the next item usually arrives within a few
        // microseconds, and a park/unpark pair costs two system calls. Every getter spins,
        // even beyond the number of cores: measured on 2 cores with 4 producers and 4
        // consumers (BENCH.md's W2), letting only one getter spin halved the throughput,
        // because each add then had to unpark a parked getter, and the backoff's yields
        // give the CPU to the producers anyway.
        let backoff = Backoff::new();
        loop {
            while shared.ready_hint.load(Ordering::Relaxed) == 0 && !backoff.is_completed() {
                backoff.snooze();
            }
            if backoff.is_completed() {
                break;
            }
            match self.try_get() {
                Ok(lease) => return Some(lease),
                Err(TryGetError::ShutDown) => return None,
                Err(TryGetError::Empty) => {}
            }
        }
        let mut inner = shared.inner.lock();
        let mut waiter: Option<u64> = None;
        loop {
            let mut after = shared.promote(&mut inner);
            if let Some(id) = waiter.take() {
                inner.waiters.cancel(id);
            }
            let outcome = shared.pop_locked(&mut inner, &mut after);
            match outcome {
                Some(Ok(lease)) => {
                    drop(inner);
                    after.run(shared);
                    return Some(lease);
                }
                Some(Err(())) => {
                    drop(inner);
                    after.run(shared);
                    return None;
                }
                None => {}
            }
            waiter = Some(
                inner
                    .waiters
                    .register(Signal::Thread(sync::thread::current())),
            );
            sync::unlocked(&mut inner, || {
                after.run(shared);
                sync::thread::park();
            });
        }
    }

    /// Hands out the next item if one is ready now.
    ///
    /// # Errors
    ///
    /// [`TryGetError::Empty`] if no item is ready, [`TryGetError::ShutDown`] if the queue is
    /// shut down and has nothing left to hand out.
    ///
    /// # Examples
    ///
    /// ```
    /// use workqueue::{TryGetError, WorkQueue};
    ///
    /// let queue: WorkQueue<&str> = WorkQueue::new();
    /// assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
    /// queue.shut_down();
    /// assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    /// ```
    #[inline]
    pub fn try_get(&self) -> Result<Lease<T>, TryGetError> {
        let mut inner = self.shared.inner.lock();
        let mut after = self.shared.promote(&mut inner);
        let outcome = self.shared.pop_locked(&mut inner, &mut after);
        drop(inner);
        after.run(&self.shared);
        match outcome {
            Some(Ok(lease)) => Ok(lease),
            Some(Err(())) => Err(TryGetError::ShutDown),
            None => Err(TryGetError::Empty),
        }
    }

    /// Shuts the queue down: new adds are ignored from now on, waiting getters wake, and items
    /// waiting for a delay are dropped. Items already queued are still handed out; then `get`
    /// returns `None`. Does not wait for items being processed (see
    /// [`shut_down_with_drain`](Self::shut_down_with_drain)). Calling it again is harmless;
    /// it also ends a drain that is in progress.
    ///
    /// This is client-go's `ShutDown`.
    pub fn shut_down(&self) {
        drop(self.shared.shut_down(false, false));
    }

    /// Shuts the queue down, then waits until no item is being processed.
    ///
    /// Everything [`shut_down`](Self::shut_down) does happens when this is called, not when
    /// the future is first polled. The future completes once the last lease is dropped (a
    /// lease re-queued by its drop keeps being handed out as usual), or when a plain
    /// `shut_down` cuts the drain short. This is client-go's `ShutDownWithDrain`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops waiting; the queue stays shut down.
    pub fn shut_down_with_drain(&self) -> Drain<'_, T> {
        drop(self.shared.shut_down(true, false));
        Drain {
            queue: self,
            waiter: None,
        }
    }

    /// Shuts the queue down, then blocks until no item is being processed (see
    /// [`shut_down_with_drain`](Self::shut_down_with_drain)).
    ///
    /// # Blocking
    ///
    /// Parks the calling thread until the last lease is dropped. Every worker must drop its
    /// lease, or this never returns; a plain [`shut_down`](Self::shut_down) from another
    /// thread cuts it short.
    pub fn blocking_shut_down_with_drain(&self) {
        let shared = &self.shared;
        drop(shared.shut_down(true, false));
        let mut inner = shared.inner.lock();
        let mut waiter: Option<u64> = None;
        loop {
            if let Some(id) = waiter.take() {
                inner.drain_waiters.cancel(id);
            }
            if inner.state.processing() == 0 || !inner.drain {
                return;
            }
            waiter = Some(
                inner
                    .drain_waiters
                    .register(Signal::Thread(sync::thread::current())),
            );
            sync::unlocked(&mut inner, sync::thread::park);
        }
    }

    /// Returns `true` once the queue has been shut down. This is client-go's `ShuttingDown`.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.inner.lock().state.is_shutting_down()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Shared<T> {
    /// Nanoseconds since the epoch on the queue's clock.
    #[inline]
    fn now_ns(&self) -> u64 {
        let elapsed = self.clock.now().saturating_duration_since(self.epoch);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The time for metrics timestamps: read only when the queue reports metrics.
    #[inline]
    fn metrics_now(&self) -> u64 {
        if self.metrics.is_some() {
            self.now_ns()
        } else {
            0
        }
    }

    /// Moves due delayed items to the ready queue; returns the waiters to wake and the
    /// metrics to record for them, once the lock is released.
    #[inline]
    fn promote(&self, inner: &mut Inner<T>) -> After<T> {
        if inner.state.delayed_len() == 0 {
            return After::default();
        }
        self.promote_at(inner, self.now_ns())
    }

    fn promote_at(&self, inner: &mut Inner<T>, now: u64) -> After<T> {
        let promoted = inner.state.promote(now);
        let mut after = After {
            adds: promoted.counted,
            ..After::default()
        };
        if promoted.ready > 0 {
            self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
            after.wake = inner.waiters.take(promoted.ready);
        }
        after
    }

    /// Reports to the queue's metrics, if it has any. Never called with the queue's lock
    /// held (DESIGN.md: release, then record), so a recorder may read the queue. A panic in
    /// the user's recorder is contained and logged: it must not leave the queue's state
    /// half-applied (a lease never built, a drain never woken) or abort a worker that is
    /// already unwinding.
    #[inline]
    fn record(&self, report: impl FnOnce(&dyn QueueMetrics)) {
        if let Some(metrics) = &self.metrics
            && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report(&**metrics)))
                .is_err()
        {
            tracing::error!(
                queue = self.name.as_deref().unwrap_or(""),
                "workqueue: the metrics recorder panicked; the event was dropped"
            );
        }
    }

    /// The stats, promoting due items first (what [`WorkQueue::stats`] returns).
    fn stats(&self) -> QueueStats {
        let mut inner = self.inner.lock();
        let after = self.promote(&mut inner);
        let stats = self.stats_locked(&inner);
        drop(inner);
        after.run(self);
        stats
    }

    /// The stats as they stand, without promoting: what a [`QueueProbe`] reads, so that a
    /// scrape never calls the metrics recorder back (items that are due but not yet promoted
    /// count as delayed).
    fn probe_stats(&self) -> QueueStats {
        self.stats_locked(&self.inner.lock())
    }

    fn stats_locked(&self, inner: &Inner<T>) -> QueueStats {
        let (processing, unfinished, longest) = inner.state.in_flight(self.now_ns());
        QueueStats {
            len: inner.state.len(),
            delayed: inner.state.delayed_len(),
            processing,
            unfinished_work: nanos_to_duration(unfinished),
            longest_running: Duration::from_nanos(longest),
        }
    }

    /// Pops an item under the lock: `Some(Ok)` with a lease, `Some(Err)` if shut down and
    /// empty, `None` if nothing is ready. The get's metric goes in `after`.
    #[inline]
    fn pop_locked(
        self: &Arc<Self>,
        inner: &mut Inner<T>,
        after: &mut After<T>,
    ) -> Option<Result<Lease<T>, ()>> {
        match inner.state.pop(self.metrics_now()) {
            Some(popped) => {
                self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
                after.got = popped.queued_for;
                Some(Ok(Lease::new(
                    self.clone(),
                    popped.item,
                    popped.slot,
                    popped.priority,
                )))
            }
            None if inner.state.is_shutting_down() => Some(Err(())),
            None => None,
        }
    }

    /// Adds `item` now; returns `false` if the queue is shut down and refused it. `retry`
    /// counts it in the retries metric.
    #[inline]
    pub(crate) fn add_now(&self, item: T, priority: Option<i32>, retry: bool) -> bool {
        let hash = item_hash(&self.hasher, &item);
        let mut inner = self.inner.lock();
        let mut after = self.promote(&mut inner);
        let accepted = !inner.state.is_shutting_down();
        let (added, unused) = inner
            .state
            .add_hashed(item, hash, priority, self.metrics_now());
        after.retry = retry && accepted;
        after.adds += usize::from(added.counted);
        after.unused = unused;
        if added.ready {
            self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
            if !inner.waiters.is_empty() {
                after.wake = std::mem::take(&mut after.wake).merge(inner.waiters.take_one());
            }
        }
        drop(inner);
        after.run(self);
        accepted
    }

    /// Adds `item` after `delay`; returns `false` if the queue is shut down and refused it.
    /// `retry` counts it in the retries metric (client-go counts every `AddAfter`, even with
    /// a zero delay).
    fn add_delayed(
        self: &Arc<Self>,
        item: T,
        delay: Duration,
        priority: Option<i32>,
        retry: bool,
    ) -> bool {
        if delay.is_zero() {
            return self.add_now(item, priority, retry);
        }
        let hash = item_hash(&self.hasher, &item);
        let mut inner = self.inner.lock();
        if inner.state.is_shutting_down() {
            drop(inner);
            drop(item);
            return false;
        }
        let now = self.now_ns();
        let at = now.saturating_add(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX));
        let mut after = After::default();
        if inner.state.delayed_len() > 0 {
            after = self.promote_at(&mut inner, now);
        }
        after.retry = retry;
        let (added, unused): (Added, _) = inner.state.add_at_hashed(item, hash, at, priority);
        after.unused = unused;
        let mut notify_timer = false;
        if added.new_head && !self.clock_driven {
            if inner.timer.thread.is_none() {
                self.start_timer(&mut inner);
            } else if at < inner.timer.sleeping_until {
                notify_timer = true;
            }
        }
        drop(inner);
        if notify_timer {
            self.timer_cv.notify_one();
        }
        after.run(self);
        true
    }

    /// Drops a lease: client-go's `Done`. Due items are promoted first, as by every other
    /// call, so an item re-queued here goes behind them.
    #[inline]
    pub(crate) fn done(&self, slot: u32) {
        let mut inner = self.inner.lock();
        let mut after = self.promote(&mut inner);
        let done = inner.state.done(slot, self.metrics_now());
        after.worked = done.worked_for;
        if done.requeued {
            self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
            after.wake = std::mem::take(&mut after.wake).merge(inner.waiters.take_one());
        }
        if inner.state.processing() == 0 && inner.drain {
            after.wake = std::mem::take(&mut after.wake).merge(inner.drain_waiters.take_all());
        }
        // The queue's copy of an item it no longer tracks is freed outside the lock.
        after.unused = done.removed;
        drop(inner);
        after.run(self);
    }

    /// Shuts the queue down; returns the delayed items it dropped (see [`State::shut_down`]
    /// for `clone_processing`), which the caller drops or keeps, outside the lock.
    fn shut_down(&self, drain: bool, clone_processing: bool) -> Vec<T> {
        let mut inner = self.inner.lock();
        let dropped = inner.state.shut_down(clone_processing);
        inner.drain = drain;
        let mut wake = inner.waiters.take_all();
        if !drain {
            wake = wake.merge(inner.drain_waiters.take_all());
        }
        let thread = inner.timer.thread.take();
        self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
        drop(inner);
        self.timer_cv.notify_all();
        wake.wake();
        join_unless_current(thread);
        dropped
    }

    /// Called by a driving clock (a [`FakeClock`](crate::clock::FakeClock)) after it moved.
    fn on_clock_advance(&self) {
        let mut inner = self.inner.lock();
        let after = self.promote(&mut inner);
        drop(inner);
        after.run(self);
    }

    fn start_timer(self: &Arc<Self>, inner: &mut Inner<T>) {
        let weak = Arc::downgrade(self);
        let name = match &self.name {
            Some(name) => format!("workqueue-timer-{name}"),
            None => "workqueue-timer".to_owned(),
        };
        inner.timer.sleeping_until = u64::MAX;
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || timer_loop(weak));
        // Without the thread, getters waiting for a delayed item would never be woken: fail
        // loudly rather than hang quietly.
        match spawned {
            Ok(handle) => inner.timer.thread = Some(handle),
            Err(err) => panic!("workqueue: cannot start the delay timer thread: {err}"),
        }
    }
}

/// What a call decided under the lock and does once it is released: wake waiters, report
/// metrics, drop an item the queue did not keep (user code all three: a waker, a
/// recorder, `T`'s `Drop`, none of which may run under the queue's lock).
pub(crate) struct After<T> {
    /// Waiters to wake.
    wake: Wakeups,
    /// Items that became dirty: the adds metric.
    adds: usize,
    /// Count one retry.
    retry: bool,
    /// An item was handed out after waiting this long (nanoseconds).
    got: Option<u64>,
    /// An item was done after being processed this long (nanoseconds).
    worked: Option<u64>,
    /// An item given to an add and not kept, or an item the queue stopped tracking.
    unused: Option<T>,
}

impl<T> Default for After<T> {
    fn default() -> Self {
        Self {
            wake: Wakeups::None,
            adds: 0,
            retry: false,
            got: None,
            worked: None,
            unused: None,
        }
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> After<T> {
    /// Records the metrics, wakes the waiters and drops the unused item; call it without the
    /// queue's lock. Metrics come first, so a woken getter sees them recorded.
    #[inline]
    fn run(self, shared: &Shared<T>) {
        let After {
            wake,
            adds,
            retry,
            got,
            worked,
            unused,
        } = self;
        if shared.metrics.is_some() && (adds > 0 || retry || got.is_some() || worked.is_some()) {
            shared.record(|metrics| {
                if retry {
                    metrics.retry();
                }
                (0..adds).for_each(|_| metrics.add());
                if let Some(waited) = got {
                    metrics.get(Duration::from_nanos(waited));
                }
                if let Some(worked) = worked {
                    metrics.done(Duration::from_nanos(worked));
                }
            });
        }
        drop(unused);
        wake.wake();
    }
}

/// The delay timer: sleeps until the earliest delayed item is due, promotes it and wakes
/// getters. One per queue, started by the first delayed add, ended by shut down or when the
/// last handle drops.
///
/// A panic in user code it runs (a clock's `now`, a waker, a metrics recorder's panic is
/// contained already) would end the thread and leave getters of delayed items waiting
/// forever: it is caught and logged, and the loop starts again after a short pause (so that
/// a clock that always panics does not spin a core).
fn timer_loop<T: Eq + Hash + Clone + Send + Sync + 'static>(weak: Weak<Shared<T>>) {
    let Some(shared) = weak.upgrade() else {
        return;
    };
    drop(weak);
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer_run(&shared))) {
            Ok(()) => return,
            Err(_) => {
                tracing::error!(
                    queue = shared.name.as_deref().unwrap_or(""),
                    "workqueue: a clock or waker panicked on the delay timer thread; \
                     the timer goes on"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The body of [`timer_loop`]; returns when the timer should end.
fn timer_run<T: Eq + Hash + Clone + Send + Sync + 'static>(shared: &Shared<T>) {
    let mut inner = shared.inner.lock();
    loop {
        if inner.state.is_shutting_down() || shared.handles.load(Ordering::Acquire) == 0 {
            return;
        }
        let after = shared.promote(&mut inner);
        if !after.is_idle() {
            sync::unlocked(&mut inner, || after.run(shared));
            continue;
        }
        match inner.state.next_deadline() {
            None => {
                inner.timer.sleeping_until = u64::MAX;
                shared.timer_cv.wait(&mut inner);
            }
            Some(at) => {
                inner.timer.sleeping_until = at;
                let now = shared.now_ns();
                if at > now {
                    sync::wait_for(&shared.timer_cv, &mut inner, Duration::from_nanos(at - now));
                }
            }
        }
    }
}

impl<T> After<T> {
    /// Nothing to do after the lock.
    fn is_idle(&self) -> bool {
        matches!(self.wake, Wakeups::None) && self.adds == 0
    }
}

/// The future of [`WorkQueue::get`].
#[must_use = "futures do nothing unless polled"]
pub struct Get<'a, T> {
    queue: &'a WorkQueue<T>,
    /// Our id in the waiter list while registered.
    waiter: Option<u64>,
}

impl<T> fmt::Debug for Get<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Get")
            .field("waiting", &self.waiter.is_some())
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Future for Get<'_, T> {
    type Output = Option<Lease<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = &self.queue.shared;
        let mut inner = shared.inner.lock();
        let mut after = shared.promote(&mut inner);
        let outcome = shared.pop_locked(&mut inner, &mut after);
        let result = match outcome {
            Some(done) => {
                if let Some(id) = self.waiter.take() {
                    inner.waiters.cancel(id);
                }
                Poll::Ready(done.ok())
            }
            None => {
                let registered = match self.waiter {
                    Some(id) => inner.waiters.update(id, cx.waker()),
                    None => false,
                };
                if !registered {
                    let id = inner.waiters.register(Signal::Task(cx.waker().clone()));
                    self.waiter = Some(id);
                }
                Poll::Pending
            }
        };
        drop(inner);
        after.run(shared);
        result
    }
}

impl<T> Drop for Get<'_, T> {
    fn drop(&mut self) {
        let Some(id) = self.waiter.take() else {
            return;
        };
        let shared = &self.queue.shared;
        let mut inner = shared.inner.lock();
        if inner.waiters.cancel(id) {
            return;
        }
        // We were woken for an item we will never take: pass the wake-up on.
        if inner.state.len() > 0 || inner.state.is_shutting_down() {
            let wake = inner.waiters.take_one();
            drop(inner);
            wake.wake();
        }
    }
}

/// The future of [`WorkQueue::shut_down_with_drain`].
#[must_use = "the queue is already shut down; await this to wait for in-flight items"]
pub struct Drain<'a, T> {
    queue: &'a WorkQueue<T>,
    /// Our id in the drain waiter list while registered.
    waiter: Option<u64>,
}

impl<T> fmt::Debug for Drain<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("waiting", &self.waiter.is_some())
            .finish()
    }
}

impl<T> Future for Drain<'_, T> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = &self.queue.shared;
        let mut inner = shared.inner.lock();
        if inner.state.processing() == 0 || !inner.drain {
            if let Some(id) = self.waiter.take() {
                inner.drain_waiters.cancel(id);
            }
            return Poll::Ready(());
        }
        let registered = match self.waiter {
            Some(id) => inner.drain_waiters.update(id, cx.waker()),
            None => false,
        };
        if !registered {
            let id = inner
                .drain_waiters
                .register(Signal::Task(cx.waker().clone()));
            self.waiter = Some(id);
        }
        Poll::Pending
    }
}

impl<T> Drop for Drain<'_, T> {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.queue.shared.inner.lock().drain_waiters.cancel(id);
        }
    }
}

/// Converts a sum of nanoseconds to a `Duration`, saturating.
fn nanos_to_duration(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    Duration::new(secs, (nanos % 1_000_000_000) as u32)
}
