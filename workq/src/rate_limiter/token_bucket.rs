//! [`TokenBucket`]: client-go's `BucketRateLimiter` over `golang.org/x/time/rate`.
//!
//! Written by hand: the reservation semantics client-go relies on (`Reserve().Delay()`:
//! every call takes a token, going into debt, and waits for its turn) are not what
//! `governor` offers (a refused check there does not advance the state, so simultaneous
//! failures would all get the same wait). The arithmetic is `rate.Limiter.reserveN`'s.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::RateLimiter;
use crate::clock::{Clock, RealClock};

/// An overall rate limit: `qps` tokens per second, at most `burst` saved up.
///
/// Every call to `when` takes one token, whether or not one is there; if the bucket is in
/// debt the answer is how long until the token is paid back. A burst of `burst` calls at one
/// instant waits zero, and call `burst + k` waits `k / qps`. The item is ignored: every item
/// shares the bucket, so `num_requeues` is 0 and `forget` does nothing. This is client-go's
/// `BucketRateLimiter`, except that it runs on the queue's [`Clock`] (client-go's reads the
/// wall clock, so it cannot be tested with a fake one).
///
/// # Panics
///
/// [`new`](Self::new) and [`with_clock`](Self::with_clock) panic if `qps` is negative
/// (including `f64::NEG_INFINITY`) or NaN, or if `burst` is 0 while `qps` is positive and
/// finite (no call could ever get a token); the message names the bad value.
///
/// `qps == f64::INFINITY` never delays, whatever the burst (0 included): Go's
/// `rate.NewLimiter(rate.Inf, 0)`, "no limit". `qps == 0.0` gives the first `burst` calls no
/// delay and every later call [`Duration::MAX`] ("never", as `rate.Limiter` answers
/// `InfDuration`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::{clock::FakeClock, rate_limiter::{RateLimiter, TokenBucket}};
///
/// let clock = FakeClock::new();
/// let bucket = TokenBucket::with_clock(10.0, 2, clock.clone());
/// assert_eq!(bucket.when(&"a"), Duration::ZERO);
/// assert_eq!(bucket.when(&"b"), Duration::ZERO);
/// assert_eq!(bucket.when(&"c"), Duration::from_millis(100));
/// clock.step(Duration::from_secs(1));
/// assert_eq!(bucket.when(&"d"), Duration::ZERO);
/// ```
pub struct TokenBucket {
    qps: f64,
    burst: usize,
    clock: Arc<dyn Clock>,
    /// Tokens (negative when in debt) as of `last`.
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Creates a bucket on the real clock, full.
    ///
    /// # Panics
    ///
    /// See the [type documentation](Self#panics).
    pub fn new(qps: f64, burst: usize) -> Self {
        Self::with_clock(qps, burst, RealClock)
    }

    /// Creates a bucket on `clock`, full.
    ///
    /// # Panics
    ///
    /// See the [type documentation](Self#panics).
    pub fn with_clock(qps: f64, burst: usize, clock: impl Clock) -> Self {
        assert!(
            !qps.is_nan() && qps >= 0.0,
            "TokenBucket: qps must be zero or positive, got {qps}"
        );
        assert!(
            burst > 0 || qps == 0.0 || qps == f64::INFINITY,
            "TokenBucket: burst must be at least 1 when qps is positive and finite \
             (got qps {qps}, burst 0)"
        );
        let last = clock.now();
        Self {
            qps,
            burst,
            clock: Arc::new(clock),
            state: Mutex::new(BucketState {
                tokens: burst as f64,
                last,
            }),
        }
    }

    /// The rate, in tokens per second.
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// The most tokens the bucket holds.
    pub fn burst(&self) -> usize {
        self.burst
    }

    /// Takes one token and returns how long until it is there.
    fn reserve(&self) -> Duration {
        if self.qps == f64::INFINITY {
            return Duration::ZERO;
        }
        let now = self.clock.now();
        let mut state = self.state.lock();
        if self.qps == 0.0 {
            // rate.Limiter with a zero limit: the burst is all there will ever be.
            if state.tokens >= 1.0 {
                state.tokens -= 1.0;
                return Duration::ZERO;
            }
            return Duration::MAX;
        }
        let elapsed = now.saturating_duration_since(state.last).as_secs_f64();
        let burst = self.burst as f64;
        let mut tokens = state.tokens;
        if tokens < burst {
            tokens = (tokens + elapsed * self.qps).min(burst);
        }
        tokens -= 1.0;
        state.tokens = tokens;
        if now > state.last {
            state.last = now;
        }
        if tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(-tokens / self.qps).unwrap_or(Duration::MAX)
    }
}

impl<T> RateLimiter<T> for TokenBucket {
    fn when(&self, _item: &T) -> Duration {
        self.reserve()
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> usize {
        0
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .field("state", &*self.state.lock())
            .finish()
    }
}
