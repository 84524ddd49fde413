//! [`WorkQueue`], the shared handle around the rules in `State`.
//!
//! No rule of the queue lives here; this module and its children hold the plumbing:
//!
//! - `mod.rs`: the public handle and its methods;
//! - `builder.rs`: [`AddOptions`] and [`Builder`];
//! - `locked.rs`: the one lock protocol every call goes through (`Shared::locked`): take
//!   the lock, move due delayed items to the ready queue (one clock read, only when
//!   something is delayed), act on `State`, release the lock, then wake and record; and
//!   the bookkeeping of the timer thread it starts and joins;
//! - `timer.rs`: the delay timer thread itself;
//! - `futures.rs`: the futures [`Get`] and [`Drain`].

mod builder;
mod futures;
pub(crate) mod locked;
mod timer;

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::Backoff;

pub use builder::{AddOptions, Builder};
pub use futures::{Drain, Get};
use locked::Shared;
use locked::{After, join_unless_current};

use crate::error::TryGetError;
use crate::lease::Lease;
use crate::stats::{FlowStats, GroupStats, QueueStats};
use crate::sync::{self, Ordering};
use crate::waiters::Signal;

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

impl<T> fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Read under the lock, written after it: the formatter is the caller's code.
        let (len, delayed, processing, shutting_down) = self.shared.peek(|inner| {
            let state = &inner.state;
            let stopping = state.is_shutting_down();
            (
                state.len(),
                state.delayed_len(),
                state.processing(),
                stopping,
            )
        });
        f.debug_struct("WorkQueue")
            .field("name", &self.shared.name)
            .field("len", &len)
            .field("delayed", &delayed)
            .field("processing", &processing)
            .field("shutting_down", &shutting_down)
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> WorkQueue<T> {
    /// Creates a queue on the real clock with [`rate_limiter::default_controller`](crate::rate_limiter::default_controller), no name
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
            flow: crate::flow::FlowControl::new(),
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
    /// use workq::WorkQueue;
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
    /// use workq::{WorkQueue, clock::FakeClock};
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
    /// use workq::{WorkQueue, clock::FakeClock, rate_limiter::ExponentialFailure};
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
    /// use workq::{AddOptions, WorkQueue, clock::FakeClock};
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
        self.shared
            .locked(|inner, _| (inner.state.len(), After::NONE))
    }

    /// Returns `true` if no item is waiting to be handed out now (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of items waiting for a delay to pass (including delayed re-adds of items
    /// being processed).
    pub fn delayed_len(&self) -> usize {
        self.shared
            .locked(|inner, _| (inner.state.delayed_len(), After::NONE))
    }

    /// A snapshot of the queue's sizes and in-flight work.
    ///
    /// `unfinished_work` and `longest_running` are measured only on queues that report
    /// metrics (a [name](Builder::name) and a [provider](Builder::metrics)); elsewhere they
    /// are zero.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }

    /// Client-go's depth (the `workqueue_depth` gauge: items queued, and items re-added
    /// while processed) by priority, highest first: each item at the priority it is queued
    /// at, or will be queued at when its lease drops. Due delayed items are counted once
    /// promoted (by any call). It walks every item the queue tracks, under its lock: for a
    /// scrape, not for a hot path.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::{AddOptions, WorkQueue};
    ///
    /// let queue = WorkQueue::new();
    /// queue.add_with("listed-0", AddOptions::default().priority(-100));
    /// queue.add_with("listed-1", AddOptions::default().priority(-100));
    /// queue.add("changed");
    /// assert_eq!(queue.depth_by_priority(), [(0, 1), (-100, 2)]);
    /// ```
    pub fn depth_by_priority(&self) -> Vec<(i32, usize)> {
        self.shared.depth_by_priority()
    }

    /// Flow control at a glance: groups with ready items, groups at their limit, groups
    /// kept. `None` on a queue without flow control (no [`group_by`](Builder::group_by),
    /// limit or hand-out rate). It walks the groups under the queue's lock: for a scrape.
    pub fn flow_stats(&self) -> Option<FlowStats> {
        self.shared
            .peek(|inner| inner.state.flow().map(|flow| flow.stats()))
    }

    /// The `top` groups with the most ready items (ties: most in flight, then by name), with
    /// their ready items, leases out and limit: the per-group figures, bounded so that a
    /// queue with a million groups reports a few. Empty on a queue without flow control.
    /// It walks the groups under the queue's lock: for a scrape.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::WorkQueue;
    ///
    /// let queue: WorkQueue<String> = WorkQueue::builder()
    ///     .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
    ///     .max_in_flight_per_group(1)
    ///     .build();
    /// queue.add("a/1".to_owned());
    /// queue.add("a/2".to_owned());
    /// queue.add("b/1".to_owned());
    /// let lease = queue.try_get().unwrap();
    /// let top = queue.top_groups(1);
    /// assert_eq!((top[0].name.as_str(), top[0].ready, top[0].in_flight), ("a", 1, 1));
    /// assert_eq!(queue.flow_stats().unwrap().groups_saturated, 1);
    /// # drop(lease);
    /// ```
    pub fn top_groups(&self, top: usize) -> Vec<GroupStats> {
        self.shared.peek(|inner| {
            inner
                .state
                .flow()
                .map(|flow| flow.top_groups(top))
                .unwrap_or_default()
        })
    }

    /// The number of items being processed (leases not yet dropped).
    pub fn processing_len(&self) -> usize {
        self.shared.peek(|inner| inner.state.processing())
    }

    /// The number of distinct items the queue holds in any state: queued, delayed or being
    /// processed. Zero means the queue keeps nothing in memory for any item.
    pub fn tracked_len(&self) -> usize {
        self.shared.peek(|inner| inner.state.tracked())
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
    /// use workq::WorkQueue;
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
    /// use workq::WorkQueue;
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
        // consumers (W2 of docs/bench-workloads.md), letting only one getter spin halved the
        // throughput, because each add then had to unpark a parked getter, and the backoff's
        // yields give the CPU to the producers anyway.
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
        // Each round goes through the lock protocol: promote, cancel the last registration,
        // pop, or register to be unparked; then unlock, wake and record, and park.
        let mut waiter: Option<u64> = None;
        loop {
            let outcome = shared.locked(|inner, _| {
                if let Some(id) = waiter.take() {
                    inner.waiters.cancel(id);
                }
                let popped = shared.pop_locked(inner);
                if popped.0.as_ref().is_err_and(TryGetError::is_empty) {
                    waiter = Some(
                        inner
                            .waiters
                            .register(Signal::Thread(sync::thread::current())),
                    );
                }
                popped
            });
            match outcome {
                Ok(popped) => return Some(Lease::new(shared.clone(), popped)),
                Err(TryGetError::ShutDown) => return None,
                Err(TryGetError::Empty) => sync::thread::park(),
            }
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
    /// use workq::{TryGetError, WorkQueue};
    ///
    /// let queue: WorkQueue<&str> = WorkQueue::new();
    /// assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
    /// queue.shut_down();
    /// assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    /// ```
    #[inline]
    pub fn try_get(&self) -> Result<Lease<T>, TryGetError> {
        self.shared
            .locked(|inner, _| self.shared.pop_locked(inner))
            .map(|popped| Lease::new(self.shared.clone(), popped))
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
        self.shared.peek(|inner| inner.state.is_shutting_down())
    }
}
