//! Rate limiters: how long [`WorkQueue::add_rate_limited`](crate::WorkQueue::add_rate_limited)
//! makes an item wait. Each maps to one of client-go's (`default_rate_limiters.go`):
//!
//! - [`ExponentialFailure`]: per item, `base * 2^failures`, capped (`ItemExponentialFailureRateLimiter`).
//! - [`FastSlow`]: per item, a fast delay for the first attempts, then a slow one (`ItemFastSlowRateLimiter`).
//! - [`TokenBucket`]: overall, `qps` with a burst, by reservation (`BucketRateLimiter`).
//! - [`MaxOf`]: the longest delay of several limiters (`MaxOfRateLimiter`).
//! - [`WithMaxWait`]: another limiter's delay, capped (`WithMaxWaitRateLimiter`).
//! - [`Jitter`]: another limiter's delay, randomised so items failing together do not retry
//!   together (new; client-go has none).
//!
//! The per-item limiters track at most [`DEFAULT_MAX_TRACKED`] items each, so a caller that
//! never calls `forget` cannot grow them without limit (kubernetes/kubernetes#138743).
//!
//! [`default_controller`] and [`default_item_based`] are client-go's defaults.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use workq::rate_limiter::{ExponentialFailure, RateLimiter};
//!
//! let limiter = ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1));
//! assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(1));
//! assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(2));
//! assert_eq!(limiter.num_requeues(&"default/web-0"), 2);
//! limiter.forget(&"default/web-0");
//! assert_eq!(limiter.when(&"default/web-0"), Duration::from_millis(1));
//! ```

mod exponential;
mod failures;
mod fast_slow;
pub(crate) mod jitter;
mod max_of;
mod max_wait;
mod token_bucket;

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, RealClock};

pub use exponential::ExponentialFailure;
pub use failures::DEFAULT_MAX_TRACKED;
pub use fast_slow::FastSlow;
pub use jitter::{Jitter, JitterMode};
pub use max_of::MaxOf;
pub use max_wait::WithMaxWait;
pub use token_bucket::TokenBucket;

/// Decides how long an item waits before it is retried. This is client-go's `RateLimiter`.
pub trait RateLimiter<T>: Send + Sync {
    /// How long `item` should wait now. Per-item limiters count this as one more failure.
    fn when(&self, item: &T) -> Duration;

    /// Stops tracking `item`: its failure count resets. Per-item limiters free its memory.
    fn forget(&self, item: &T);

    /// How many failures of `item` are counted.
    fn num_requeues(&self, item: &T) -> usize;
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        (**self).num_requeues(item)
    }
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Arc<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        (**self).num_requeues(item)
    }
}

/// client-go's `DefaultControllerRateLimiter`: the larger of a per-item exponential backoff
/// from 5 ms to 1000 s and an overall token bucket of 10 qps with a burst of 100, on the
/// real clock.
///
/// A queue built without a rate limiter uses this on the queue's own clock (see
/// [`default_controller_with_clock`]).
pub fn default_controller<T: Eq + Hash + Clone + Send + Sync + 'static>() -> MaxOf<T> {
    default_controller_with_clock(RealClock)
}

/// [`default_controller`] with its token bucket on `clock`, for tests on a
/// [`FakeClock`](crate::clock::FakeClock).
pub fn default_controller_with_clock<T: Eq + Hash + Clone + Send + Sync + 'static>(
    clock: impl Clock,
) -> MaxOf<T> {
    MaxOf::new(vec![
        Box::new(ExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(TokenBucket::with_clock(10.0, 100, clock)),
    ])
}

/// client-go's `DefaultItemBasedRateLimiter`: per-item exponential backoff from 1 ms to
/// 1000 s.
pub fn default_item_based<T: Eq + Hash + Clone + Send + Sync + 'static>() -> ExponentialFailure<T> {
    ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1000))
}
