//! Time sources: [`Clock`], the wall clock [`RealClock`] and the test clock [`FakeClock`].
//!
//! Every timed decision of a queue (when a delayed item becomes ready, how long a
//! [`TokenBucket`](crate::rate_limiter::TokenBucket) makes an item wait) reads the queue's
//! clock, so a test that builds its queue with a [`FakeClock`] controls time completely:
//!
//! ```
//! use std::time::Duration;
//! use workq::{WorkQueue, clock::FakeClock};
//!
//! let clock = FakeClock::new();
//! let queue = WorkQueue::builder().clock(clock.clone()).build();
//! queue.add_after("default/web-0", Duration::from_secs(30));
//! assert_eq!(queue.len(), 0);
//! clock.step(Duration::from_secs(30));
//! assert_eq!(queue.len(), 1);
//! ```

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A source of time for a queue and its rate limiters.
///
/// This plays the part of client-go's `clock.WithTicker`. Implement it to run a queue on a
/// time source of your own; most users need only [`RealClock`] (the default) and
/// [`FakeClock`] (for tests).
pub trait Clock: Send + Sync + 'static {
    /// Returns the current time.
    fn now(&self) -> Instant;

    /// Asks the clock to call `listener` every time its time moves forward.
    ///
    /// A clock that advances on its own, as [`RealClock`] does, returns `false` and the queue
    /// keeps one background thread that sleeps until the earliest delayed item is due. A
    /// clock that only moves when told to ([`FakeClock`]) returns `true` and calls
    /// [`ClockListener::notify`] after each step; the queue then needs no background thread
    /// at all and promotes due items inside the call that moved the clock.
    ///
    /// A clock that returns `true` must call [`ClockListener::notify`] without holding any
    /// lock that its [`now`](Clock::now) takes: the queue reads the clock under its own lock,
    /// and the listener takes that lock.
    ///
    /// The default implementation returns `false`.
    fn subscribe(&self, listener: ClockListener) -> bool {
        let _ = listener;
        false
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Instant {
        (**self).now()
    }

    fn subscribe(&self, listener: ClockListener) -> bool {
        (**self).subscribe(listener)
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now(&self) -> Instant {
        (**self).now()
    }

    fn subscribe(&self, listener: ClockListener) -> bool {
        (**self).subscribe(listener)
    }
}

/// A callback a [`Clock`] calls when its time moves forward (see [`Clock::subscribe`]).
///
/// It holds only a weak reference to whatever subscribed, so a clock that outlives its
/// queues keeps nothing alive.
#[derive(Clone)]
pub struct ClockListener {
    /// What to call; gone once the subscriber is dropped.
    callback: Weak<dyn Fn() + Send + Sync>,
}

impl ClockListener {
    /// Wraps a weak callback. Used by the queue; public so that custom clocks can be tested.
    pub fn new(callback: Weak<dyn Fn() + Send + Sync>) -> Self {
        Self { callback }
    }

    /// Tells the subscriber that time moved. Returns `false` once the subscriber is gone,
    /// so the clock can drop this listener.
    pub fn notify(&self) -> bool {
        match self.callback.upgrade() {
            Some(callback) => {
                callback();
                true
            }
            None => false,
        }
    }

    /// Returns `true` while the subscriber still exists.
    pub fn is_alive(&self) -> bool {
        self.callback.strong_count() > 0
    }
}

impl fmt::Debug for ClockListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClockListener")
            .field("alive", &self.is_alive())
            .finish()
    }
}

/// The system's monotonic clock, [`Instant::now`]. The default for every queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when a test tells it to.
///
/// All clones share one time. [`step`](FakeClock::step) moves it forward; every queue built
/// with this clock promotes the delayed items that became due before `step` returns, so they
/// are visible to [`len`](crate::WorkQueue::len) and [`try_get`](crate::WorkQueue::try_get)
/// and handed to waiting getters at once. No real time needs to pass, and a queue on a fake
/// clock starts no background thread.
///
/// This is `k8s.io/utils/clock/testing.FakeClock`.
///
/// # Thread safety
///
/// `FakeClock` is `Send + Sync`; any thread may step it. Steps are serialised, and each one
/// notifies the subscribed queues after the new time is visible.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::clock::FakeClock;
///
/// let clock = FakeClock::new();
/// let start = clock.now();
/// clock.step(Duration::from_millis(250));
/// assert_eq!(clock.now() - start, Duration::from_millis(250));
/// ```
#[derive(Clone)]
pub struct FakeClock {
    /// The shared time and the queues to tell when it moves.
    inner: Arc<FakeInner>,
}

struct FakeInner {
    /// The current fake time.
    now: Mutex<Instant>,
    /// Subscribers; dead ones are pruned on every step.
    listeners: Mutex<Vec<ClockListener>>,
    /// Serialises steps so listeners see them in order.
    step_lock: Mutex<()>,
}

/// How far a [`FakeClock`] may move past its start when a step would overflow [`Instant`]:
/// a century, far beyond any delay a test can mean.
const FAKE_HORIZON: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl FakeClock {
    /// Creates a fake clock that starts at the current real time and stands still.
    pub fn new() -> Self {
        Self::at(Instant::now())
    }

    /// Creates a fake clock that starts at `start`.
    pub fn at(start: Instant) -> Self {
        Self {
            inner: Arc::new(FakeInner {
                now: Mutex::new(start),
                listeners: Mutex::new(Vec::new()),
                step_lock: Mutex::new(()),
            }),
        }
    }

    /// Returns the clock's current time.
    pub fn now(&self) -> Instant {
        *self.inner.now.lock()
    }

    /// Moves the clock forward by `delta` and tells every queue on it.
    ///
    /// A step that would overflow [`Instant`] moves as far as it can, at most a century, and
    /// never panics. A queue counts time in nanoseconds for about 584 years after it was
    /// built, so an item delayed by [`Duration::MAX`] comes due only after several such
    /// steps.
    pub fn step(&self, delta: Duration) {
        let _serial = self.inner.step_lock.lock();
        {
            let mut now = self.inner.now.lock();
            *now = saturating_add(*now, delta);
        }
        self.notify_all();
    }

    /// Sets the clock to `instant` if that is later than its current time; an earlier
    /// instant is ignored, since a monotonic clock never goes back.
    pub fn advance_to(&self, instant: Instant) {
        let _serial = self.inner.step_lock.lock();
        {
            let mut now = self.inner.now.lock();
            if instant > *now {
                *now = instant;
            }
        }
        self.notify_all();
    }

    /// Returns `true` while at least one live queue (or other subscriber) listens to this
    /// clock. This is client-go's `FakeClock.HasWaiters`, close enough for tests that wait
    /// for a queue to exist.
    pub fn has_listeners(&self) -> bool {
        self.inner
            .listeners
            .lock()
            .iter()
            .any(ClockListener::is_alive)
    }

    fn notify_all(&self) {
        // Copy the list so listeners run without our lock: a listener takes its queue's lock,
        // and the queue reads this clock under that lock.
        let listeners: Vec<ClockListener> = self.inner.listeners.lock().clone();
        let mut dead = false;
        for listener in &listeners {
            dead |= !listener.notify();
        }
        if dead {
            self.inner.listeners.lock().retain(ClockListener::is_alive);
        }
    }
}

/// `instant + delta`, or, where that overflows [`Instant`], as late an instant as fits, at
/// most [`FAKE_HORIZON`] (a century) after `instant`: "no limit" for a deadline.
pub(crate) fn saturating_add(instant: Instant, delta: Duration) -> Instant {
    if let Some(later) = instant.checked_add(delta) {
        return later;
    }
    // Find the largest step that fits by halving: at most 64 rounds.
    let mut step = delta.min(FAKE_HORIZON);
    loop {
        if let Some(later) = instant.checked_add(step) {
            return later;
        }
        step /= 2;
        if step.is_zero() {
            return instant;
        }
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        FakeClock::now(self)
    }

    fn subscribe(&self, listener: ClockListener) -> bool {
        let mut listeners = self.inner.listeners.lock();
        listeners.retain(ClockListener::is_alive);
        listeners.push(listener);
        true
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_moves_all_clones() {
        let clock = FakeClock::new();
        let other = clock.clone();
        let start = clock.now();
        other.step(Duration::from_secs(3));
        assert_eq!(clock.now() - start, Duration::from_secs(3));
    }

    #[test]
    fn step_duration_max_saturates() {
        let clock = FakeClock::new();
        let start = clock.now();
        clock.step(Duration::MAX);
        assert!(clock.now() - start >= Duration::from_secs(60 * 60 * 24 * 365));
        clock.step(Duration::MAX);
    }

    #[test]
    fn listeners_are_called_and_pruned() {
        let clock = FakeClock::new();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let callback: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(clock.subscribe(ClockListener::new(Arc::downgrade(&callback))));
        assert!(clock.has_listeners());
        clock.step(Duration::from_millis(1));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        drop(callback);
        assert!(!clock.has_listeners());
        clock.step(Duration::from_millis(1));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn advance_to_never_goes_back() {
        let clock = FakeClock::new();
        let start = clock.now();
        clock.step(Duration::from_secs(5));
        clock.advance_to(start);
        assert_eq!(clock.now() - start, Duration::from_secs(5));
    }
}
