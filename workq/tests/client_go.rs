//! client-go's own workqueue tests, ported to this crate.
//!
//! Source: kubernetes/client-go, `util/workqueue/queue_test.go`, `delaying_queue_test.go`,
//! `rate_limiting_queue_test.go` and `default_rate_limiters_test.go` (commit 32ce75a7d6bc),
//! Copyright The Kubernetes Authors, licensed under the Apache License, Version 2.0. Every test
//! case of those files is re-expressed here by hand with the same scenario and the same
//! numbers; each test says which Go test it ports.
//!
//! Porting changes:
//!
//! - `Get` returning `(item, shutdown)` is `blocking_get` / `try_get` returning an `Option` /
//!   `Result`; `shutdown == true` is `None` / `TryGetError::ShutDown`.
//! - `Done(item)` is dropping the `Lease` that `get` handed out.
//! - Table tests with one case per shut-down call (`TestBasic`, `TestAddWhileProcessing`)
//!   are one Rust test per case.
//! - The 1 ms and 3 ms sleeps in `TestBasic`, which only stand for work, are
//!   `thread::yield_now`: the interleaving matters, not the time. Both tests also check that
//!   every item was handed out at least once, which client-go's rules imply.
//! - `waitForWaitingQueueToFill` has nothing to wait for: `add_after` files the item before it
//!   returns, so the tests assert `delayed_len` instead. `waitForAdded` is not needed either:
//!   a `FakeClock::step` promotes due items before it returns, so `len` is asserted at once.
//! - `TestSimpleQueue` steps 10 s past client-go's heartbeat and polls for 30 ms to see that
//!   nothing new arrives. This queue has no heartbeat; the step stays, and the test asserts at
//!   once that nothing is ready, delayed or tracked.
//! - `TestCollapse` and `TestCollapseWhileProcessing` trace `Queue.Touch` through a pluggable
//!   inner queue, which this crate does not have. They assert what is observable instead:
//!   two adds give one entry and one hand-out; re-adds while processing are not counted by
//!   `len` and give exactly one more hand-out.
//! - `TestCollapseWhileProcessing` sleeps 100 ms so that a second worker blocks in `Get`.
//!   Here the second worker is a `get()` future polled by hand: `Pending` shows it is
//!   blocked, and its waker shows that dropping the first lease wakes it.
//! - `TestRateLimitingQueue` reads `readyAt` from the delaying queue's internal channel. Here
//!   the delay is observed on a `FakeClock`: the item is not ready 1 ns before it, and is
//!   ready at it. The item is taken before the next `add_rate_limited`, so that the
//!   earliest-wins rule does not merge the two delays.
//! - `TestGarbageCollection` waits for a Go finalizer; here the item is an `Arc` and a `Weak`
//!   shows that the queue dropped its reference once the lease was dropped.
//! - The drain tests wait for the shutting-down thread with a generous deadline instead of
//!   forever, so a bug fails the test instead of hanging it.
//! - `StepRateLimiter` (`TestWithMaxWaitRateLimiter`'s helper) counts with an atomic, since
//!   `RateLimiter::when` takes `&self`.
//! - `TestItemExponentialFailureRateLimiterOverFlow` checks two limiters; they are two tests.
//! - The benchmarks (`BenchmarkQueue`, `BenchmarkDelayingQueue_AddAfter`) are not tests and
//!   are not ported here.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::thread;
use std::time::Duration;

use support::{CountingWaker, poll_once, spawn};
use workq::clock::FakeClock;
use workq::rate_limiter::{ExponentialFailure, FastSlow, MaxOf, RateLimiter, WithMaxWait};
use workq::{TryGetError, WorkQueue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ===== queue_test.go =====

/// The item a `TestBasic` run adds after shutting down; no consumer may ever see it.
const ADDED_AFTER_SHUTDOWN: u32 = u32::MAX;

/// client-go `TestBasic`: 50 producers add their own item 50 times each while 10 consumers
/// process; after the producers finish the queue is shut down with `shut_down` and an add
/// after it is ignored.
fn producers_and_consumers_finish_after(shut_down: fn(&WorkQueue<u32>)) {
    let queue = WorkQueue::new();
    let producers: Vec<_> = (0..50_u32)
        .map(|i| {
            let queue = queue.clone();
            thread::spawn(move || {
                for _ in 0..50 {
                    queue.add(i);
                    thread::yield_now();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let queue = queue.clone();
            spawn(move || {
                let mut seen = Vec::new();
                while let Some(lease) = queue.blocking_get() {
                    assert_ne!(
                        *lease, ADDED_AFTER_SHUTDOWN,
                        "got an item added after shutdown"
                    );
                    seen.push(*lease);
                    // Stands for the work; other consumers get their turn meanwhile.
                    thread::yield_now();
                }
                seen
            })
        })
        .collect();

    for producer in producers {
        producer.join().unwrap();
    }
    shut_down(&queue);
    queue.add(ADDED_AFTER_SHUTDOWN);

    let mut seen = HashSet::new();
    for consumer in consumers {
        seen.extend(consumer.join("a consumer"));
    }
    assert_eq!(queue.len(), 0);
    // Queued items are still handed out after a shut down, so every item was processed.
    assert_eq!(seen, (0..50).collect::<HashSet<_>>());
}

#[test]
fn basic_producers_and_consumers_finish_after_shut_down() {
    producers_and_consumers_finish_after(WorkQueue::shut_down);
}

#[test]
fn basic_producers_and_consumers_finish_after_shut_down_with_drain() {
    producers_and_consumers_finish_after(WorkQueue::blocking_shut_down_with_drain);
}

/// client-go `TestAddWhileProcessing`: 50 producers add one item each; every consumer re-adds
/// an item while processing it until that consumer has seen it twice.
fn items_re_added_while_processing_finish_after(shut_down: fn(&WorkQueue<u32>)) {
    let queue = WorkQueue::new();
    let producers: Vec<_> = (0..50_u32)
        .map(|i| {
            let queue = queue.clone();
            thread::spawn(move || queue.add(i))
        })
        .collect();
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let queue = queue.clone();
            spawn(move || {
                // Every consumer re-adds every item it sees up to once more: the
                // dirty-while-processing case.
                let mut counters: HashMap<u32, usize> = HashMap::new();
                while let Some(lease) = queue.blocking_get() {
                    let count = counters.entry(*lease).or_default();
                    *count += 1;
                    if *count < 2 {
                        queue.add(*lease);
                    }
                    drop(lease);
                }
                counters.into_keys().collect::<Vec<_>>()
            })
        })
        .collect();

    for producer in producers {
        producer.join().unwrap();
    }
    shut_down(&queue);

    let mut seen = HashSet::new();
    for consumer in consumers {
        seen.extend(consumer.join("a consumer"));
    }
    assert_eq!(queue.len(), 0);
    assert_eq!(seen, (0..50).collect::<HashSet<_>>());
}

#[test]
fn add_while_processing_finishes_after_shut_down() {
    items_re_added_while_processing_finish_after(WorkQueue::shut_down);
}

#[test]
fn add_while_processing_finishes_after_shut_down_with_drain() {
    items_re_added_while_processing_finish_after(WorkQueue::blocking_shut_down_with_drain);
}

/// client-go `TestLen`.
#[test]
fn len_counts_a_duplicate_add_once() {
    let queue = WorkQueue::new();
    queue.add("foo");
    assert_eq!(queue.len(), 1);
    queue.add("bar");
    assert_eq!(queue.len(), 2);
    queue.add("foo"); // already queued: no second entry
    assert_eq!(queue.len(), 2);
}

/// client-go `TestReinsert`.
#[test]
fn reinsert_while_processing_hands_the_item_out_again_after_done() {
    let queue = WorkQueue::new();
    queue.add("foo");

    let lease = queue.blocking_get().unwrap();
    assert_eq!(*lease, "foo");
    // Add it back while processing, then finish.
    queue.add(*lease);
    drop(lease);

    // It is back in the queue.
    let lease = queue.blocking_get().unwrap();
    assert_eq!(*lease, "foo");
    drop(lease);

    assert_eq!(queue.len(), 0);
}

/// client-go `TestCollapse`. Touch tracing is not observable; two adds give one entry and one
/// hand-out.
#[test]
fn collapse_two_adds_give_one_hand_out() {
    let queue = WorkQueue::new();
    queue.add("bar");
    queue.add("bar");
    assert_eq!(queue.len(), 1);

    let lease = queue.blocking_get().unwrap();
    assert_eq!(*lease, "bar");
    drop(lease);

    assert_eq!(queue.len(), 0);
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
}

/// client-go `TestCollapseWhileProcessing`. The second worker is a `get()` future polled by
/// hand, so its being blocked is observed without sleeping.
#[test]
fn collapse_while_processing_blocks_the_other_worker_until_done() {
    let queue = WorkQueue::new();
    queue.add("foo");
    let first = queue.blocking_get().unwrap();
    assert_eq!(*first, "foo");

    // Add the same item twice while it is processed: not queued, so not counted.
    queue.add("foo");
    queue.add("foo");
    assert_eq!(queue.len(), 0);

    // Another worker asks for an item: it must wait, foo is still being processed.
    let mut second = queue.get();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut second, &waker).is_pending());

    // Finishing the first hand-out wakes the other worker, which gets foo.
    drop(first);
    assert_eq!(wakes.wakes(), 1);
    let Poll::Ready(Some(lease)) = poll_once(&mut second, &waker) else {
        panic!("the waiting worker did not get foo after the first lease was dropped");
    };
    assert_eq!(*lease, "foo");
    drop(lease);

    // The two re-adds collapsed into that one hand-out.
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
}

/// client-go `TestQueueDrainageUsingShutDownWithDrain`.
#[test]
fn drain_waits_for_both_leases() {
    let queue = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let first = queue.blocking_get().unwrap();
    let second = queue.blocking_get().unwrap();

    let drain = {
        let queue = queue.clone();
        spawn(move || queue.blocking_shut_down_with_drain())
    };

    // The queue is empty, so this returns only once the drain has shut the queue down: the
    // drain is under way before the leases are dropped.
    assert!(queue.blocking_get().is_none());
    assert!(
        !drain.is_finished(),
        "the drain returned with two leases out"
    );

    drop(first);
    drop(second);
    drain.join("the drain");
}

/// client-go `TestNoQueueDrainageUsingShutDown`.
#[test]
fn shut_down_returns_without_waiting_for_leases() {
    let queue = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let _first = queue.blocking_get().unwrap();
    let _second = queue.blocking_get().unwrap();

    let shut_down = {
        let queue = queue.clone();
        spawn(move || queue.shut_down())
    };
    // Returns although neither lease was dropped.
    shut_down.join("shut_down");
}

/// client-go `TestForceQueueShutdownUsingShutDown`.
#[test]
fn shut_down_forces_a_drain_in_progress_to_return() {
    let queue = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let _first = queue.blocking_get().unwrap();
    let _second = queue.blocking_get().unwrap();

    let drain = {
        let queue = queue.clone();
        spawn(move || queue.blocking_shut_down_with_drain())
    };
    // Returns once the drain has shut the queue down.
    assert!(queue.blocking_get().is_none());

    // A second signal: shut down without drain. The drain returns with both leases still out.
    queue.shut_down();
    drain.join("the drain cut short by shut_down");
}

/// client-go `TestQueueDrainageUsingShutDownWithDrainWithDirtyItem`.
#[test]
fn drain_with_a_dirty_item_hands_it_out_again_after_done() {
    let queue = WorkQueue::new();
    queue.add("foo");
    let gotten = queue.blocking_get().unwrap();
    queue.add("foo"); // dirty: re-added while processing

    let drain = {
        let queue = queue.clone();
        spawn(move || queue.blocking_shut_down_with_drain())
    };
    // Returns once the drain has started: foo is processing, nothing is queued.
    assert!(queue.blocking_get().is_none());

    // Finishing puts foo back in the queue, so the next get hands it out although the queue
    // is shut down.
    drop(gotten);
    let again = queue
        .blocking_get()
        .expect("the dirty item is handed out after done");
    assert_eq!(*again, "foo");
    drop(again);

    // Now we are really done.
    assert!(queue.blocking_get().is_none());
    drain.join("the drain");
}

/// client-go `TestGarbageCollection`: a finalizer there, a `Weak` here.
#[test]
fn queue_drops_its_reference_to_an_item_after_its_lease_drops() {
    #[derive(PartialEq, Eq, Hash)]
    struct BigObject {
        data: Vec<u8>,
    }

    let queue = WorkQueue::new();
    let object = Arc::new(BigObject {
        data: b"hello".to_vec(),
    });
    let weak = Arc::downgrade(&object);
    queue.add(object);

    let lease = queue.blocking_get().unwrap();
    assert_eq!(lease.data, b"hello");
    drop(lease);

    // The queue is still alive, yet nothing holds the object any more.
    assert_eq!(weak.strong_count(), 0);
    assert!(weak.upgrade().is_none());
    assert_eq!(queue.len(), 0);
    drop(queue);
}

// ===== delaying_queue_test.go =====

fn fake_clock_queue() -> (FakeClock, WorkQueue<&'static str>) {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    (clock, queue)
}

/// client-go `TestSimpleQueue`.
#[test]
fn simple_delayed_item_is_ready_after_its_delay_and_only_once() {
    let (clock, queue) = fake_clock_queue();

    queue.add_after("foo", ms(50));
    assert_eq!(queue.delayed_len(), 1);
    assert_eq!(queue.len(), 0);

    clock.step(ms(60));
    assert_eq!(queue.len(), 1);
    drop(queue.try_get().unwrap());

    // client-go steps past its 10 s heartbeat here. There is no heartbeat; stepping must
    // bring nothing new, and nothing is left anywhere in the queue.
    clock.step(secs(10));
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.delayed_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
}

/// client-go `TestDeduping`.
#[test]
fn deduping_delayed_adds_keeps_the_earliest() {
    let (clock, queue) = fake_clock_queue();

    queue.add_after("foo", ms(50));
    queue.add_after("foo", ms(70));
    assert_eq!(queue.delayed_len(), 1);
    assert_eq!(queue.len(), 0);

    // Step past the first ready time: it is there now.
    clock.step(ms(60));
    assert_eq!(queue.len(), 1);
    drop(queue.try_get().unwrap());

    // Step past the second ready time: it was merged into the first, nothing comes.
    clock.step(ms(20));
    assert_eq!(queue.len(), 0);

    // Again, but now the later add is the earlier one and must win.
    queue.add_after("foo", ms(50));
    queue.add_after("foo", ms(30));
    assert_eq!(queue.delayed_len(), 1);
    assert_eq!(queue.len(), 0);

    clock.step(ms(40));
    assert_eq!(queue.len(), 1);
    drop(queue.try_get().unwrap());

    clock.step(ms(20));
    assert_eq!(queue.len(), 0);
}

/// client-go `TestAddTwoFireEarly`.
#[test]
fn add_two_fire_early_hands_out_in_ready_order() {
    let (clock, queue) = fake_clock_queue();

    queue.add_after("foo", secs(1));
    queue.add_after("bar", ms(50));
    assert_eq!(queue.delayed_len(), 2);
    assert_eq!(queue.len(), 0);

    clock.step(ms(60));
    assert_eq!(queue.len(), 1);
    // client-go never calls Done in this test; the leases are kept alive likewise.
    let bar = queue.try_get().unwrap();
    assert_eq!(*bar, "bar");

    queue.add_after("baz", secs(2));

    clock.step(secs(1));
    assert_eq!(queue.len(), 1);
    let foo = queue.try_get().unwrap();
    assert_eq!(*foo, "foo");

    clock.step(secs(2));
    assert_eq!(queue.len(), 1);
    let baz = queue.try_get().unwrap();
    assert_eq!(*baz, "baz");
}

/// client-go `TestCopyShifting`.
#[test]
fn copy_shifting_releases_items_due_together_earliest_first() {
    let (clock, queue) = fake_clock_queue();

    queue.add_after("foo", secs(1));
    queue.add_after("bar", ms(500));
    queue.add_after("baz", ms(250));
    assert_eq!(queue.delayed_len(), 3);
    assert_eq!(queue.len(), 0);

    clock.step(secs(2));
    assert_eq!(queue.len(), 3);
    let first = queue.try_get().unwrap();
    let second = queue.try_get().unwrap();
    let third = queue.try_get().unwrap();
    assert_eq!([*first, *second, *third], ["baz", "bar", "foo"]);
}

// ===== rate_limiting_queue_test.go =====

/// Asserts that the only delayed item, `item`, becomes ready exactly `delay` from now, and
/// takes it so the next delay is observed on its own.
#[track_caller]
fn assert_ready_after(
    queue: &WorkQueue<&'static str>,
    clock: &FakeClock,
    item: &str,
    delay: Duration,
) {
    assert_eq!(queue.delayed_len(), 1);
    clock.step(delay - Duration::from_nanos(1));
    assert_eq!(queue.len(), 0, "{item} is ready before {delay:?}");
    clock.step(Duration::from_nanos(1));
    let lease = queue
        .try_get()
        .unwrap_or_else(|err| panic!("{item} is not ready after {delay:?}: {err}"));
    assert_eq!(*lease, item);
}

/// client-go `TestRateLimitingQueue`.
#[test]
fn rate_limiting_queue_delays_by_the_limiter() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(1), secs(1)))
        .build();

    queue.add_rate_limited("one");
    assert_ready_after(&queue, &clock, "one", ms(1));
    queue.add_rate_limited("one");
    assert_ready_after(&queue, &clock, "one", ms(2));
    assert_eq!(queue.num_requeues(&"one"), 2);

    queue.add_rate_limited("two");
    assert_ready_after(&queue, &clock, "two", ms(1));
    queue.add_rate_limited("two");
    assert_ready_after(&queue, &clock, "two", ms(2));

    queue.forget(&"one");
    assert_eq!(queue.num_requeues(&"one"), 0);
    queue.add_rate_limited("one");
    assert_ready_after(&queue, &clock, "one", ms(1));
}

// ===== default_rate_limiters_test.go =====

/// client-go `TestItemExponentialFailureRateLimiter`.
#[test]
fn item_exponential_failure_doubles_per_item_until_forgotten() {
    let limiter = ExponentialFailure::new(ms(1), secs(1));

    let one: Vec<_> = (0..5).map(|_| limiter.when(&"one")).collect();
    assert_eq!(one, [ms(1), ms(2), ms(4), ms(8), ms(16)]);
    assert_eq!(limiter.num_requeues(&"one"), 5);

    assert_eq!(limiter.when(&"two"), ms(1));
    assert_eq!(limiter.when(&"two"), ms(2));
    assert_eq!(limiter.num_requeues(&"two"), 2);

    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(1));
}

/// client-go `TestItemExponentialFailureRateLimiterOverFlow`, first limiter.
#[test]
fn item_exponential_failure_overflow_gives_max_delay() {
    let limiter = ExponentialFailure::new(ms(1), secs(1000));
    for _ in 0..5 {
        limiter.when(&"one");
    }
    assert_eq!(limiter.when(&"one"), ms(32));

    for _ in 0..1000 {
        limiter.when(&"overflow1");
    }
    assert_eq!(limiter.when(&"overflow1"), secs(1000));
}

/// client-go `TestItemExponentialFailureRateLimiterOverFlow`, second limiter.
#[test]
fn item_exponential_failure_overflow_with_large_base_gives_max_delay() {
    let minute = secs(60);
    let hour = secs(60 * 60);
    let limiter = ExponentialFailure::new(minute, 1000 * hour);
    for _ in 0..2 {
        limiter.when(&"two");
    }
    assert_eq!(limiter.when(&"two"), 4 * minute);

    for _ in 0..1000 {
        limiter.when(&"overflow2");
    }
    assert_eq!(limiter.when(&"overflow2"), 1000 * hour);
}

/// client-go `TestItemFastSlowRateLimiter`.
#[test]
fn item_fast_slow_is_fast_for_max_fast_attempts_then_slow() {
    let limiter = FastSlow::new(ms(5), secs(10), 3);

    let one: Vec<_> = (0..5).map(|_| limiter.when(&"one")).collect();
    assert_eq!(one, [ms(5), ms(5), ms(5), secs(10), secs(10)]);
    assert_eq!(limiter.num_requeues(&"one"), 5);

    assert_eq!(limiter.when(&"two"), ms(5));
    assert_eq!(limiter.when(&"two"), ms(5));
    assert_eq!(limiter.num_requeues(&"two"), 2);

    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(5));
}

/// client-go `TestMaxOfRateLimiter`.
#[test]
fn max_of_gives_the_largest_delay() {
    let limiter = MaxOf::new(vec![
        Box::new(FastSlow::new(ms(5), secs(3), 3)),
        Box::new(ExponentialFailure::new(ms(1), secs(1))),
    ]);

    let one: Vec<_> = (0..5).map(|_| limiter.when(&"one")).collect();
    assert_eq!(one, [ms(5), ms(5), ms(5), secs(3), secs(3)]);
    assert_eq!(limiter.num_requeues(&"one"), 5);

    assert_eq!(limiter.when(&"two"), ms(5));
    assert_eq!(limiter.when(&"two"), ms(5));
    assert_eq!(limiter.num_requeues(&"two"), 2);

    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(5));
}

/// `TestWithMaxWaitRateLimiter`'s helper: `base_delay` for the first `threshold` calls over
/// all items, `max_delay` after.
struct StepRateLimiter {
    count: AtomicUsize,
    threshold: usize,
    base_delay: Duration,
    max_delay: Duration,
}

impl StepRateLimiter {
    fn new(base_delay: Duration, max_delay: Duration, threshold: usize) -> Self {
        Self {
            count: AtomicUsize::new(0),
            threshold,
            base_delay,
            max_delay,
        }
    }
}

impl<T> RateLimiter<T> for StepRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if count <= self.threshold {
            self.base_delay
        } else {
            self.max_delay
        }
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> usize {
        0
    }
}

/// client-go `TestWithMaxWaitRateLimiter`.
#[test]
fn with_max_wait_caps_the_inner_delay() {
    let limiter = WithMaxWait::new(StepRateLimiter::new(ms(5), secs(1000), 100), secs(500));
    for i in 0..100 {
        assert_eq!(limiter.when(&i), ms(5), "item {i}");
    }
    for i in 100..200 {
        assert_eq!(limiter.when(&i), secs(500), "item {i}");
    }
}
