//! [`FastSlow`]: client-go's `ItemFastSlowRateLimiter`.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use super::RateLimiter;

/// Per item: `fast_delay` for the first `max_fast_attempts` failures, `slow_delay` after.
///
/// This is client-go's `ItemFastSlowRateLimiter`.
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
    /// Failures per item since it was last forgotten.
    failures: Mutex<HashMap<T, usize>>,
}

impl<T> FastSlow<T> {
    /// Creates the limiter.
    pub fn new(fast_delay: Duration, slow_delay: Duration, max_fast_attempts: usize) -> Self {
        Self {
            fast_delay,
            slow_delay,
            max_fast_attempts,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The number of items whose failures are being counted.
    pub fn tracked(&self) -> usize {
        self.failures.lock().len()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for FastSlow<T> {
    fn when(&self, item: &T) -> Duration {
        let count = {
            let mut failures = self.failures.lock();
            let count = failures.entry(item.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
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
            .finish()
    }
}
