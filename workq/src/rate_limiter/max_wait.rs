//! [`WithMaxWait`]: client-go's `WithMaxWaitRateLimiter`.

use std::fmt;
use std::time::Duration;

use super::RateLimiter;

/// Another limiter's delay, never longer than `max_delay`.
///
/// Useful around a [`TokenBucket`](super::TokenBucket), whose delays grow without bound
/// when many items fail at once (kubernetes#104554). This is client-go's
/// `WithMaxWaitRateLimiter`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::rate_limiter::{ExponentialFailure, RateLimiter, WithMaxWait};
///
/// let limiter = WithMaxWait::new(
///     ExponentialFailure::new(Duration::from_secs(1), Duration::from_secs(1000)),
///     Duration::from_secs(3),
/// );
/// let delays: Vec<_> = (0..3).map(|_| limiter.when(&"default/web-0")).collect();
/// assert_eq!(delays, [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(3)]);
/// ```
pub struct WithMaxWait<T> {
    limiter: Box<dyn RateLimiter<T>>,
    max_delay: Duration,
}

impl<T> WithMaxWait<T> {
    /// Caps `limiter`'s delays at `max_delay`.
    pub fn new(limiter: impl RateLimiter<T> + 'static, max_delay: Duration) -> Self {
        Self {
            limiter: Box::new(limiter),
            max_delay,
        }
    }
}

impl<T> RateLimiter<T> for WithMaxWait<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiter.when(item).min(self.max_delay)
    }

    fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.limiter.num_requeues(item)
    }
}

impl<T> fmt::Debug for WithMaxWait<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithMaxWait")
            .field("max_delay", &self.max_delay)
            .finish_non_exhaustive()
    }
}
