//! [`FastSlow`]: client-go's `ItemFastSlowRateLimiter`.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::RateLimiter;
use super::failures::Failures;

/// Per item: `fast_delay` for the first `max_fast_attempts` failures, `slow_delay` after.
///
/// This is client-go's `ItemFastSlowRateLimiter`, with one addition: it tracks at most
/// [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED) items (change it with [`with_max_tracked`](Self::with_max_tracked)).
/// While that many are tracked, a new failing item takes the place of the least recently
/// failed one (see [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED)), which starts again
/// from `fast_delay` if it fails later.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::rate_limiter::{FastSlow, RateLimiter};
///
/// let limiter = FastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 2);
/// let delays: Vec<_> = (0..3).map(|_| limiter.when(&"default/web-0")).collect();
/// assert_eq!(delays, [Duration::from_millis(5), Duration::from_millis(5), Duration::from_secs(10)]);
/// ```
pub struct FastSlow<T> {
    fast_delay: Duration,
    slow_delay: Duration,
    max_fast_attempts: usize,
    /// Failures per item since it was last forgotten, for at most `max_tracked` items.
    failures: Failures<T>,
}

impl<T> FastSlow<T> {
    /// Creates the limiter. It tracks at most [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED) items.
    pub fn new(fast_delay: Duration, slow_delay: Duration, max_fast_attempts: usize) -> Self {
        Self {
            fast_delay,
            slow_delay,
            max_fast_attempts,
            failures: Failures::new("FastSlow"),
        }
    }

    /// Tracks at most `max_tracked` items (default [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED)).
    ///
    /// When a new item fails while `max_tracked` items are counted, the item whose latest
    /// failure is the oldest is forgotten to make room: the new item gets `fast_delay` (if
    /// `max_fast_attempts > 0`) and a `num_requeues` of 1, as in client-go, and the evicted
    /// one starts again from its first failure if it fails later. Each
    /// [`forget`](RateLimiter::forget) frees a place. The first eviction logs a `tracing`
    /// warning. `usize::MAX` means no bound (client-go's behaviour); 0 counts nothing, so
    /// every failure is a first one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workq::rate_limiter::{FastSlow, RateLimiter};
    ///
    /// let limiter = FastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 3)
    ///     .with_max_tracked(1);
    /// assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(5));
    /// // Full: "default/web-1" takes the place of "default/web-0".
    /// assert_eq!(limiter.when(&"default/web-1"), Duration::from_millis(5));
    /// assert_eq!(limiter.num_requeues(&"default/web-0"), 0);
    /// ```
    #[must_use]
    pub fn with_max_tracked(mut self, max_tracked: usize) -> Self {
        self.failures.set_max_tracked(max_tracked);
        self
    }

    /// The number of items whose failures are being counted.
    pub fn tracked(&self) -> usize {
        self.failures.tracked()
    }

    /// The most items this limiter tracks (see [`with_max_tracked`](Self::with_max_tracked)).
    pub fn max_tracked(&self) -> usize {
        self.failures.max_tracked()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for FastSlow<T> {
    fn when(&self, item: &T) -> Duration {
        if self.failures.record(item) < self.max_fast_attempts {
            self.fast_delay
        } else {
            self.slow_delay
        }
    }

    fn forget(&self, item: &T) {
        self.failures.forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.failures.get(item)
    }
}

impl<T> fmt::Debug for FastSlow<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlow")
            .field("fast_delay", &self.fast_delay)
            .field("slow_delay", &self.slow_delay)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("tracked", &self.tracked())
            .field("max_tracked", &self.max_tracked())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_MAX_TRACKED;
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
    fn full_limiter_evicts_to_give_new_items_the_fast_delay() {
        let limiter = FastSlow::new(FAST, SLOW, 3).with_max_tracked(1);
        assert_eq!(limiter.when(&1), FAST);
        assert_eq!(limiter.when(&2), FAST);
        assert_eq!(limiter.num_requeues(&2), 1);
        assert_eq!(limiter.num_requeues(&1), 0);
        assert_eq!(limiter.when(&1), FAST);
        assert_eq!(limiter.num_requeues(&1), 1);
        assert_eq!(limiter.tracked(), 1);
    }
}
