//! [`ExponentialFailure`]: client-go's `ItemExponentialFailureRateLimiter`.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use super::RateLimiter;

/// Per-item exponential backoff: the `n`-th failure of an item since it was last forgotten
/// waits `base_delay * 2^(n-1)`, never more than `max_delay`.
///
/// The computation cannot overflow: after thousands of failures the delay is `max_delay`.
/// This is client-go's `ItemExponentialFailureRateLimiter`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workqueue::rate_limiter::{ExponentialFailure, RateLimiter};
///
/// let limiter = ExponentialFailure::new(Duration::from_millis(5), Duration::from_millis(30));
/// let delays: Vec<_> = (0..5).map(|_| limiter.when(&"default/web-0")).collect();
/// let ms = Duration::from_millis;
/// assert_eq!(delays, [ms(5), ms(10), ms(20), ms(30), ms(30)]);
/// ```
pub struct ExponentialFailure<T> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per item since it was last forgotten.
    failures: Mutex<HashMap<T, usize>>,
}

impl<T> ExponentialFailure<T> {
    /// Creates the limiter. A zero `base_delay` always answers zero; a `max_delay` below
    /// `base_delay` caps every answer at `max_delay`.
    pub fn new(base_delay: Duration, max_delay: Duration) -> Self {
        Self {
            base_delay,
            max_delay,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The number of items whose failures are being counted.
    pub fn tracked(&self) -> usize {
        self.failures.lock().len()
    }
}

/// `base * 2^exponent`, or `None` if that exceeds `max`.
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
        let exponent = {
            let mut failures = self.failures.lock();
            match failures.get_mut(item) {
                Some(count) => {
                    let exponent = *count;
                    *count = count.saturating_add(1);
                    exponent
                }
                None => {
                    failures.insert(item.clone(), 1);
                    0
                }
            }
        };
        backoff(self.base_delay, exponent, self.max_delay)
    }

    fn forget(&self, item: &T) {
        self.failures.lock().remove(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.failures.lock().get(item).copied().unwrap_or(0)
    }
}

impl<T> fmt::Debug for ExponentialFailure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialFailure")
            .field("base_delay", &self.base_delay)
            .field("max_delay", &self.max_delay)
            .field("tracked", &self.tracked())
            .finish()
    }
}
