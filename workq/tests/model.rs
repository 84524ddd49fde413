//! Property tests: random operation sequences against plain sequential models.
//!
//! `queue_agrees_with_sequential_model` runs random sequences of `add`, `add_after`,
//! `add_rate_limited`, `add_with` (delay and rate limit together), gets of all three kinds,
//! lease drops, `forget`, fake clock steps and `shut_down` against a [`WorkQueue`] on a
//! [`FakeClock`] and against [`Model`], a few `VecDeque`s and maps that spell out the
//! documented rules one by one. After every step `len`, `delayed_len`, `processing_len`,
//! `tracked_len`, `is_shutting_down` and `num_requeues` of every key agree; every get
//! compares what the queue hands out (or its error) with the model's answer; at the end the
//! whole ready order is drained and compared.
//!
//! The limiter properties run each rate limiter against its formula: client-go's
//! exponential backoff and fast/slow counts (with this crate's bound on tracked items),
//! `rate.Limiter`'s reservation arithmetic in exact integers, `MaxOf`, `WithMaxWait`, and the
//! bounds `Jitter` promises.
//!
//! Each property runs [`CASES`] cases (more with `PROPTEST_CASES`). Failures are persisted in
//! `proptest-regressions/model.txt` (committed) and replayed first on every run.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use workq::clock::FakeClock;
use workq::rate_limiter::{
    ExponentialFailure, FastSlow, Jitter, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
};
use workq::{AddOptions, Lease, TryGetError, WorkQueue};

/// Cases per property in every run, CI included; `PROPTEST_CASES` can only raise it.
const CASES: u32 = 2000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .map_or(CASES, |cases: u32| cases.max(CASES));
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..ProptestConfig::default()
    }
}

const MS: u64 = 1_000_000;

/// Keys are small numbers so that sequences hit the same key often.
type Key = u8;
const KEYS: Key = 5;

// ===== the rate limiters' formulas =====

/// `base * 2^exponent` capped at `max`, in exact integers (client-go's
/// `ItemExponentialFailureRateLimiter`, whose float arithmetic falls back to `max` once the
/// value no longer fits).
fn backoff_ns(base: u64, exponent: usize, max: u64) -> u64 {
    if base == 0 {
        return 0;
    }
    if exponent >= 64 {
        return max;
    }
    let nanos = u128::from(base) << exponent;
    u64::try_from(nanos).map_or(max, |nanos| nanos.min(max))
}

/// The per-item limiters' bookkeeping: failures per item, for the `max_tracked` items that
/// failed most recently.
#[derive(Debug, Clone)]
struct Failures {
    counts: BTreeMap<Key, usize>,
    /// Tracked keys, least recently failed first.
    recency: Vec<Key>,
    max_tracked: usize,
}

impl Failures {
    fn new(max_tracked: usize) -> Self {
        Self {
            counts: BTreeMap::new(),
            recency: Vec::new(),
            max_tracked,
        }
    }

    /// Counts one more failure of `key` and returns the failures before this one. A new key
    /// failing while `max_tracked` keys are counted evicts the least recently failed key;
    /// with `max_tracked == 0` nothing is counted.
    fn fail(&mut self, key: Key) -> usize {
        if let Some(count) = self.counts.get_mut(&key) {
            *count += 1;
            self.recency.retain(|&k| k != key);
            self.recency.push(key);
            return *count - 1;
        }
        if self.max_tracked == 0 {
            return 0;
        }
        if self.counts.len() >= self.max_tracked {
            let oldest = self.recency.remove(0);
            self.counts.remove(&oldest);
        }
        self.counts.insert(key, 1);
        self.recency.push(key);
        0
    }

    fn forget(&mut self, key: Key) {
        self.counts.remove(&key);
        self.recency.retain(|&k| k != key);
    }

    fn num_requeues(&self, key: Key) -> usize {
        self.counts.get(&key).copied().unwrap_or(0)
    }
}

/// A per-item limiter's formula.
#[derive(Debug, Clone)]
enum LimiterModel {
    /// `ExponentialFailure`: `base * 2^failures`, capped; a full limiter evicts the least
    /// recently failed key.
    Exponential {
        base: u64,
        max: u64,
        failures: Failures,
    },
    /// `FastSlow`: `fast` for the first `attempts` failures, then `slow`; a full limiter
    /// evicts the least recently failed key.
    FastSlow {
        fast: u64,
        slow: u64,
        attempts: usize,
        failures: Failures,
    },
}

impl LimiterModel {
    fn when(&mut self, key: Key) -> Duration {
        let nanos = match self {
            LimiterModel::Exponential {
                base,
                max,
                failures,
            } => backoff_ns(*base, failures.fail(key), *max),
            LimiterModel::FastSlow {
                fast,
                slow,
                attempts,
                failures,
            } => {
                if failures.fail(key) < *attempts {
                    *fast
                } else {
                    *slow
                }
            }
        };
        Duration::from_nanos(nanos)
    }

    fn failures(&mut self) -> &mut Failures {
        match self {
            LimiterModel::Exponential { failures, .. }
            | LimiterModel::FastSlow { failures, .. } => failures,
        }
    }

    fn forget(&mut self, key: Key) {
        self.failures().forget(key);
    }

    fn num_requeues(&mut self, key: Key) -> usize {
        self.failures().num_requeues(key)
    }

    fn tracked(&mut self) -> usize {
        self.failures().counts.len()
    }

    /// The real limiter with the same parameters.
    fn build(&self) -> Arc<dyn RateLimiter<Key>> {
        match self {
            LimiterModel::Exponential {
                base,
                max,
                failures,
            } => Arc::new(
                ExponentialFailure::new(Duration::from_nanos(*base), Duration::from_nanos(*max))
                    .with_max_tracked(failures.max_tracked),
            ),
            LimiterModel::FastSlow {
                fast,
                slow,
                attempts,
                failures,
            } => Arc::new(
                FastSlow::new(
                    Duration::from_nanos(*fast),
                    Duration::from_nanos(*slow),
                    *attempts,
                )
                .with_max_tracked(failures.max_tracked),
            ),
        }
    }
}

fn max_tracked() -> impl Strategy<Value = usize> {
    prop_oneof![1 => 0..=3usize, 3 => Just(usize::MAX)]
}

/// A per-item limiter with small delays (whole milliseconds, so the queue's fake clock steps
/// hit due times exactly).
fn queue_limiter() -> impl Strategy<Value = LimiterModel> {
    prop_oneof![
        (0..=3u64, 0..=16u64, max_tracked()).prop_map(|(base, max, tracked)| {
            LimiterModel::Exponential {
                base: base * MS,
                max: max * MS,
                failures: Failures::new(tracked),
            }
        }),
        (0..=3u64, 0..=16u64, 0..=3usize, max_tracked()).prop_map(
            |(fast, slow, attempts, tracked)| LimiterModel::FastSlow {
                fast: fast * MS,
                slow: slow * MS,
                attempts,
                failures: Failures::new(tracked),
            }
        ),
    ]
}

// ===== the queue's model =====

/// The queue's documented rules, written for clarity: which collection an item is in says
/// what state it is in (see `state/mod.rs`'s table and the crate docs' "Coming from client-go").
#[derive(Debug)]
struct Model {
    /// Fake time, in nanoseconds since the queue was built.
    now: u64,
    /// Items waiting to be handed out, in hand-out order.
    ready: VecDeque<Key>,
    /// Items waiting for a delay: (due time, order in which the item entered this map).
    /// An item being processed may also be here (a delayed re-add).
    delayed: BTreeMap<Key, (u64, u64)>,
    /// Entry order for `delayed`.
    next_seq: u64,
    /// Items whose lease is out.
    processing: BTreeSet<Key>,
    /// Items re-added while processing: queued again when the lease drops.
    dirty: BTreeSet<Key>,
    /// After shut down adds are ignored.
    shut: bool,
    limiter: LimiterModel,
}

impl Model {
    fn new(limiter: LimiterModel) -> Self {
        Self {
            now: 0,
            ready: VecDeque::new(),
            delayed: BTreeMap::new(),
            next_seq: 0,
            processing: BTreeSet::new(),
            dirty: BTreeSet::new(),
            shut: false,
            limiter,
        }
    }

    fn add(&mut self, key: Key) {
        if self.shut {
            return;
        }
        if self.processing.contains(&key) {
            // Queued again when the lease drops; a pending delayed re-add is now moot.
            self.dirty.insert(key);
            self.delayed.remove(&key);
            return;
        }
        if self.ready.contains(&key) {
            return; // dedup
        }
        // New, or delayed: ready now, and the delay is dropped (processed once).
        self.delayed.remove(&key);
        self.ready.push_back(key);
    }

    fn add_after(&mut self, key: Key, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        if self.shut {
            return;
        }
        if self.ready.contains(&key) || self.dirty.contains(&key) {
            return; // queued, or due again when its lease drops: nothing is sooner
        }
        let due = self.now + u64::try_from(delay.as_nanos()).unwrap();
        match self.delayed.get_mut(&key) {
            Some((at, _)) => *at = (*at).min(due), // earliest wins
            None => {
                self.delayed.insert(key, (due, self.next_seq));
                self.next_seq += 1;
            }
        }
    }

    fn add_rate_limited(&mut self, key: Key) {
        let delay = self.limiter.when(key); // asked even after shut down
        self.add_after(key, delay);
    }

    /// `add_with(key, AddOptions::default().after(after).rate_limited())`: the shorter delay
    /// wins.
    fn add_after_or_rate_limited(&mut self, key: Key, after: Duration) {
        let limited = self.limiter.when(key);
        let delay = if after.is_zero() {
            limited
        } else {
            after.min(limited)
        };
        self.add_after(key, delay);
    }

    fn step(&mut self, by: Duration) {
        self.now += u64::try_from(by.as_nanos()).unwrap();
        let mut due: Vec<(u64, u64, Key)> = self
            .delayed
            .iter()
            .filter(|(_, (at, _))| *at <= self.now)
            .map(|(&key, &(at, seq))| (at, seq, key))
            .collect();
        // Earliest due first, ties in entry order, behind the items already ready.
        due.sort_unstable();
        for (_, _, key) in due {
            self.delayed.remove(&key);
            if self.processing.contains(&key) {
                self.dirty.insert(key);
            } else {
                self.ready.push_back(key);
            }
        }
    }

    fn get(&mut self) -> Result<Key, TryGetError> {
        match self.ready.pop_front() {
            Some(key) => {
                self.processing.insert(key);
                Ok(key)
            }
            None if self.shut => Err(TryGetError::ShutDown),
            None => Err(TryGetError::Empty),
        }
    }

    fn done(&mut self, key: Key) {
        assert!(self.processing.remove(&key));
        if self.dirty.remove(&key) {
            self.ready.push_back(key); // at the tail, even after shut down
        }
        // A pending delayed re-add (not dirty) stays delayed.
    }

    fn shut_down(&mut self) {
        self.shut = true;
        self.delayed.clear();
    }

    fn tracked(&self) -> usize {
        let mut all: BTreeSet<Key> = self.ready.iter().copied().collect();
        all.extend(self.delayed.keys().copied());
        all.extend(self.processing.iter().copied());
        all.len()
    }
}

/// How a get is made.
#[derive(Debug, Clone, Copy)]
enum GetKind {
    Try,
    /// `blocking_get`, only when the model says it returns at once.
    Blocking,
    /// `get().await` polled once; it must be ready exactly when the model says so.
    Async,
}

#[derive(Debug, Clone)]
enum Op {
    Add(Key),
    AddAfter(Key, u64),
    AddRateLimited(Key),
    AddWithAfterRateLimited(Key, u64),
    Get(GetKind),
    /// Drops the lease at this index (modulo the leases held).
    DropLease(usize),
    Forget(Key),
    /// Steps the fake clock this many milliseconds.
    Step(u64),
    ShutDown,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        5 => key.clone().prop_map(Op::Add),
        5 => (key.clone(), 0..=12u64).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
        4 => key.clone().prop_map(Op::AddRateLimited),
        1 => (key.clone(), 0..=12u64).prop_map(|(k, ms)| Op::AddWithAfterRateLimited(k, ms)),
        4 => Just(Op::Get(GetKind::Try)),
        1 => Just(Op::Get(GetKind::Blocking)),
        1 => Just(Op::Get(GetKind::Async)),
        5 => any::<usize>().prop_map(Op::DropLease),
        2 => key.prop_map(Op::Forget),
        4 => (0..=10u64).prop_map(Op::Step),
        1 => Just(Op::ShutDown),
    ]
}

/// Runs `op` on the queue and the model, and compares what a get returns.
fn apply(
    op: &Op,
    queue: &WorkQueue<Key>,
    clock: &FakeClock,
    model: &mut Model,
    leases: &mut Vec<Lease<Key>>,
) -> Result<(), TestCaseError> {
    match *op {
        Op::Add(key) => {
            queue.add(key);
            model.add(key);
        }
        Op::AddAfter(key, ms) => {
            let delay = Duration::from_millis(ms);
            queue.add_after(key, delay);
            model.add_after(key, delay);
        }
        Op::AddRateLimited(key) => {
            queue.add_rate_limited(key);
            model.add_rate_limited(key);
        }
        Op::AddWithAfterRateLimited(key, ms) => {
            let after = Duration::from_millis(ms);
            queue.add_with(key, AddOptions::default().after(after).rate_limited());
            model.add_after_or_rate_limited(key, after);
        }
        Op::Get(kind) => {
            let expected = model.get();
            let got: Result<Lease<Key>, TryGetError> = match kind {
                GetKind::Try => queue.try_get(),
                // With nothing ready and no shut down, blocking_get would wait forever.
                GetKind::Blocking if expected == Err(TryGetError::Empty) => queue.try_get(),
                GetKind::Blocking => queue.blocking_get().ok_or(TryGetError::ShutDown),
                GetKind::Async => {
                    let mut future = Box::pin(queue.get());
                    let mut cx = Context::from_waker(Waker::noop());
                    match future.as_mut().poll(&mut cx) {
                        Poll::Ready(Some(lease)) => Ok(lease),
                        Poll::Ready(None) => Err(TryGetError::ShutDown),
                        // Dropping the pending future must leave the queue as it was.
                        Poll::Pending => Err(TryGetError::Empty),
                    }
                }
            };
            match got {
                Ok(lease) => {
                    prop_assert_eq!(Ok(*lease), expected);
                    leases.push(lease);
                }
                Err(err) => prop_assert_eq!(Err(err), expected),
            }
        }
        Op::DropLease(index) => {
            if !leases.is_empty() {
                let lease = leases.remove(index % leases.len());
                model.done(*lease);
                drop(lease);
            }
        }
        Op::Forget(key) => {
            queue.forget(&key);
            model.limiter.forget(key);
        }
        Op::Step(ms) => {
            let by = Duration::from_millis(ms);
            clock.step(by);
            model.step(by);
        }
        Op::ShutDown => {
            queue.shut_down();
            model.shut_down();
        }
    }
    Ok(())
}

/// Everything observable without changing the queue agrees with the model.
fn check(queue: &WorkQueue<Key>, model: &mut Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(queue.len(), model.ready.len(), "len");
    prop_assert_eq!(queue.is_empty(), model.ready.is_empty(), "is_empty");
    prop_assert_eq!(queue.delayed_len(), model.delayed.len(), "delayed_len");
    prop_assert_eq!(
        queue.processing_len(),
        model.processing.len(),
        "processing_len"
    );
    prop_assert_eq!(queue.tracked_len(), model.tracked(), "tracked_len");
    prop_assert_eq!(queue.is_shutting_down(), model.shut, "is_shutting_down");
    for key in 0..KEYS {
        prop_assert_eq!(
            queue.num_requeues(&key),
            model.limiter.num_requeues(key),
            "num_requeues({})",
            key
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn queue_agrees_with_sequential_model(
        limiter in queue_limiter(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let clock = FakeClock::new();
        let queue: WorkQueue<Key> = WorkQueue::builder()
            .clock(clock.clone())
            .rate_limiter(limiter.build())
            .build();
        let mut model = Model::new(limiter);
        let mut leases = Vec::new();

        for op in &ops {
            apply(op, &queue, &clock, &mut model, &mut leases)?;
            check(&queue, &mut model)?;
        }

        // Finish: drop every lease, let every delay pass, then hand out everything left, one
        // at a time, and compare the whole order.
        for lease in leases.drain(..) {
            model.done(*lease);
        }
        let forever = Duration::from_secs(3600);
        clock.step(forever);
        model.step(forever);
        check(&queue, &mut model)?;
        loop {
            let expected = model.get();
            match queue.try_get() {
                Ok(lease) => {
                    prop_assert_eq!(Ok(*lease), expected);
                    model.done(*lease);
                }
                Err(err) => {
                    prop_assert_eq!(Err(err), expected);
                    break;
                }
            }
        }
        prop_assert_eq!(queue.tracked_len(), 0);
    }
}

// ===== rate limiters against their formulas =====

#[derive(Debug, Clone)]
enum LimiterOp {
    When(Key),
    /// `when` this many times in a row: reaches the cap and large exponents quickly.
    WhenTimes(Key, usize),
    Forget(Key),
}

fn limiter_op() -> impl Strategy<Value = LimiterOp> {
    prop_oneof![
        6 => (0..KEYS).prop_map(LimiterOp::When),
        1 => (0..KEYS, 1..90usize).prop_map(|(k, n)| LimiterOp::WhenTimes(k, n)),
        2 => (0..KEYS).prop_map(LimiterOp::Forget),
    ]
}

/// Delays in nanoseconds: zero, odd values, whole milliseconds, up to an hour, and the
/// largest (where `base * 2^n` overflows before it reaches the cap).
fn nanos() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        1..=5_000u64,
        (1..=1_000u64).prop_map(|ms| ms * MS),
        1..=3_600_000_000_000u64,
    ]
}

/// Drives `limiter` and `model` with `ops`, comparing delays, counts and tracked items.
fn run_per_item_limiter(
    limiter: &dyn RateLimiter<Key>,
    tracked: &dyn Fn() -> usize,
    model: &mut LimiterModel,
    ops: &[LimiterOp],
) -> Result<(), TestCaseError> {
    for op in ops {
        match *op {
            LimiterOp::When(key) => prop_assert_eq!(limiter.when(&key), model.when(key)),
            LimiterOp::WhenTimes(key, times) => {
                for _ in 0..times {
                    prop_assert_eq!(limiter.when(&key), model.when(key));
                }
            }
            LimiterOp::Forget(key) => {
                limiter.forget(&key);
                model.forget(key);
            }
        }
        for key in 0..KEYS {
            prop_assert_eq!(limiter.num_requeues(&key), model.num_requeues(key));
        }
        prop_assert_eq!(tracked(), model.tracked());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn exponential_failure_follows_its_formula(
        base in nanos(),
        max in nanos(),
        max_tracked in max_tracked(),
        ops in prop::collection::vec(limiter_op(), 1..40),
    ) {
        let limiter = ExponentialFailure::new(Duration::from_nanos(base), Duration::from_nanos(max))
            .with_max_tracked(max_tracked);
        let mut model = LimiterModel::Exponential { base, max, failures: Failures::new(max_tracked) };
        run_per_item_limiter(&limiter, &|| limiter.tracked(), &mut model, &ops)?;
    }

    #[test]
    fn fast_slow_follows_its_formula(
        fast in nanos(),
        slow in nanos(),
        attempts in 0..6usize,
        max_tracked in max_tracked(),
        ops in prop::collection::vec(limiter_op(), 1..40),
    ) {
        let limiter = FastSlow::new(Duration::from_nanos(fast), Duration::from_nanos(slow), attempts)
            .with_max_tracked(max_tracked);
        let mut model = LimiterModel::FastSlow { fast, slow, attempts, failures: Failures::new(max_tracked) };
        run_per_item_limiter(&limiter, &|| limiter.tracked(), &mut model, &ops)?;
    }

    #[test]
    fn max_of_takes_the_largest_delay_and_count(
        base in nanos(),
        max in nanos(),
        fast in nanos(),
        slow in nanos(),
        attempts in 0..6usize,
        ops in prop::collection::vec(limiter_op(), 1..40),
    ) {
        let exponential = Arc::new(ExponentialFailure::new(Duration::from_nanos(base), Duration::from_nanos(max)));
        let fast_slow = Arc::new(FastSlow::new(Duration::from_nanos(fast), Duration::from_nanos(slow), attempts));
        let limiter: MaxOf<Key> = MaxOf::new(vec![Box::new(exponential.clone()), Box::new(fast_slow.clone())]);
        let mut exp_model = LimiterModel::Exponential { base, max, failures: Failures::new(usize::MAX) };
        let mut fs_model = LimiterModel::FastSlow { fast, slow, attempts, failures: Failures::new(usize::MAX) };
        for op in &ops {
            let (key, times) = match *op {
                LimiterOp::When(key) => (key, 1),
                LimiterOp::WhenTimes(key, times) => (key, times),
                LimiterOp::Forget(key) => {
                    limiter.forget(&key);
                    exp_model.forget(key);
                    fs_model.forget(key);
                    (key, 0)
                }
            };
            for _ in 0..times {
                // Every limiter is asked, so both count the failure.
                let expected = exp_model.when(key).max(fs_model.when(key));
                prop_assert_eq!(limiter.when(&key), expected);
            }
            for key in 0..KEYS {
                let expected = exp_model.num_requeues(key).max(fs_model.num_requeues(key));
                prop_assert_eq!(limiter.num_requeues(&key), expected);
            }
            prop_assert_eq!(exponential.tracked(), exp_model.tracked());
            prop_assert_eq!(fast_slow.tracked(), fs_model.tracked());
        }
    }

    #[test]
    fn with_max_wait_caps_the_inner_delay(
        base in nanos(),
        max in nanos(),
        cap in nanos(),
        ops in prop::collection::vec(limiter_op(), 1..40),
    ) {
        let inner = Arc::new(ExponentialFailure::new(Duration::from_nanos(base), Duration::from_nanos(max)));
        let limiter = WithMaxWait::new(inner.clone(), Duration::from_nanos(cap));
        let mut model = LimiterModel::Exponential { base, max, failures: Failures::new(usize::MAX) };
        for op in &ops {
            let (key, times) = match *op {
                LimiterOp::When(key) => (key, 1),
                LimiterOp::WhenTimes(key, times) => (key, times),
                LimiterOp::Forget(key) => {
                    limiter.forget(&key);
                    model.forget(key);
                    (key, 0)
                }
            };
            for _ in 0..times {
                let expected = model.when(key).min(Duration::from_nanos(cap));
                prop_assert_eq!(limiter.when(&key), expected);
            }
            for key in 0..KEYS {
                prop_assert_eq!(limiter.num_requeues(&key), model.num_requeues(key));
            }
            prop_assert_eq!(inner.tracked(), model.tracked());
        }
    }

    #[test]
    fn jitter_stays_within_its_bounds(
        base in nanos(),
        max in nanos(),
        proportional in prop::option::of(0.0..4.0f64),
        seed in any::<u64>(),
        ops in prop::collection::vec(limiter_op(), 1..40),
    ) {
        let inner = ExponentialFailure::new(Duration::from_nanos(base), Duration::from_nanos(max));
        let limiter = match proportional {
            Some(factor) => Jitter::proportional(inner, factor),
            None => Jitter::full(inner),
        }
        .with_seed(seed);
        let mut model = LimiterModel::Exponential { base, max, failures: Failures::new(usize::MAX) };
        for op in &ops {
            let (key, times) = match *op {
                LimiterOp::When(key) => (key, 1),
                LimiterOp::WhenTimes(key, times) => (key, times),
                LimiterOp::Forget(key) => {
                    limiter.forget(&key);
                    model.forget(key);
                    (key, 0)
                }
            };
            for _ in 0..times {
                let exact = model.when(key);
                let delay = limiter.when(&key);
                match proportional {
                    // Full jitter: in [0, d), and 0 for d == 0.
                    None => prop_assert!(delay < exact || (exact.is_zero() && delay.is_zero()),
                        "full jitter of {:?} gave {:?}", exact, delay),
                    // Proportional: in [d, d + factor * d], give or take a nanosecond of
                    // float rounding at the top.
                    Some(factor) => {
                        let top = exact.as_secs_f64() * (1.0 + factor) + 1e-9;
                        prop_assert!(delay >= exact && delay.as_secs_f64() <= top,
                            "proportional jitter ({}) of {:?} gave {:?}", factor, exact, delay);
                    }
                }
            }
            for key in 0..KEYS {
                prop_assert_eq!(limiter.num_requeues(&key), model.num_requeues(key));
            }
        }
    }
}

// ===== the token bucket against rate.Limiter's reservation arithmetic =====

/// `rate.Limiter` with `qps = quarters / 4`, in exact integers: one token is `4e9` units and
/// the bucket refills `quarters` units per nanosecond.
#[derive(Debug)]
struct BucketModel {
    quarters: u64,
    burst: u64,
    /// Tokens in units, negative when in debt.
    units: i128,
    /// Time of the last reservation, in nanoseconds.
    last: u64,
}

const UNITS_PER_TOKEN: i128 = 4_000_000_000;

impl BucketModel {
    /// Takes one token at `now` and returns the wait in nanoseconds (exact, maybe
    /// fractional, as a rational `numerator / quarters`).
    fn reserve(&mut self, now: u64) -> (i128, i128) {
        let elapsed = i128::from(now - self.last);
        let full = i128::from(self.burst) * UNITS_PER_TOKEN;
        self.units = (self.units + elapsed * i128::from(self.quarters)).min(full);
        self.units -= UNITS_PER_TOKEN;
        self.last = now;
        if self.units >= 0 {
            (0, 1)
        } else {
            (-self.units, i128::from(self.quarters))
        }
    }
}

#[derive(Debug, Clone)]
enum BucketOp {
    When,
    WhenTimes(usize),
    /// Steps the clock this many nanoseconds.
    Step(u64),
}

fn bucket_op() -> impl Strategy<Value = BucketOp> {
    prop_oneof![
        4 => Just(BucketOp::When),
        1 => (1..40usize).prop_map(BucketOp::WhenTimes),
        3 => prop_oneof![0..=1_000u64, 0..=2_000_000_000u64].prop_map(BucketOp::Step),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_follows_reservation_arithmetic(
        quarters in 1..=400u64,
        burst in 1..=6u64,
        ops in prop::collection::vec(bucket_op(), 1..60),
    ) {
        let clock = FakeClock::new();
        let qps = quarters as f64 / 4.0;
        let bucket = TokenBucket::with_clock(qps, burst as usize, clock.clone());
        let mut model = BucketModel { quarters, burst, units: i128::from(burst) * UNITS_PER_TOKEN, last: 0 };
        let mut now = 0u64;
        for op in &ops {
            let times = match *op {
                BucketOp::When => 1,
                BucketOp::WhenTimes(times) => times,
                BucketOp::Step(ns) => {
                    clock.step(Duration::from_nanos(ns));
                    now += ns;
                    0
                }
            };
            for _ in 0..times {
                let (numerator, denominator) = model.reserve(now);
                let got = RateLimiter::<Key>::when(&bucket, &0);
                // The bucket computes in f64 seconds: allow a microsecond of rounding.
                let got_ns = i128::try_from(got.as_nanos()).unwrap();
                let diff = (got_ns * denominator - numerator).abs();
                prop_assert!(diff <= 1_000 * denominator,
                    "qps {} burst {}: expected {} ns, got {:?}", qps, burst,
                    numerator as f64 / denominator as f64, got);
            }
            prop_assert_eq!(RateLimiter::<Key>::num_requeues(&bucket, &0), 0);
        }
    }

    /// `qps == 0`: the burst, then never; `qps == inf`: never a delay.
    #[test]
    fn token_bucket_edge_rates(burst in 0..=5usize, calls in 0..20usize, infinite in any::<bool>()) {
        let clock = FakeClock::new();
        if infinite {
            let bucket = TokenBucket::with_clock(f64::INFINITY, burst.max(1), clock.clone());
            for _ in 0..calls {
                prop_assert_eq!(RateLimiter::<Key>::when(&bucket, &0), Duration::ZERO);
            }
        } else {
            let bucket = TokenBucket::with_clock(0.0, burst, clock.clone());
            for call in 0..calls {
                clock.step(Duration::from_secs(1)); // a zero rate never refills
                let expected = if call < burst { Duration::ZERO } else { Duration::MAX };
                prop_assert_eq!(RateLimiter::<Key>::when(&bucket, &0), expected);
            }
        }
    }
}
