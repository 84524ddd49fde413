//! The one lock protocol: every call locks, promotes due items, acts, unlocks, then wakes
//! and records.

use std::hash::Hash;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::error::TryGetError;
use crate::metrics::QueueMetrics;
use crate::rate_limiter::RateLimiter;
use crate::state::{Added, Popped, State, current_link, item_hash};
use crate::stats::QueueStats;
use crate::sync::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};
use crate::waiters::{Waiters, Wakeups};

/// Everything behind the lock.
pub(crate) struct Inner<T> {
    /// The rules.
    pub(crate) state: State<T>,
    /// Getters waiting for an item.
    pub(super) waiters: Waiters,
    /// A drain is in progress; cleared by a plain shut down (client-go's `drain`).
    pub(super) drain: bool,
    /// Callers of a drain waiting for the last lease.
    pub(super) drain_waiters: Waiters,
    /// The delay timer thread.
    pub(super) timer: TimerState,
}

/// State of the background thread that wakes getters when delayed items come due.
#[derive(Default)]
pub(super) struct TimerState {
    /// The thread, once started; taken and joined on shut down or when the last handle drops.
    pub(super) thread: Option<JoinHandle<()>>,
    /// The deadline the thread sleeps until (nanoseconds since the epoch); `u64::MAX` when it
    /// sleeps with nothing delayed. An add with an earlier deadline wakes it.
    pub(super) sleeping_until: u64,
}

/// Joins the timer thread, unless this is the timer thread: a waker it calls may drop the
/// last handle (an executor dropping a woken task), and a thread cannot join itself. The
/// timer loop returns by itself once it sees the queue shut down or without handles.
pub(super) fn join_unless_current(thread: Option<JoinHandle<()>>) {
    if let Some(thread) = thread
        && thread.thread().id() != std::thread::current().id()
    {
        let _ = thread.join();
    }
}

/// What every handle, lease and the timer thread share.
pub(crate) struct Shared<T> {
    /// The state and the waiters.
    pub(super) inner: Mutex<Inner<T>>,
    /// A copy of `state.len()`, written under the lock, read without it by getters that spin
    /// briefly before parking.
    pub(super) ready_hint: AtomicUsize,
    /// Live `WorkQueue` handles; the timer thread ends when this reaches 0.
    pub(super) handles: AtomicUsize,
    /// Wakes the timer thread.
    pub(super) timer_cv: Condvar,
    /// The queue's clock.
    pub(super) clock: Arc<dyn Clock>,
    /// The clock calls us when it advances: no timer thread is needed.
    pub(super) clock_driven: bool,
    /// Time zero for the nanosecond timestamps in `state`.
    pub(super) epoch: Instant,
    /// Delays for `add_rate_limited`.
    pub(super) limiter: Box<dyn RateLimiter<T>>,
    /// A copy of the state's hasher: items are hashed before the lock is taken.
    pub(super) hasher: foldhash::fast::RandomState,
    /// The queue's name, if any.
    pub(super) name: Option<String>,
    /// Where a named queue with a metrics provider reports; `None` records nothing.
    pub(super) metrics: Option<Box<dyn QueueMetrics>>,
    /// Keeps the callback a driving clock holds weakly alive.
    pub(super) _clock_callback: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The group of an item ([`Builder::group_by`](super::Builder::group_by)), called
    /// before the lock is taken.
    pub(super) grouper: Option<Grouper<T>>,
    /// The queue has flow control (groups, limits or rates).
    pub(super) flow: bool,
    /// The queue has hand-out rates: its timer also serves tokens, and outlives a shut down
    /// while items wait for them.
    pub(super) rates: bool,
}

/// A queue's group function.
pub(super) type Grouper<T> = crate::flow::GroupFn<T>;

// The protocol needs no bounds on `T`: dropping a `Lease` (which has none) goes through it.
impl<T> Shared<T> {
    /// The one lock protocol. Takes the lock, moves due delayed items to the ready queue
    /// (one clock read, only when something is delayed), runs `act`, releases the lock, then
    /// runs the [`After`] that `act` returned with its result: record the metrics, free the
    /// item the queue did not keep, wake the waiters. User code (wakers, recorders, `T`'s
    /// `Drop`) never runs under the lock.
    ///
    /// `act` gets the time read for the promotion, if one was read, so that a call that needs
    /// the time reads the clock once.
    ///
    /// The protocol sits on every call, so its shape is chosen for the common call (an add,
    /// a get, a done, with nothing delayed and nobody waiting): `act` returns its [`After`]
    /// rather than filling one in, so that none is alive while `act` runs user code (`T`'s
    /// `Eq`, `Hash`, `Clone`) and the compiler keeps it in registers; the waiters to wake
    /// are a count, taken from the lists once `act` is done, out of line; and a call that
    /// promoted something finishes out of line too.
    #[inline]
    pub(super) fn locked<R>(
        &self,
        act: impl FnOnce(&mut Inner<T>, Option<u64>) -> (R, After<T>),
    ) -> R {
        self.locked_with((), |inner, (), now| act(inner, now))
    }

    /// [`locked`](Self::locked), handing `input` to `act`: what `act` consumes (the item to
    /// add). Passed beside `act` rather than captured by it, so that `act` holds only plain
    /// values: a capture that needs dropping would make the compiler keep all of `act`'s
    /// captures in memory, for the unwinding paths of the calls made before `act` runs.
    #[inline]
    pub(super) fn locked_with<I, R>(
        &self,
        input: I,
        act: impl FnOnce(&mut Inner<T>, I, Option<u64>) -> (R, After<T>),
    ) -> R {
        let mut inner = self.inner.lock();
        let promoted = self.promote(&mut inner);
        let now = promoted.as_ref().map(|&(now, _)| now);
        let (result, after) = act(&mut inner, input, now);
        match promoted {
            None => after.finish(self, inner),
            Some((_, promoted)) => after.finish_promoted(self, inner, promoted),
        }
        result
    }

    /// Nanoseconds since the epoch on the queue's clock.
    #[inline]
    pub(super) fn now_ns(&self) -> u64 {
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

    /// Moves due delayed items to the ready queue. If something is delayed, returns the time
    /// it read and what to do once the lock is released (the waiters to wake, the metrics to
    /// record); `None` if nothing is delayed (no clock read).
    #[inline]
    pub(super) fn promote(&self, inner: &mut Inner<T>) -> Option<(u64, Promoted)> {
        if !inner.state.needs_promote() {
            return None;
        }
        Some(self.promote_due(inner))
    }

    /// [`promote`](Self::promote) once something is delayed: kept out of line so that the
    /// check above stays small in every call.
    #[inline(never)]
    fn promote_due(&self, inner: &mut Inner<T>) -> (u64, Promoted) {
        let now = self.now_ns();
        let promoted = inner.state.promote(now);
        let mut wake = Wakeups::None;
        if promoted.ready > 0 {
            self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
            wake = inner.waiters.take(promoted.ready);
        }
        let promoted = Promoted {
            adds: promoted.counted,
            wake,
        };
        (now, promoted)
    }

    /// Reports to the queue's metrics, if it has any. Never called with the queue's lock
    /// held (docs/design.md: release, then record), so a recorder may read the queue. A panic in
    /// the user's recorder is contained and logged: it must not leave the queue's state
    /// half-applied (a lease never built, a drain never woken) or abort a worker that is
    /// already unwinding.
    #[inline]
    pub(super) fn record(&self, report: impl FnOnce(&dyn QueueMetrics)) {
        if let Some(metrics) = &self.metrics
            && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report(&**metrics)))
                .is_err()
        {
            tracing::error!(
                queue = self.name.as_deref().unwrap_or(""),
                "workq: the metrics recorder panicked; the event was dropped"
            );
        }
    }

    /// Drops a lease: client-go's `Done`. Due items are promoted first, as by every other
    /// call, so an item re-queued here goes behind them.
    #[inline]
    pub(crate) fn done(&self, slot: u32) {
        self.locked(move |inner, _| ((), self.done_locked(inner, slot)));
    }

    /// The done itself, under the lock: what [`done`](Self::done) does once it holds it.
    #[inline(always)]
    fn done_locked(&self, inner: &mut Inner<T>, slot: u32) -> After<T> {
        self.end_locked(inner, slot, false)
    }

    /// [`done_locked`](Self::done_locked); an item re-added while processing is queued
    /// again at the head of its lane if `at_head`.
    #[inline(always)]
    fn end_locked(&self, inner: &mut Inner<T>, slot: u32, at_head: bool) -> After<T> {
        let done = inner.state.end(slot, self.metrics_now(), at_head);
        // The queue's copy of an item it no longer tracks is freed outside the lock.
        let mut after = After::new(done.removed);
        if done.requeued || (self.flow && inner.state.len() > 0) {
            // With flow control, a done frees a slot: a getter held back by a limit may
            // hand out now.
            self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
            after.wake = usize::from(!inner.waiters.is_empty());
        }
        after.wake_drain = inner.state.processing() == 0 && inner.drain;
        after.worked = done.worked_for;
        after
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Shared<T> {
    /// Puts the links a lease took back on its item, which the lease still holds.
    #[cfg(feature = "otel")]
    pub(crate) fn restore_links(&self, slot: u32, links: Box<crate::otel::Links>) {
        self.locked(move |inner, _| {
            inner.state.restore_links(slot, links);
            ((), After::NONE)
        });
    }

    /// The stats, promoting due items first (what [`WorkQueue::stats`](super::WorkQueue::stats)
    /// returns).
    pub(super) fn stats(&self) -> QueueStats {
        self.locked(|inner, _| (self.stats_locked(inner), After::NONE))
    }

    /// The stats as they stand, without promoting: what a [`QueueProbe`](crate::metrics::QueueProbe)
    /// reads, so that a scrape never calls the metrics recorder back (items that are due but
    /// not yet promoted count as delayed).
    pub(super) fn probe_stats(&self) -> QueueStats {
        self.peek(|inner| self.stats_locked(inner))
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

    /// Pops an item under the lock: the item with its slot and priority, or why there is
    /// none; and the get's metric, for after the lock. The caller makes the lease (once the
    /// lock is released): the lock protocol knows nothing of leases.
    #[inline]
    pub(super) fn pop_locked(
        &self,
        inner: &mut Inner<T>,
    ) -> (Result<Popped<T>, TryGetError>, After<T>) {
        if self.flow {
            return self.pop_flow_locked(inner);
        }
        match inner.state.pop(self.metrics_now()) {
            Some(popped) => {
                self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
                let mut after = After::NONE;
                after.got = popped.queued_for;
                (Ok(popped), after)
            }
            None if inner.state.is_shutting_down() => (Err(TryGetError::ShutDown), After::NONE),
            None => (Err(TryGetError::Empty), After::NONE),
        }
    }

    /// [`pop_locked`](Self::pop_locked) with flow control. Items may be queued and still not
    /// be handed out (a limit, a token): that is `Empty`, also after shut down, until they
    /// are. A hand-out that leaves items queued wakes one more getter, which tries in turn:
    /// whether they may be handed out depends on limits and tokens no add or done reports.
    /// A getter held back by a token tells the timer when it is due.
    #[inline(never)]
    fn pop_flow_locked(&self, inner: &mut Inner<T>) -> (Result<Popped<T>, TryGetError>, After<T>) {
        let now = self.now_ns();
        match inner.state.pop(now) {
            Some(popped) => {
                self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
                let mut after = After::NONE;
                after.got = popped.queued_for;
                after.wake = usize::from(inner.state.len() > 0 && !inner.waiters.is_empty());
                (Ok(popped), after)
            }
            None if inner.state.is_shutting_down() && inner.state.len() == 0 => {
                (Err(TryGetError::ShutDown), After::NONE)
            }
            None => {
                // Nothing may be handed out now: getters spinning on the hint park instead.
                self.ready_hint.store(0, Ordering::Relaxed);
                let mut after = After::NONE;
                if let Some(at) = inner.state.next_deadline()
                    && !self.clock_driven
                    && at < inner.timer.sleeping_until
                {
                    after.notify_timer = true;
                }
                (Err(TryGetError::Empty), after)
            }
        }
    }

    /// Marks the lease in `slot` done, then pops the next ready item, in one lock round
    /// instead of two: a worker loop's step from one item to the next
    /// ([`Queue::done_and_next`](crate::Queue::done_and_next)), whose lease the caller makes.
    /// `None` if nothing is ready, and once the queue is shut down: the items still queued
    /// then are for `get`, as on the shared backends, whose shut-down handles hand nothing
    /// out with a done (a worker pool that stopped its queue takes no more work).
    pub(crate) fn done_then_pop(&self, slot: u32) -> Option<Popped<T>> {
        self.locked(move |inner, _| {
            let mut after = self.done_locked(inner, slot);
            if inner.state.is_shutting_down() {
                return (None, after);
            }
            let (popped, got) = self.pop_locked(inner);
            if popped.is_ok() {
                // Ready items are one fewer than the done left: if it queued its item again,
                // this call took an item in its place, and there is nobody new to wake; and
                // a lease is out again, so a drain is not over.
                after.wake = 0;
                after.wake_drain = false;
                after.got = got.got;
            }
            (popped.ok(), after)
        })
    }

    /// Adds `item` now; returns `false` if the queue is shut down and refused it. `retry`
    /// counts it in the retries metric.
    #[inline]
    pub(crate) fn add_now(&self, item: T, priority: Option<i32>, retry: bool) -> bool {
        if self.flow {
            return self.add_grouped(item, priority, retry);
        }
        let hash = item_hash(&self.hasher, &item);
        let link = current_link();
        self.locked_with(item, move |inner, item, _| {
            let accepted = !inner.state.is_shutting_down();
            let (added, unused) =
                inner
                    .state
                    .add_hashed(item, hash, priority, self.metrics_now(), link);
            let mut after = After::new(unused);
            if added.ready {
                self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
                after.wake = usize::from(!inner.waiters.is_empty());
            }
            after.adds = usize::from(added.counted);
            after.retry = retry && accepted;
            (accepted, after)
        })
    }

    /// Hands the lease in `slot` back unprocessed, in one round of the lock: its item (a
    /// clone of it) is re-added with `priority`, the one it was handed out with, and queued
    /// again at once at the head of its priority, where it was taken from, so that items
    /// added after it do not start before it (a re-add while it was held may raise the
    /// priority; a delayed one is dropped, the item being ready now). `false` if the queue is
    /// shut down and refused the re-add: the lease is then not ended here.
    pub(crate) fn release(&self, slot: u32, item: T, priority: i32) -> bool {
        let hash = item_hash(&self.hasher, &item);
        let link = current_link();
        self.locked_with(item, move |inner, item, _| {
            if inner.state.is_shutting_down() {
                return (false, After::new(Some(item)));
            }
            let (added, unused) =
                inner
                    .state
                    .add_hashed(item, hash, Some(priority), self.metrics_now(), link);
            let mut after = self.end_locked(inner, slot, true);
            debug_assert!(after.unused.is_none(), "a released item stays queued");
            after.unused = unused;
            after.adds = usize::from(added.counted);
            (true, after)
        })
    }

    /// Adds `item` after `delay`; returns `false` if the queue is shut down and refused it.
    /// `retry` counts it in the retries metric (client-go counts every `AddAfter`, even with
    /// a zero delay).
    pub(super) fn add_delayed(
        self: &Arc<Self>,
        item: T,
        delay: Duration,
        priority: Option<i32>,
        retry: bool,
    ) -> bool {
        if delay.is_zero() {
            return self.add_now(item, priority, retry);
        }
        let group = match &self.grouper {
            Some(grouper) if self.flow => Some(grouper(&item)),
            _ => None,
        };
        self.add_after_locked(item, delay, priority, retry, group)
    }

    /// An add on a queue with flow control: the item's group is computed before the lock
    /// is taken (user code), then selected for the add under the lock.
    #[inline(never)]
    fn add_grouped(&self, item: T, priority: Option<i32>, retry: bool) -> bool {
        let group = self.grouper.as_ref().map(|grouper| grouper(&item));
        let hash = item_hash(&self.hasher, &item);
        let link = current_link();
        self.locked_with(item, move |inner, item, now| {
            let accepted = !inner.state.is_shutting_down();
            let now = now.unwrap_or_else(|| self.now_ns());
            if let Some(flow) = inner.state.flow_mut() {
                flow.select(group.as_deref().unwrap_or(""), now);
            }
            let (added, unused) = inner.state.add_hashed(item, hash, priority, now, link);
            let mut after = After::new(unused);
            if added.ready {
                self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
                after.wake = usize::from(!inner.waiters.is_empty());
            }
            after.adds = usize::from(added.counted);
            after.retry = retry && accepted;
            (accepted, after)
        })
    }

    /// A delayed add under the lock; `group` is the item's group on a grouped queue.
    fn add_after_locked(
        self: &Arc<Self>,
        item: T,
        delay: Duration,
        priority: Option<i32>,
        retry: bool,
        group: Option<String>,
    ) -> bool {
        let hash = item_hash(&self.hasher, &item);
        let link = current_link();
        self.locked_with(item, move |inner, item, now| {
            if inner.state.is_shutting_down() {
                // Freed once the lock is released.
                return (false, After::new(Some(item)));
            }
            let now = now.unwrap_or_else(|| self.now_ns());
            if let Some(flow) = inner.state.flow_mut() {
                flow.select(group.as_deref().unwrap_or(""), now);
            }
            let at = now.saturating_add(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX));
            let (added, unused): (Added, _) =
                inner.state.add_at_hashed(item, hash, at, priority, link);
            let mut notify_timer = false;
            if added.new_head && !self.clock_driven {
                if inner.timer.thread.is_none() {
                    self.start_timer(inner);
                } else if at < inner.timer.sleeping_until {
                    notify_timer = true;
                }
            }
            let mut after = After::new(unused);
            after.retry = retry;
            after.notify_timer = notify_timer;
            (true, after)
        })
    }

    /// Shuts the queue down; returns the delayed items it dropped (see `State::shut_down`
    /// for `clone_processing`), which the caller drops or keeps, outside the lock.
    ///
    /// The one call that does not promote first: items still delayed at shut down are
    /// dropped, not handed out (client-go's rule). It also joins the timer thread once the
    /// lock is released.
    pub(super) fn shut_down(&self, drain: bool, clone_processing: bool) -> Vec<T> {
        let mut inner = self.inner.lock();
        let dropped = inner.state.shut_down(clone_processing);
        inner.drain = drain;
        let mut wake = inner.waiters.take_all();
        if !drain {
            wake = wake.merge(inner.drain_waiters.take_all());
        }
        // With hand-out rates the timer stays to serve the tokens of the items still queued;
        // it ends when the last handle drops.
        let thread = if self.rates {
            None
        } else {
            inner.timer.thread.take()
        };
        self.ready_hint.store(inner.state.len(), Ordering::Relaxed);
        drop(inner);
        self.timer_cv.notify_all();
        wake.wake();
        join_unless_current(thread);
        dropped
    }
}

impl<T> Shared<T> {
    /// Reads the state as it stands, under the lock, without promoting: for reads that
    /// must not move time forward (a metrics scrape, `processing_len`, `Debug`), so there is
    /// nothing to do once the lock is released.
    #[inline]
    pub(super) fn peek<R>(&self, read: impl FnOnce(&Inner<T>) -> R) -> R {
        read(&self.inner.lock())
    }

    /// The flow control figures and the `top` groups, without promoting (what a
    /// [`QueueProbe`](crate::metrics::QueueProbe) reads); `None` without flow control.
    pub(crate) fn flow_figures(
        &self,
        top: usize,
    ) -> Option<(crate::stats::FlowStats, Vec<crate::stats::GroupStats>)> {
        self.peek(|inner| {
            inner
                .state
                .flow()
                .map(|flow| (flow.stats(), flow.top_groups(top)))
        })
    }

    /// The depth by priority, highest first (what
    /// [`WorkQueue::depth_by_priority`](super::WorkQueue::depth_by_priority) returns).
    pub(crate) fn depth_by_priority(&self) -> Vec<(i32, usize)> {
        self.peek(|inner| inner.state.depth_by_priority())
            .into_iter()
            .rev()
            .collect()
    }
}

/// What a call decided under the lock and does once it is released: wake waiters, report
/// metrics, drop an item the queue did not keep (user code all three: a waker, a
/// recorder, `T`'s `Drop`, none of which may run under the queue's lock).
///
/// A call builds it with [`After::new`] (or takes [`After::NONE`]), then sets the plain
/// fields it needs.
pub(crate) struct After<T> {
    /// Getters to wake, from the front of the waiter list: taken once the call's work is
    /// done, still under the lock.
    pub(super) wake: usize,
    /// Wake every caller waiting for a drain (taken likewise, after the getters).
    pub(super) wake_drain: bool,
    /// Items that became dirty: the adds metric.
    pub(super) adds: usize,
    /// Count one retry.
    pub(super) retry: bool,
    /// An item was handed out after waiting this long (nanoseconds).
    pub(super) got: Option<u64>,
    /// An item was done after being processed this long (nanoseconds).
    pub(super) worked: Option<u64>,
    /// An item given to an add and not kept, or an item the queue stopped tracking.
    pub(super) unused: Option<T>,
    /// A delayed add moved the earliest deadline forward: wake the timer thread.
    pub(super) notify_timer: bool,
}

/// What a promotion of due items does once the lock is released.
pub(super) struct Promoted {
    /// Items that became dirty: the adds metric.
    adds: usize,
    /// The getters it took from the waiter list, one per item made ready.
    wake: Wakeups,
}

impl Promoted {
    /// Records the adds and wakes the getters; call it without the queue's lock.
    pub(super) fn run<T>(self, shared: &Shared<T>) {
        finish_unlocked::<T>(
            shared,
            self.wake,
            (self.adds, false, None, None, None, false),
        );
    }

    /// Nothing to do after the lock.
    pub(super) fn is_idle(&self) -> bool {
        matches!(self.wake, Wakeups::None) && self.adds == 0
    }
}

impl<T> After<T> {
    /// Nothing to do after the lock.
    pub(super) const NONE: Self = Self::new(None);

    /// Drop `unused` (if any) once the lock is released, and nothing else yet: the call sets
    /// the other fields on the result.
    #[inline(always)]
    pub(super) const fn new(unused: Option<T>) -> Self {
        Self {
            wake: 0,
            wake_drain: false,
            adds: 0,
            retry: false,
            got: None,
            worked: None,
            unused,
            notify_timer: false,
        }
    }

    /// Releases the lock, then does the rest. A call that wakes someone goes
    /// [`finish_waking`]'s way, out of line: the common call wakes nobody, and then moves
    /// no wake-up set around.
    #[inline(always)]
    fn finish(self, shared: &Shared<T>, guard: MutexGuard<'_, Inner<T>>) {
        let After {
            wake,
            wake_drain,
            adds,
            retry,
            got,
            worked,
            unused,
            notify_timer,
        } = self;
        // `rest` is put together in each branch: put together before the branch, it would
        // be kept in memory for the out-of-line call, on the common path too.
        if wake > 0 || wake_drain {
            let rest = (adds, retry, got, worked, unused, notify_timer);
            return finish_waking(shared, guard, Wakeups::None, wake, wake_drain, rest);
        }
        drop(guard);
        let rest = (adds, retry, got, worked, unused, notify_timer);
        finish_unlocked(shared, Wakeups::None, rest);
    }

    /// [`finish`](Self::finish) after a promotion: its wake-ups and adds come first.
    #[inline(never)]
    fn finish_promoted(
        self,
        shared: &Shared<T>,
        guard: MutexGuard<'_, Inner<T>>,
        promoted: Promoted,
    ) {
        let After {
            wake,
            wake_drain,
            adds,
            retry,
            got,
            worked,
            unused,
            notify_timer,
        } = self;
        let rest = (
            promoted.adds + adds,
            retry,
            got,
            worked,
            unused,
            notify_timer,
        );
        finish_waking(shared, guard, promoted.wake, wake, wake_drain, rest);
    }
}

/// What is left of an [`After`] once the waiters to wake are taken: the adds, the retry, the
/// get's wait, the work's duration, the unused item and the timer's notification.
type Rest<T> = (usize, bool, Option<u64>, Option<u64>, Option<T>, bool);

/// Takes `getters` waiting getters, then every caller of a drain if `drain`, after `first`;
/// releases the lock; then does the rest.
#[inline(never)]
fn finish_waking<T>(
    shared: &Shared<T>,
    mut guard: MutexGuard<'_, Inner<T>>,
    first: Wakeups,
    getters: usize,
    drain: bool,
    rest: Rest<T>,
) {
    let mut wakeups = first.merge(guard.waiters.take(getters));
    if drain {
        wakeups = wakeups.merge(guard.drain_waiters.take_all());
    }
    drop(guard);
    finish_unlocked(shared, wakeups, rest);
}

/// What every call does once the lock is released: wakes the timer if asked, records the
/// metrics, drops the unused item and wakes the waiters. Metrics come first, so a woken
/// getter sees them recorded.
#[inline(always)]
fn finish_unlocked<T>(shared: &Shared<T>, wake: Wakeups, rest: Rest<T>) {
    let (adds, retry, got, worked, unused, notify_timer) = rest;
    if notify_timer {
        shared.timer_cv.notify_one();
    }
    if shared.metrics.is_some() && (adds > 0 || retry || got.is_some() || worked.is_some()) {
        record(shared, adds, retry, got, worked);
    }
    drop(unused);
    wake.wake();
}

/// The metrics part of [`finish_unlocked`], out of line: only named queues get here.
#[inline(never)]
fn record<T>(shared: &Shared<T>, adds: usize, retry: bool, got: Option<u64>, worked: Option<u64>) {
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

/// Converts a sum of nanoseconds to a `Duration`, saturating.
fn nanos_to_duration(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    Duration::new(secs, (nanos % 1_000_000_000) as u32)
}
