//! Rate limiting beyond client-go's own tests: the token bucket's reservation arithmetic, the
//! default controller limiter under a burst of failures, overflow and `Duration::MAX`
//! everywhere, and `add_rate_limited` on a queue whose clock is fake.
//!
//! Expected numbers follow `golang.org/x/time/rate`'s `Reserve().Delay()`
//! and client-go's limiters.

use std::sync::Arc;
use std::time::Duration;

use workq::clock::FakeClock;
use workq::rate_limiter::{
    self, ExponentialFailure, FastSlow, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
};
use workq::{AddOptions, WorkQueue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The delay of one `when` call on a token bucket (the item is ignored).
fn reserve(bucket: &TokenBucket) -> Duration {
    RateLimiter::<()>::when(bucket, &())
}

// ===== TokenBucket =====

#[test]
fn token_bucket_burst_at_one_instant_waits_nothing() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 100, clock);
    for call in 1..=100 {
        assert_eq!(reserve(&bucket), Duration::ZERO, "call {call}");
    }
}

#[test]
fn token_bucket_call_burst_plus_k_waits_k_over_qps() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(4.0, 3, clock);
    for _ in 0..3 {
        assert_eq!(reserve(&bucket), Duration::ZERO);
    }
    // Calls 4, 5, ... go into debt one token each: call 3 + k waits k / 4 s.
    for k in 1..=12_u64 {
        assert_eq!(reserve(&bucket), ms(250 * k), "call {}", 3 + k);
    }
}

#[test]
fn token_bucket_10_qps_burst_100_call_101_waits_100_ms_and_call_200_waits_10_s() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 100, clock);
    let delays: Vec<_> = (1..=200).map(|_| reserve(&bucket)).collect();
    assert_eq!(delays[100], ms(100), "call 101");
    assert_eq!(delays[199], secs(10), "call 200");
}

#[test]
fn token_bucket_refills_as_the_fake_clock_steps() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 100, clock.clone());
    for _ in 0..100 {
        reserve(&bucket);
    }
    assert_eq!(
        reserve(&bucket),
        ms(100),
        "empty: the next token is 100 ms away"
    );

    // The bucket was one token in debt; 1.1 s pays it and earns 10 more.
    clock.step(ms(1100));
    for call in 1..=10 {
        assert_eq!(reserve(&bucket), Duration::ZERO, "refilled call {call}");
    }
    assert_eq!(reserve(&bucket), ms(100));
}

#[test]
fn token_bucket_refill_stops_at_burst() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 100, clock.clone());
    for _ in 0..100 {
        reserve(&bucket);
    }
    // An hour would earn 36 000 tokens; the bucket holds 100.
    clock.step(secs(3600));
    for _ in 0..100 {
        assert_eq!(reserve(&bucket), Duration::ZERO);
    }
    assert_eq!(reserve(&bucket), ms(100));
}

#[test]
fn token_bucket_debt_shrinks_as_the_clock_moves() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 100, clock.clone());
    for _ in 0..200 {
        reserve(&bucket);
    }
    // 100 tokens in debt. Five seconds pay 50 of them; the next call is 51 tokens behind.
    clock.step(secs(5));
    assert_eq!(reserve(&bucket), ms(5100));
}

#[test]
fn token_bucket_with_zero_qps_gives_the_burst_then_waits_forever() {
    let bucket = TokenBucket::with_clock(0.0, 2, FakeClock::new());
    assert_eq!(reserve(&bucket), Duration::ZERO);
    assert_eq!(reserve(&bucket), Duration::ZERO);
    assert_eq!(reserve(&bucket), Duration::MAX);
    assert_eq!(reserve(&bucket), Duration::MAX);
}

#[test]
fn token_bucket_with_zero_qps_and_zero_burst_always_waits_forever() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(0.0, 0, clock.clone());
    assert_eq!(reserve(&bucket), Duration::MAX);
    // No amount of time earns a token at rate zero.
    clock.step(secs(3600));
    assert_eq!(reserve(&bucket), Duration::MAX);
}

#[test]
fn token_bucket_with_a_vanishing_rate_saturates_at_duration_max() {
    let bucket = TokenBucket::with_clock(f64::MIN_POSITIVE, 1, FakeClock::new());
    assert_eq!(reserve(&bucket), Duration::ZERO);
    // The next token is 1e308 seconds away: more than a Duration holds.
    assert_eq!(reserve(&bucket), Duration::MAX);
}

#[test]
fn token_bucket_survives_the_longest_fake_clock_step() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(1e9, 10, clock.clone());
    for _ in 0..20 {
        reserve(&bucket);
    }
    clock.step(Duration::MAX);
    // A century at a billion tokens a second refills the bucket to its burst, no more.
    for _ in 0..10 {
        assert_eq!(reserve(&bucket), Duration::ZERO);
    }
    assert_eq!(reserve(&bucket), Duration::from_nanos(1));
}

#[test]
fn token_bucket_with_infinite_qps_never_waits() {
    let bucket = TokenBucket::with_clock(f64::INFINITY, 1, FakeClock::new());
    for _ in 0..10_000 {
        assert_eq!(reserve(&bucket), Duration::ZERO);
    }
}

#[test]
fn token_bucket_ignores_items() {
    let bucket = TokenBucket::with_clock(10.0, 1, FakeClock::new());
    assert_eq!(bucket.when(&"a"), Duration::ZERO);
    // Another item shares the same (now empty) bucket.
    assert_eq!(bucket.when(&"b"), ms(100));
    assert_eq!(bucket.num_requeues(&"a"), 0);
    bucket.forget(&"b");
    // Forget returns no token.
    assert_eq!(bucket.when(&"b"), ms(200));
}

#[test]
#[should_panic(expected = "qps")]
fn token_bucket_rejects_nan_qps() {
    let _ = TokenBucket::new(f64::NAN, 10);
}

#[test]
#[should_panic(expected = "qps")]
fn token_bucket_rejects_negative_qps() {
    let _ = TokenBucket::new(-1.0, 10);
}

#[test]
#[should_panic(expected = "qps")]
fn token_bucket_rejects_negative_infinite_qps() {
    let _ = TokenBucket::with_clock(f64::NEG_INFINITY, 10, FakeClock::new());
}

#[test]
#[should_panic(expected = "burst")]
fn token_bucket_rejects_zero_burst_with_positive_qps() {
    let _ = TokenBucket::new(10.0, 0);
}

// ===== default limiters =====

#[test]
fn default_controller_gives_150_simultaneous_failures_5_ms_then_bucket_delays() {
    let clock = FakeClock::new();
    let limiter = rate_limiter::default_controller_with_clock(clock);
    let delays: Vec<_> = (1..=150_u32).map(|item| limiter.when(&item)).collect();

    // Items 1-100 fit the burst: the per-item backoff (5 ms) dominates.
    for (i, delay) in delays[..100].iter().enumerate() {
        assert_eq!(*delay, ms(5), "item {}", i + 1);
    }
    // Then the bucket's debt dominates: item 100 + k waits k / 10 s.
    assert_eq!(delays[100], ms(100), "item 101");
    assert_eq!(delays[149], secs(5), "item 150");
    // Every call also counted a failure of its item.
    for item in 1..=150_u32 {
        assert_eq!(limiter.num_requeues(&item), 1, "item {item}");
    }
}

#[test]
fn default_controller_bucket_recovers_after_the_clock_moves() {
    let clock = FakeClock::new();
    let limiter = rate_limiter::default_controller_with_clock(clock.clone());
    for item in 1..=150_u32 {
        limiter.when(&item);
    }
    // 50 tokens in debt: 15 s pays it and refills the bucket to its burst.
    clock.step(secs(15));
    assert_eq!(limiter.when(&151), ms(5));
    // The item's own backoff continues where it was.
    assert_eq!(limiter.when(&1), ms(10));
}

#[test]
fn default_controller_on_the_real_clock_starts_at_5_ms() {
    let limiter = rate_limiter::default_controller();
    // The bucket starts full, so time does not matter for the first calls.
    assert_eq!(limiter.when(&"default/web-0"), ms(5));
    assert_eq!(limiter.when(&"default/web-0"), ms(10));
    assert_eq!(limiter.num_requeues(&"default/web-0"), 2);
    limiter.forget(&"default/web-0");
    assert_eq!(limiter.num_requeues(&"default/web-0"), 0);
}

#[test]
fn default_item_based_reaches_1000_s_at_call_21() {
    let limiter = rate_limiter::default_item_based();
    let delays: Vec<_> = (1..=22).map(|_| limiter.when(&"key")).collect();
    assert_eq!(delays[0], ms(1));
    assert_eq!(delays[19], Duration::from_micros(524_288_000), "call 20");
    assert_eq!(delays[20], secs(1000), "call 21");
    assert_eq!(delays[21], secs(1000), "call 22");
}

#[test]
fn default_controller_exponential_part_reaches_1000_s_at_call_19() {
    let limiter = rate_limiter::default_controller_with_clock(FakeClock::new());
    let delays: Vec<_> = (1..=19).map(|_| limiter.when(&"key")).collect();
    assert_eq!(delays[9], Duration::from_millis(2560), "call 10");
    assert_eq!(delays[17], Duration::from_millis(655_360), "call 18");
    assert_eq!(delays[18], secs(1000), "call 19");
}

// ===== overflow and Duration::MAX =====

#[test]
fn exponential_failure_stays_at_max_after_thousands_of_failures() {
    let limiter = ExponentialFailure::new(ms(5), secs(1000));
    let mut previous = Duration::ZERO;
    for call in 1..=5000 {
        let delay = limiter.when(&"key");
        assert!(delay >= previous, "call {call} went down: {delay:?}");
        previous = delay;
    }
    assert_eq!(previous, secs(1000));
    assert_eq!(limiter.num_requeues(&"key"), 5000);
}

#[test]
fn exponential_failure_with_huge_base_gives_max_without_panicking() {
    let limiter = ExponentialFailure::new(Duration::MAX, Duration::MAX);
    for _ in 0..100 {
        assert_eq!(limiter.when(&"key"), Duration::MAX);
    }

    let limiter = ExponentialFailure::new(Duration::from_secs(u64::MAX / 2), secs(60));
    for _ in 0..100 {
        assert_eq!(limiter.when(&"key"), secs(60));
    }
}

#[test]
fn exponential_failure_with_max_delay_duration_max_saturates() {
    let limiter = ExponentialFailure::new(Duration::from_nanos(1), Duration::MAX);
    let delays: Vec<_> = (0..2000).map(|_| limiter.when(&"key")).collect();
    assert_eq!(delays[0], Duration::from_nanos(1));
    assert_eq!(delays[10], Duration::from_nanos(1024));
    assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
    // Far past any representable doubling, the answer is the cap.
    assert_eq!(delays[1999], Duration::MAX);
}

#[test]
fn exponential_failure_with_zero_base_never_delays() {
    let limiter = ExponentialFailure::new(Duration::ZERO, secs(1000));
    for _ in 0..2000 {
        assert_eq!(limiter.when(&"key"), Duration::ZERO);
    }
}

#[test]
fn exponential_failure_with_max_below_base_caps_every_answer() {
    let limiter = ExponentialFailure::new(secs(10), secs(1));
    assert_eq!(limiter.when(&"key"), secs(1));
    assert_eq!(limiter.when(&"key"), secs(1));
}

#[test]
fn fast_slow_max_of_and_with_max_wait_pass_duration_max_through() {
    let fast_slow = FastSlow::new(Duration::MAX, Duration::MAX, 1);
    assert_eq!(fast_slow.when(&"key"), Duration::MAX);
    assert_eq!(fast_slow.when(&"key"), Duration::MAX);

    let max_of: MaxOf<&str> = MaxOf::new(vec![
        Box::new(ExponentialFailure::new(Duration::MAX, Duration::MAX)),
        Box::new(FastSlow::new(ms(1), ms(2), 1)),
    ]);
    assert_eq!(max_of.when(&"key"), Duration::MAX);

    let capped = WithMaxWait::new(ExponentialFailure::new(Duration::MAX, Duration::MAX), ms(7));
    assert_eq!(capped.when(&"key"), ms(7));

    let uncapped = WithMaxWait::new(ExponentialFailure::new(ms(3), Duration::MAX), Duration::MAX);
    assert_eq!(uncapped.when(&"key"), ms(3));
}

#[test]
fn max_of_no_limiters_gives_zero() {
    let limiter: MaxOf<&str> = MaxOf::new(Vec::new());
    assert_eq!(limiter.when(&"key"), Duration::ZERO);
    assert_eq!(limiter.num_requeues(&"key"), 0);
    limiter.forget(&"key");
}

#[test]
fn max_of_reports_the_largest_requeue_count_and_forgets_in_all() {
    let limiter = MaxOf::new(vec![
        Box::new(ExponentialFailure::new(ms(1), secs(1))),
        Box::new(FastSlow::new(ms(1), ms(1), 1)),
    ]);
    for _ in 0..3 {
        limiter.when(&"key");
    }
    assert_eq!(limiter.num_requeues(&"key"), 3);
    limiter.forget(&"key");
    assert_eq!(limiter.num_requeues(&"key"), 0);
    // Both counters were reset: the first delay is the fast/base one again.
    assert_eq!(limiter.when(&"key"), ms(1));
}

#[test]
fn add_rate_limited_with_a_duration_max_delay_waits_until_an_add() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(Duration::MAX, Duration::MAX))
        .build();
    queue.add_rate_limited("key");
    assert_eq!(queue.delayed_len(), 1);
    // Even the longest step a fake clock takes does not reach "never".
    clock.step(Duration::MAX);
    assert_eq!(queue.len(), 0);
    // A plain add makes it ready now, once.
    queue.add("key");
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.delayed_len(), 0);
}

// ===== the queue with its limiter =====

#[test]
fn queue_default_limiter_bucket_runs_on_the_queue_clock() {
    let clock = FakeClock::new();
    // No limiter given: the default controller limiter, with its bucket on this clock.
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    for item in 1..=101_u32 {
        queue.add_rate_limited(item);
    }
    assert_eq!(queue.delayed_len(), 101);

    // Items 1-100 waited their 5 ms backoff.
    clock.step(ms(5));
    assert_eq!(queue.len(), 100);
    // Item 101 waits for the bucket: 100 ms on the fake clock, not on the wall clock.
    clock.step(ms(94));
    assert_eq!(queue.len(), 100);
    clock.step(ms(1));
    assert_eq!(queue.len(), 101);
}

#[test]
fn queue_shares_an_arc_limiter_with_its_owner() {
    let limiter: Arc<dyn RateLimiter<&str>> = Arc::new(ExponentialFailure::new(ms(1), secs(1)));
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock)
        .rate_limiter(limiter.clone())
        .build();
    queue.add_rate_limited("key");
    queue.add_rate_limited("key");
    // The queue asked the shared limiter, so its owner sees the count.
    assert_eq!(limiter.num_requeues(&"key"), 2);
    assert_eq!(queue.num_requeues(&"key"), 2);
    limiter.forget(&"key");
    assert_eq!(queue.num_requeues(&"key"), 0);
}

#[test]
fn queue_takes_a_boxed_limiter() {
    let limiter: Box<dyn RateLimiter<&str>> = Box::new(FastSlow::new(ms(1), secs(1), 1));
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(limiter)
        .build();
    queue.add_rate_limited("key");
    clock.step(ms(1));
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.num_requeues(&"key"), 1);
}

#[test]
fn forget_resets_the_count_but_leaves_the_queue_alone() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(10), secs(1)))
        .build();
    queue.add_rate_limited("key");
    queue.forget(&"key");
    assert_eq!(queue.num_requeues(&"key"), 0);
    // The delayed add is still there and still due after its 10 ms.
    assert_eq!(queue.delayed_len(), 1);
    clock.step(ms(10));
    assert_eq!(queue.len(), 1);
}

#[test]
fn add_rate_limited_of_a_waiting_item_keeps_the_earlier_ready_time() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(10), secs(1)))
        .build();
    queue.add_rate_limited("key"); // ready at 10 ms
    queue.add_rate_limited("key"); // asks for 20 ms: the earlier time stays
    assert_eq!(queue.num_requeues(&"key"), 2);
    clock.step(ms(10));
    assert_eq!(queue.len(), 1);
}

#[test]
fn add_rate_limited_after_shut_down_counts_the_failure_but_adds_nothing() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(1), secs(1)))
        .build();
    queue.shut_down();
    queue.add_rate_limited("key");
    // client-go asks the limiter before the delaying queue drops the add.
    assert_eq!(queue.num_requeues(&"key"), 1);
    assert_eq!(queue.delayed_len(), 0);
    clock.step(secs(1));
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().unwrap_err().is_shut_down());
}

#[test]
fn add_with_rate_limited_and_a_delay_takes_the_shorter() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(10), secs(1)))
        .build();
    // The limiter says 10 ms, the option 1 s: the shorter wins.
    queue.add_with("short", AddOptions::default().rate_limited().after(secs(1)));
    // The limiter says 10 ms, the option 5 ms: the shorter wins.
    queue.add_with("shorter", AddOptions::default().rate_limited().after(ms(5)));
    clock.step(ms(5));
    assert_eq!(*queue.try_get().unwrap(), "shorter");
    assert_eq!(queue.len(), 0);
    clock.step(ms(5));
    assert_eq!(*queue.try_get().unwrap(), "short");
}

// ===== bounded failure tracking =====

#[test]
fn a_full_exponential_limiter_evicts_the_least_recently_failed_item() {
    let ms = Duration::from_millis;
    let limiter = ExponentialFailure::new(ms(1), Duration::from_secs(1000)).with_max_tracked(2);
    assert_eq!(limiter.when(&"a"), ms(1));
    assert_eq!(limiter.when(&"b"), ms(1));
    assert_eq!(limiter.when(&"a"), ms(2)); // "b" is now the least recently failed
    // Full: a new item still gets client-go's delay and a true count; "b" makes room.
    assert_eq!(limiter.when(&"c"), ms(1));
    assert_eq!(limiter.num_requeues(&"c"), 1);
    assert_eq!(limiter.when(&"c"), ms(2));
    assert_eq!(limiter.num_requeues(&"c"), 2);
    assert_eq!(limiter.num_requeues(&"b"), 0, "evicted");
    assert_eq!(limiter.tracked(), 2);
    // "a" failed before "c": it goes next, and starts again from the base delay.
    assert_eq!(limiter.when(&"d"), ms(1));
    assert_eq!(limiter.num_requeues(&"a"), 0);
    assert_eq!(limiter.when(&"a"), ms(1));
    assert_eq!(
        limiter.num_requeues(&"c"),
        0,
        "c was the least recently failed"
    );
    assert_eq!(limiter.num_requeues(&"d"), 1);
    assert_eq!(limiter.tracked(), 2);
}

#[test]
fn a_full_fast_slow_limiter_evicts_and_keeps_its_formula() {
    let fast = Duration::from_millis(5);
    let slow = Duration::from_secs(10);
    let limiter = FastSlow::new(fast, slow, 2).with_max_tracked(1);
    assert_eq!(limiter.when(&"a"), fast);
    assert_eq!(limiter.when(&"a"), fast);
    assert_eq!(limiter.when(&"a"), slow);
    assert_eq!(limiter.when(&"b"), fast, "a new item gets the fast delay");
    assert_eq!(limiter.num_requeues(&"b"), 1);
    assert_eq!(limiter.num_requeues(&"a"), 0);
    assert_eq!(limiter.tracked(), 1);
}

#[test]
fn a_limiter_failing_many_items_without_forget_stays_bounded() {
    let limiter = ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1000))
        .with_max_tracked(100);
    for round in 0..3u32 {
        for item in 0..1_000u32 {
            assert_eq!(
                limiter.when(&item),
                Duration::from_millis(1),
                "round {round}: item {item} (evicted since its last failure) starts again at the base"
            );
        }
    }
    assert_eq!(limiter.tracked(), 100);
    for item in 900..1_000u32 {
        assert_eq!(limiter.num_requeues(&item), 1);
    }
}
