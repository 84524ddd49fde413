//! The bounded failure counts both per-item limiters keep ([`ExponentialFailure`] and
//! [`FastSlow`]).
//!
//! [`ExponentialFailure`]: super::ExponentialFailure
//! [`FastSlow`]: super::FastSlow

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::DEFAULT_MAX_TRACKED;

/// Failures per item since it was last forgotten, for at most `max_tracked` items.
pub(super) struct Failures<T> {
    /// The counts; never more than `max_tracked` entries.
    counts: Mutex<HashMap<T, usize>>,
    /// The most items `counts` may hold.
    max_tracked: usize,
    /// Set once the "full" warning has been logged, so it is logged once.
    warned_full: AtomicBool,
    /// The limiter's name, for the warning.
    limiter: &'static str,
}

impl<T> Failures<T> {
    pub(super) fn new(limiter: &'static str) -> Self {
        Self {
            counts: Mutex::new(HashMap::new()),
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
        self.counts.lock().len()
    }
}

impl<T: Eq + Hash + Clone> Failures<T> {
    /// Counts one more failure of `item`; returns how many it had before, or `None` if the
    /// item is not tracked and there is no room to start (after logging, once, that the
    /// limiter is full: almost always a missing `forget`).
    pub(super) fn record(&self, item: &T) -> Option<usize> {
        let mut counts = self.counts.lock();
        if let Some(count) = counts.get_mut(item) {
            let before = *count;
            *count = count.saturating_add(1);
            return Some(before);
        }
        if counts.len() >= self.max_tracked {
            drop(counts);
            if !self.warned_full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    limiter = self.limiter,
                    max_tracked = self.max_tracked,
                    "rate limiter is tracking its maximum number of items; new items get the \
                     longest delay (is `forget` called when an item succeeds?)"
                );
            }
            return None;
        }
        counts.insert(item.clone(), 1);
        Some(0)
    }

    pub(super) fn forget(&self, item: &T) {
        self.counts.lock().remove(item);
    }

    pub(super) fn get(&self, item: &T) -> usize {
        self.counts.lock().get(item).copied().unwrap_or(0)
    }
}
