//! [`RateLimit`]: the server-side rate limiter behind `add_rate_limited`.

use std::time::Duration;

/// The rate limiter of [`RedisQueue::add_rate_limited`](crate::RedisQueue::add_rate_limited),
/// evaluated on the server so that every process shares one failure count per item and one
/// token bucket per queue.
///
/// The delay is the larger of a per-item exponential backoff (`base * 2^failures`, capped at
/// `max`: client-go's `ItemExponentialFailureRateLimiter`) and, if set, the wait for a token of
/// a queue-wide bucket (client-go's `BucketRateLimiter`, `rate.Limiter` reservations). So
/// [`RateLimit::default_controller`] is client-go's `DefaultControllerRateLimiter`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq_redis::RateLimit;
///
/// let limit = RateLimit::exponential(Duration::from_millis(5), Duration::from_secs(60))
///     .with_bucket(10.0, 100);
/// assert_eq!(limit.base_delay(), Duration::from_millis(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    base: Duration,
    max: Duration,
    bucket: Option<(f64, u32)>,
}

impl RateLimit {
    /// Exponential per-item backoff only: `base * 2^failures`, capped at `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        RateLimit {
            base,
            max,
            bucket: None,
        }
    }

    /// Also waits for a token of a queue-wide bucket of `qps` tokens per second holding at
    /// most `burst`.
    ///
    /// # Panics
    ///
    /// If `qps` is not a positive finite number or `burst` is 0.
    #[must_use]
    pub fn with_bucket(mut self, qps: f64, burst: u32) -> Self {
        assert!(
            qps.is_finite() && qps > 0.0,
            "the bucket's rate must be positive"
        );
        assert!(burst > 0, "the bucket's burst must be positive");
        self.bucket = Some((qps, burst));
        self
    }

    /// client-go's `DefaultControllerRateLimiter`: 5 ms doubling up to 1000 s, and a bucket of
    /// 10 per second with a burst of 100.
    pub fn default_controller() -> Self {
        Self::exponential(Duration::from_millis(5), Duration::from_secs(1000))
            .with_bucket(10.0, 100)
    }

    /// client-go's `DefaultItemBasedRateLimiter`: 1 ms doubling up to 1000 s.
    pub fn default_item_based() -> Self {
        Self::exponential(Duration::from_millis(1), Duration::from_secs(1000))
    }

    /// The first delay of the exponential backoff.
    pub fn base_delay(&self) -> Duration {
        self.base
    }

    /// The cap of the exponential backoff.
    pub fn max_delay(&self) -> Duration {
        self.max
    }

    /// The bucket's rate and burst, if there is a bucket.
    pub fn bucket(&self) -> Option<(f64, u32)> {
        self.bucket
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::default_controller()
    }
}
