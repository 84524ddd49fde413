//! [`Jitter`]: randomises another limiter's delays so that items failing together do not
//! retry together. client-go has no such limiter.
//!
//! The random numbers come from a SplitMix64 generator kept in one atomic word: lock-free,
//! seedable for tests, and a few lines instead of a dependency on `rand` (the quality needed
//! here is "spread delays evenly", not cryptography).

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::RateLimiter;

/// How [`Jitter`] randomises a delay `d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JitterMode {
    /// A delay drawn evenly from `[0, d)` ("full jitter"). Spreads retries the most; the
    /// average wait halves, and a retry may come at once.
    Full,
    /// `d` plus up to `factor * d`: a delay drawn evenly from `[d, d + factor * d)`, as
    /// `k8s.io/apimachinery`'s `wait.Jitter` does. Never shorter than the inner limiter's
    /// delay, so it may exceed that limiter's maximum by up to `factor`.
    Proportional(f64),
}

/// Wraps a rate limiter and randomises each delay it gives.
///
/// A thousand objects that fail at the same moment (the API server restarted, a webhook
/// timed out) get identical delays from [`ExponentialFailure`](super::ExponentialFailure),
/// so they retry in lockstep, fail together again, and hammer the server in waves. `Jitter`
/// spreads each wave over the whole delay ([`JitterMode::Full`]) or over a fraction of it
/// ([`JitterMode::Proportional`]). Failure counts, [`forget`](RateLimiter::forget) and
/// [`num_requeues`](RateLimiter::num_requeues) are the inner limiter's.
///
/// # Default
///
/// Seeded from the operating system's randomness (through `std`'s `RandomState`), so two
/// processes draw different delays. [`with_seed`](Self::with_seed) makes the sequence
/// reproducible, for tests.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::WorkQueue;
/// use workq::rate_limiter::{ExponentialFailure, Jitter, RateLimiter};
///
/// // client-go's per-item backoff, with full jitter.
/// let limiter = Jitter::full(ExponentialFailure::new(
///     Duration::from_millis(5),
///     Duration::from_secs(1000),
/// ))
/// .with_seed(7);
/// let first = limiter.when(&"default/web-0");
/// assert!(first < Duration::from_millis(5));
/// assert_eq!(limiter.num_requeues(&"default/web-0"), 1);
///
/// let queue: WorkQueue<&str> = WorkQueue::builder().rate_limiter(limiter).build();
/// ```
///
/// Proportional jitter keeps at least the inner delay:
///
/// ```
/// use std::time::Duration;
/// use workq::rate_limiter::{FastSlow, Jitter, RateLimiter};
///
/// let limiter = Jitter::proportional(
///     FastSlow::new(Duration::from_millis(100), Duration::from_secs(10), 3),
///     0.2,
/// );
/// let delay = limiter.when(&"default/web-0");
/// assert!(delay >= Duration::from_millis(100) && delay < Duration::from_millis(120));
/// ```
pub struct Jitter<L> {
    inner: L,
    mode: JitterMode,
    /// SplitMix64 state: each draw adds the golden-ratio increment and mixes the result.
    state: AtomicU64,
}

/// SplitMix64's increment (2^64 / golden ratio).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The next 53 bits of the SplitMix64 generator whose state is `state` (a fraction
/// `bits / 2^53` drawn evenly from `[0, 1)`); also the periodic runners' jitter.
pub(crate) fn bits53(state: &AtomicU64) -> u64 {
    let mut z = state
        .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
        .wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z >> 11
}

/// A seed from the operating system's randomness (through `std`'s `RandomState`), so that
/// two processes draw different numbers.
pub(crate) fn random_seed() -> u64 {
    RandomState::new().build_hasher().finish()
}

impl<L> Jitter<L> {
    /// Draws each delay evenly from `[0, d)`, where `d` is `inner`'s delay.
    pub fn full(inner: L) -> Self {
        Self::with_mode(inner, JitterMode::Full)
    }

    /// Draws each delay evenly from `[d, d + factor * d)`, where `d` is `inner`'s delay.
    ///
    /// # Panics
    ///
    /// If `factor` is negative, infinite or NaN.
    pub fn proportional(inner: L, factor: f64) -> Self {
        Self::with_mode(inner, JitterMode::Proportional(factor))
    }

    /// Randomises `inner`'s delays as `mode` says.
    ///
    /// # Panics
    ///
    /// If `mode` is [`JitterMode::Proportional`] with a negative, infinite or NaN factor.
    pub fn with_mode(inner: L, mode: JitterMode) -> Self {
        if let JitterMode::Proportional(factor) = mode {
            assert!(
                factor.is_finite() && factor >= 0.0,
                "jitter factor must be finite and not negative, got {factor}"
            );
        }
        Self {
            inner,
            mode,
            state: AtomicU64::new(random_seed()),
        }
    }

    /// Seeds the random numbers, so that the same sequence of calls gives the same delays.
    #[must_use]
    pub fn with_seed(self, seed: u64) -> Self {
        self.state.store(seed, Ordering::Relaxed);
        self
    }

    /// The wrapped limiter.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// How delays are randomised.
    pub fn mode(&self) -> JitterMode {
        self.mode
    }

    /// 53 random bits: a fraction `bits / 2^53` drawn evenly from `[0, 1)`.
    fn bits53(&self) -> u64 {
        bits53(&self.state)
    }

    /// Applies the jitter to `delay`.
    fn jitter(&self, delay: Duration) -> Duration {
        if delay.is_zero() {
            return delay;
        }
        let bits = self.bits53();
        let unit = bits as f64 / (1u64 << 53) as f64;
        match self.mode {
            JitterMode::Full => match u64::try_from(delay.as_nanos()) {
                // Exact integer arithmetic: the result is strictly below `delay`.
                Ok(nanos) => {
                    Duration::from_nanos(((u128::from(nanos) * u128::from(bits)) >> 53) as u64)
                }
                Err(_) => Duration::try_from_secs_f64(delay.as_secs_f64() * unit).unwrap_or(delay),
            },
            JitterMode::Proportional(factor) => {
                let extra = Duration::try_from_secs_f64(delay.as_secs_f64() * factor * unit)
                    .unwrap_or(Duration::MAX);
                delay.saturating_add(extra)
            }
        }
    }
}

impl<T, L: RateLimiter<T>> RateLimiter<T> for Jitter<L> {
    fn when(&self, item: &T) -> Duration {
        self.jitter(self.inner.when(item))
    }

    fn forget(&self, item: &T) {
        self.inner.forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.inner.num_requeues(item)
    }
}

impl<L: fmt::Debug> fmt::Debug for Jitter<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jitter")
            .field("inner", &self.inner)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::rate_limiter::ExponentialFailure;

    fn exponential() -> ExponentialFailure<u32> {
        ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1000))
    }

    #[test]
    fn same_seed_gives_same_delays() {
        let a = Jitter::full(exponential()).with_seed(42);
        let b = Jitter::full(exponential()).with_seed(42);
        for item in 0..100 {
            assert_eq!(a.when(&item), b.when(&item));
        }
        let c = Jitter::full(exponential()).with_seed(43);
        let differ = (0..100).filter(|item| a.when(item) != c.when(item)).count();
        assert!(differ > 90, "different seeds should give different delays");
    }

    #[test]
    fn full_jitter_stays_below_the_inner_delay() {
        let limiter = Jitter::full(exponential()).with_seed(1);
        for failure in 0..20u32 {
            let expected = Duration::from_millis(5) * 2u32.pow(failure);
            let expected = expected.min(Duration::from_secs(1000));
            let delay = limiter.when(&0);
            assert!(
                delay < expected,
                "failure {failure}: {delay:?} >= {expected:?}"
            );
        }
    }

    #[test]
    fn proportional_jitter_stays_within_its_factor() {
        let limiter = Jitter::proportional(exponential(), 0.5).with_seed(1);
        for item in 0..1000 {
            let delay = limiter.when(&item);
            assert!(delay >= Duration::from_millis(5));
            assert!(delay < Duration::from_micros(7500));
        }
    }

    #[test]
    fn a_thousand_items_failing_together_do_not_retry_together() {
        let limiter = Jitter::full(exponential()).with_seed(9);
        // Every item has failed four times: without jitter each waits exactly 40 ms.
        let delays: Vec<Duration> = (0..1000)
            .map(|item| {
                for _ in 0..3 {
                    limiter.when(&item);
                }
                limiter.when(&item)
            })
            .collect();
        let distinct: HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 990);
        // Spread evenly: each 4 ms tenth of [0, 40 ms) holds about a hundred retries.
        let mut tenths = [0usize; 10];
        for delay in &delays {
            tenths[(delay.as_micros() / 4000) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (60..=140).contains(&n)),
            "{tenths:?}"
        );
    }

    #[test]
    fn counts_and_forget_are_the_inner_limiters() {
        let limiter = Jitter::full(exponential());
        limiter.when(&1);
        limiter.when(&1);
        assert_eq!(limiter.num_requeues(&1), 2);
        assert_eq!(limiter.inner().num_requeues(&1), 2);
        limiter.forget(&1);
        assert_eq!(limiter.num_requeues(&1), 0);
    }

    #[test]
    fn zero_and_huge_delays_are_safe() {
        let zero = Jitter::full(ExponentialFailure::<u32>::new(
            Duration::ZERO,
            Duration::ZERO,
        ));
        assert_eq!(zero.when(&1), Duration::ZERO);
        let huge = Jitter::proportional(
            ExponentialFailure::<u32>::new(Duration::MAX, Duration::MAX),
            1.0,
        );
        assert_eq!(huge.when(&1), Duration::MAX);
        let full = Jitter::full(ExponentialFailure::<u32>::new(Duration::MAX, Duration::MAX));
        assert!(full.when(&1) < Duration::MAX);
    }

    #[test]
    #[should_panic(expected = "jitter factor")]
    fn negative_factor_panics() {
        let _ = Jitter::proportional(exponential(), -0.1);
    }
}
