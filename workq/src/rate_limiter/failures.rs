//! The bounded failure counts both per-item limiters keep ([`ExponentialFailure`] and
//! [`FastSlow`]).
//!
//! [`ExponentialFailure`]: super::ExponentialFailure
//! [`FastSlow`]: super::FastSlow

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// How many items a per-item limiter ([`ExponentialFailure`](super::ExponentialFailure),
/// [`FastSlow`](super::FastSlow)) tracks by default: 100,000.
///
/// A per-item limiter remembers every item that failed until it is
/// [`forget`](super::RateLimiter::forget)-ten. A caller that never forgets would grow that memory
/// without limit (kubernetes/kubernetes#138743), so the limiters count the failures of at
/// most this many items: when a new item fails while that many are counted, the item whose
/// latest failure is the oldest is forgotten (as if `forget` had been called for it) to make
/// room. Every failing item therefore gets its formula's delay and a true `num_requeues`
/// as long as it is among the `max_tracked` most recently failed items; an item evicted
/// before it fails again starts again from its first delay, with `num_requeues` 0. The
/// bound sits far above the number of objects a controller normally has failing at once,
/// so callers who do forget never reach it; at roughly 100 bytes per short string key it
/// caps the memory near 10 MB. Change it with `with_max_tracked`.
pub const DEFAULT_MAX_TRACKED: usize = 100_000;

/// Failures per item since it was last forgotten, for the `max_tracked` items that failed
/// most recently.
pub(super) struct Failures<T> {
    /// The counts and their eviction order.
    tracked: Mutex<Tracked<T>>,
    /// The most items counted at once.
    max_tracked: usize,
    /// Set once the "evicting" warning has been logged, so it is logged once.
    warned_full: AtomicBool,
    /// The limiter's name, for the warning.
    limiter: &'static str,
}

/// One item's count.
struct Count {
    /// Failures since the item was last forgotten (or evicted).
    failures: usize,
    /// The stamp of its latest failure: its live entry in [`Tracked::order`].
    stamp: u64,
}

/// The counts, with the order of the latest failures for least-recently-failed eviction.
///
/// Written by hand: a linked hash map crate would keep the order too, but this is a few
/// lines over the map the limiter needs anyway. `order` gets one entry per failure; an
/// entry whose stamp is no longer its item's latest is stale and skipped by eviction, and
/// the queue is compacted once stale entries outnumber live ones (amortised O(1) a call).
struct Tracked<T> {
    counts: HashMap<T, Count>,
    /// (stamp, item) per failure, oldest first.
    order: VecDeque<(u64, T)>,
    /// The next stamp.
    next: u64,
}

impl<T: Eq + Hash> Tracked<T> {
    /// Is `(stamp, item)` its item's latest failure?
    fn is_live(counts: &HashMap<T, Count>, stamp: u64, item: &T) -> bool {
        counts.get(item).is_some_and(|count| count.stamp == stamp)
    }

    /// Forgets the least recently failed item.
    fn evict_oldest(&mut self) {
        while let Some((stamp, item)) = self.order.pop_front() {
            if Self::is_live(&self.counts, stamp, &item) {
                self.counts.remove(&item);
                return;
            }
        }
    }

    /// Drops stale order entries once they outnumber live ones, and gives back the
    /// capacity a burst of failures left behind.
    fn compact(&mut self) {
        let live = self.counts.len();
        if self.order.len() <= 2 * live + 32 {
            return;
        }
        let counts = &self.counts;
        self.order
            .retain(|(stamp, item)| Self::is_live(counts, *stamp, item));
        if self.order.capacity() > 4 * live + 64 {
            self.order.shrink_to(2 * live + 32);
        }
        if self.counts.capacity() > 4 * live + 64 {
            self.counts.shrink_to(2 * live + 32);
        }
    }
}

impl<T> Failures<T> {
    pub(super) fn new(limiter: &'static str) -> Self {
        Self {
            tracked: Mutex::new(Tracked {
                counts: HashMap::new(),
                order: VecDeque::new(),
                next: 0,
            }),
            max_tracked: DEFAULT_MAX_TRACKED,
            warned_full: AtomicBool::new(false),
            limiter,
        }
    }

    pub(super) fn set_max_tracked(&mut self, max_tracked: usize) {
        self.max_tracked = max_tracked;
    }

    pub(super) fn max_tracked(&self) -> usize {
        self.max_tracked
    }

    /// The number of items being counted.
    pub(super) fn tracked(&self) -> usize {
        self.tracked.lock().counts.len()
    }

    /// The length of the eviction order, stale entries included; for tests.
    #[cfg(test)]
    pub(super) fn order_len(&self) -> usize {
        self.tracked.lock().order.len()
    }
}

impl<T: Eq + Hash + Clone> Failures<T> {
    /// Counts one more failure of `item`; returns how many it had before. When a new item
    /// fails while `max_tracked` items are counted, the least recently failed one is
    /// forgotten first (and, once, a warning says so: almost always a missing `forget`).
    /// With `max_tracked == 0` nothing is counted and every failure is a first one.
    pub(super) fn record(&self, item: &T) -> usize {
        let mut tracked = self.tracked.lock();
        let stamp = tracked.next;
        tracked.next += 1;
        if let Some(count) = tracked.counts.get_mut(item) {
            let before = count.failures;
            count.failures = count.failures.saturating_add(1);
            count.stamp = stamp;
            tracked.order.push_back((stamp, item.clone()));
            tracked.compact();
            return before;
        }
        if self.max_tracked == 0 {
            return 0;
        }
        let evicting = tracked.counts.len() >= self.max_tracked;
        if evicting {
            tracked.evict_oldest();
        }
        tracked
            .counts
            .insert(item.clone(), Count { failures: 1, stamp });
        tracked.order.push_back((stamp, item.clone()));
        tracked.compact();
        drop(tracked);
        if evicting && !self.warned_full.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limiter = self.limiter,
                max_tracked = self.max_tracked,
                "rate limiter is tracking its maximum number of items; the least recently \
                 failed items are forgotten to make room (is `forget` called when an item \
                 succeeds?)"
            );
        }
        0
    }

    pub(super) fn forget(&self, item: &T) {
        let mut tracked = self.tracked.lock();
        if tracked.counts.remove(item).is_some() {
            tracked.compact();
        }
    }

    pub(super) fn get(&self, item: &T) -> usize {
        self.tracked
            .lock()
            .counts
            .get(item)
            .map_or(0, |count| count.failures)
    }
}
