//! [`ExponentialFailure`]: client-go's `ItemExponentialFailureRateLimiter`.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::RateLimiter;
use super::failures::Failures;

/// Per-item exponential backoff: the `n`-th failure of an item since it was last forgotten
/// waits `base_delay * 2^(n-1)`, never more than `max_delay`.
///
/// The computation cannot overflow: after thousands of failures the delay is `max_delay`.
/// This is client-go's `ItemExponentialFailureRateLimiter`, with one addition: it tracks at
/// most [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED) items (change it with
/// [`with_max_tracked`](Self::with_max_tracked)). While that many are tracked, a new failing
/// item takes the place of the least recently failed one, which starts again from
/// `base_delay` if it fails later.
///
/// All items failing together get the same delays and so retry together; wrap the limiter
/// in [`Jitter`](super::Jitter) to spread them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::rate_limiter::{ExponentialFailure, RateLimiter};
///
/// let limiter = ExponentialFailure::new(Duration::from_millis(5), Duration::from_millis(30));
/// let delays: Vec<_> = (0..5).map(|_| limiter.when(&"default/web-0")).collect();
/// let ms = Duration::from_millis;
/// assert_eq!(delays, [ms(5), ms(10), ms(20), ms(30), ms(30)]);
/// ```
pub struct ExponentialFailure<T> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per item since it was last forgotten, for at most `max_tracked` items.
    failures: Failures<T>,
}

impl<T> ExponentialFailure<T> {
    /// Creates the limiter. A zero `base_delay` always answers zero; a `max_delay` below
    /// `base_delay` caps every answer at `max_delay`. It tracks at most
    /// [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED) items.
    pub fn new(base_delay: Duration, max_delay: Duration) -> Self {
        Self {
            base_delay,
            max_delay,
            failures: Failures::new("ExponentialFailure"),
        }
    }

    /// Tracks at most `max_tracked` items (default [`DEFAULT_MAX_TRACKED`](super::DEFAULT_MAX_TRACKED)).
    ///
    /// When a new item fails while `max_tracked` items are counted, the item whose latest
    /// failure is the oldest is forgotten to make room: the new item gets `base_delay` and a
    /// `num_requeues` of 1, as in client-go, and the evicted one starts again from
    /// `base_delay` if it fails later. Each [`forget`](RateLimiter::forget) frees a place.
    /// The first eviction logs a `tracing` warning. `usize::MAX` means no bound (client-go's
    /// behaviour); 0 counts nothing, so every failure waits `base_delay`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use workq::rate_limiter::{ExponentialFailure, RateLimiter};
    ///
    /// let limiter = ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(60))
    ///     .with_max_tracked(1);
    /// assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(5));
    /// // Full: the new item takes the place of the least recently failed one.
    /// assert_eq!(limiter.when(&"default/web-1"), Duration::from_millis(5));
    /// assert_eq!(limiter.num_requeues(&"default/web-1"), 1);
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

/// `base * 2^exponent`, or `max` if that is more (client-go's overflow rule included).
pub(crate) fn backoff(base: Duration, exponent: usize, max: Duration) -> Duration {
    if base.is_zero() {
        return Duration::ZERO;
    }
    // client-go computes in float64 nanoseconds and falls back to max_delay once the result
    // no longer fits; 2^exponent is exact in f64, so this agrees with it to the nanosecond
    // while the result fits in an i64.
    let exponent = i32::try_from(exponent).unwrap_or(i32::MAX).min(2048);
    let nanos = base.as_nanos() as f64 * 2f64.powi(exponent);
    if nanos >= max.as_nanos() as f64 || nanos >= u64::MAX as f64 || nanos.is_nan() {
        return max;
    }
    Duration::from_nanos(nanos as u64).min(max)
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for ExponentialFailure<T> {
    fn when(&self, item: &T) -> Duration {
        backoff(self.base_delay, self.failures.record(item), self.max_delay)
    }

    fn forget(&self, item: &T) {
        self.failures.forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.failures.get(item)
    }
}

impl<T> fmt::Debug for ExponentialFailure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialFailure")
            .field("base_delay", &self.base_delay)
            .field("max_delay", &self.max_delay)
            .field("tracked", &self.tracked())
            .field("max_tracked", &self.max_tracked())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_MAX_TRACKED;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn new_tracks_up_to_the_default_bound() {
        let limiter = ExponentialFailure::<u32>::new(MS, Duration::from_secs(1));
        assert_eq!(limiter.max_tracked(), DEFAULT_MAX_TRACKED);
    }

    #[test]
    fn full_limiter_evicts_the_least_recently_failed_and_keeps_the_formula() {
        let limiter = ExponentialFailure::new(MS, Duration::from_secs(1)).with_max_tracked(2);
        assert_eq!(limiter.when(&1), MS);
        assert_eq!(limiter.when(&2), MS);
        // Full: a third item takes item 1's place and gets client-go's sequence.
        assert_eq!(limiter.when(&3), MS);
        assert_eq!(limiter.when(&3), 2 * MS);
        assert_eq!(limiter.num_requeues(&3), 2);
        assert_eq!(limiter.num_requeues(&1), 0);
        assert_eq!(limiter.tracked(), 2);
        // Forgetting one frees a place: nothing is evicted for the next one.
        limiter.forget(&2);
        assert_eq!(limiter.when(&4), MS);
        assert_eq!(limiter.num_requeues(&3), 2);
        assert_eq!(limiter.tracked(), 2);
    }

    #[test]
    fn stale_order_entries_are_compacted() {
        let limiter = ExponentialFailure::new(MS, Duration::from_secs(1)).with_max_tracked(4);
        for _ in 0..10_000 {
            limiter.when(&1);
        }
        assert!(limiter.failures.order_len() <= 2 + 32 + 1);
    }

    #[test]
    fn zero_bound_tracks_nothing() {
        let limiter = ExponentialFailure::new(MS, Duration::from_secs(5)).with_max_tracked(0);
        assert_eq!(limiter.when(&1), MS);
        assert_eq!(limiter.when(&1), MS);
        assert_eq!(limiter.tracked(), 0);
    }
}
