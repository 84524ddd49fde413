//! [`MaxOf`]: client-go's `MaxOfRateLimiter`.

use std::fmt;
use std::time::Duration;

use super::RateLimiter;

/// The longest delay any of several limiters gives.
///
/// Every limiter is asked on every call, so each counts the failure. `num_requeues` is the
/// largest count, and `forget` reaches them all. With no limiters the delay is zero. This is
/// client-go's `MaxOfRateLimiter`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::rate_limiter::{ExponentialFailure, FastSlow, MaxOf, RateLimiter};
///
/// let limiter = MaxOf::new(vec![
///     Box::new(FastSlow::new(Duration::from_millis(5), Duration::from_secs(3), 3)),
///     Box::new(ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1))),
/// ]);
/// assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(5));
/// ```
pub struct MaxOf<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOf<T> {
    /// Combines `limiters`.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        Self { limiters }
    }
}

impl<T> RateLimiter<T> for MaxOf<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item))
            .fold(Duration::ZERO, Duration::max)
    }

    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

impl<T> fmt::Debug for MaxOf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}
