//! [`FastSlow`]: client-go's `ItemFastSlowRateLimiter`.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;

use super::exponential::warn_full;
use super::{DEFAULT_MAX_TRACKED, RateLimiter};

/// Per item: `fast_delay` for the first `max_fast_attempts` failures, `slow_delay` after.
///
/// This is client-go's `ItemFastSlowRateLimiter`, with one addition: it tracks at most
/// [`DEFAULT_MAX_TRACKED`] items (change it with [`with_max_tracked`](Self::with_max_tracked)).
/// While that many are tracked, an item it does not know yet waits `slow_delay` and is not
/// tracked (its `num_requeues` stays 0).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workqueue::rate_limiter::{FastSlow, RateLimiter};
///
/// let limiter = FastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 2);
/// let delays: Vec<_> = (0..3).map(|_| limiter.when(&"default/web-0")).collect();
/// assert_eq!(delays, [Duration::from_millis(5), Duration::from_millis(5), Duration::from_secs(10)]);
/// ```
pub struct FastSlow<T> {
    fast_delay: Duration,
    slow_delay: Duration,
    max_fast_attempts: usize,
    /// Failures per item since it was last forgotten; never more than `max_tracked` entries.
    failures: Mutex<HashMap<T, usize>>,
    /// The most items `failures` may hold.
    max_tracked: usize,
    /// Set once the "limiter is full" warning has been logged.
    warned_full: AtomicBool,
}

impl<T> FastSlow<T> {
    /// Creates the limiter. It tracks at most [`DEFAULT_MAX_TRACKED`] items.
    pub fn new(fast_delay: Duration, slow_delay: Duration, max_fast_attempts: usize) -> Self {
        Self {
            fast_delay,
            slow_delay,
            max_fast_attempts,
            failures: Mutex::new(HashMap::new()),
            max_tracked: DEFAULT_MAX_TRACKED,
            warned_full: AtomicBool::new(false),
        }
    }

    /// Tracks at most `max_tracked` items (default [`DEFAULT_MAX_TRACKED`]).
    ///
    /// While the limiter is full, an item it does not track yet waits `slow_delay` and stays
    /// untracked; items already tracked keep their counts, and each
    /// [`forget`](RateLimiter::forget) frees a place. The first time the limiter is full it
    /// logs a `tracing` warning. `usize::MAX` means no bound (client-go's behaviour).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue::rate_limiter::{FastSlow, RateLimiter};
    ///
    /// let limiter = FastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 3)
    ///     .with_max_tracked(1);
    /// assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(5));
    /// assert_eq!(limiter.when(&"default/web-1"), Duration::from_secs(10)); // full
    /// ```
    #[must_use]
    pub fn with_max_tracked(mut self, max_tracked: usize) -> Self {
        self.max_tracked = max_tracked;
        self
    }

    /// The number of items whose failures are being counted.
    pub fn tracked(&self) -> usize {
        self.failures.lock().len()
    }

    /// The most items this limiter tracks (see [`with_max_tracked`](Self::with_max_tracked)).
    pub fn max_tracked(&self) -> usize {
        self.max_tracked
    }
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for FastSlow<T> {
    fn when(&self, item: &T) -> Duration {
        let count = {
            let mut failures = self.failures.lock();
            let full = failures.len() >= self.max_tracked;
            match failures.get_mut(item) {
                Some(count) => {
                    *count = count.saturating_add(1);
                    *count
                }
                None if full => {
                    drop(failures);
                    warn_full(&self.warned_full, "FastSlow", self.max_tracked);
                    return self.slow_delay;
                }
                None => {
                    failures.insert(item.clone(), 1);
                    1
                }
            }
        };
        if count <= self.max_fast_attempts {
            self.fast_delay
        } else {
            self.slow_delay
        }
    }

    fn forget(&self, item: &T) {
        self.failures.lock().remove(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.failures.lock().get(item).copied().unwrap_or(0)
    }
}

impl<T> fmt::Debug for FastSlow<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlow")
            .field("fast_delay", &self.fast_delay)
            .field("slow_delay", &self.slow_delay)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("tracked", &self.tracked())
            .field("max_tracked", &self.max_tracked)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_secs(10);

    #[test]
    fn new_tracks_up_to_the_default_bound() {
        assert_eq!(
            FastSlow::<u32>::new(FAST, SLOW, 3).max_tracked(),
            DEFAULT_MAX_TRACKED
        );
    }

    #[test]
    fn full_limiter_gives_untracked_items_the_slow_delay() {
        let limiter = FastSlow::new(FAST, SLOW, 3).with_max_tracked(1);
        assert_eq!(limiter.when(&1), FAST);
        assert_eq!(limiter.when(&2), SLOW);
        assert_eq!(limiter.num_requeues(&2), 0);
        assert_eq!(limiter.when(&1), FAST);
        assert_eq!(limiter.num_requeues(&1), 2);
        limiter.forget(&1);
        assert_eq!(limiter.when(&2), FAST);
        assert_eq!(limiter.tracked(), 1);
    }
}
