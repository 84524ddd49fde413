//! Delayed adds (`add_after`): zero and huge delays, `Duration::MAX`, dedup against queued and
//! processing items, the order of items that come due together, waking waiting getters on a
//! fake and on the real clock, and never blocking the caller.
//!
//! Where this differs from client-go on purpose (an `add` of a delayed item processes it once,
//! kubernetes#126027; an `add_after` of a queued item leaves it queued once), the tests assert
//! the crate's rule.

mod support;

use std::task::Poll;
use std::time::Duration;

use support::{CountingWaker, poll_once, spawn};
use workq::WorkQueue;
use workq::clock::FakeClock;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn fake_clock_queue<T: Eq + std::hash::Hash + Clone + Send + Sync + 'static>()
-> (FakeClock, WorkQueue<T>) {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    (clock, queue)
}

/// Takes every ready item, in hand-out order.
fn take_all<T: Eq + std::hash::Hash + Clone + Send + Sync + 'static>(
    queue: &WorkQueue<T>,
) -> Vec<T> {
    std::iter::from_fn(|| queue.try_get().ok().map(|lease| lease.item().clone())).collect()
}

// ===== delays =====

#[test]
fn add_after_with_zero_delay_adds_at_once() {
    let (_clock, queue) = fake_clock_queue();
    queue.add_after("key", Duration::ZERO);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.delayed_len(), 0);
}

#[test]
fn add_after_with_zero_delay_on_the_real_clock_is_ready_at_once() {
    let queue = WorkQueue::new();
    queue.add_after("key", Duration::ZERO);
    // No timer is involved: the item is there before add_after returns.
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn add_after_is_ready_exactly_when_its_delay_has_passed() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", ms(30));
    clock.step(ms(30) - Duration::from_nanos(1));
    assert_eq!(queue.len(), 0);
    clock.step(Duration::from_nanos(1));
    assert_eq!(queue.len(), 1);
}

#[test]
fn add_after_of_one_nanosecond_is_ready_one_nanosecond_later() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", Duration::from_nanos(1));
    assert_eq!(queue.len(), 0);
    clock.step(Duration::from_nanos(1));
    assert_eq!(queue.len(), 1);
}

#[test]
fn add_after_keeps_earliest_ready_time() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", ms(30));
    queue.add_after("key", ms(10));
    queue.add_after("key", ms(20));
    assert_eq!(queue.delayed_len(), 1);
    clock.step(ms(10));
    assert_eq!(take_all(&queue), ["key"]);
    // The later ready times were merged, not kept.
    clock.step(ms(20));
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.tracked_len(), 0);
}

#[test]
fn add_after_with_a_delay_of_a_year_waits_a_year() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", 365 * DAY);
    clock.step(364 * DAY);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.delayed_len(), 1);
    clock.step(DAY);
    assert_eq!(queue.len(), 1);
}

#[test]
fn add_after_duration_max_never_becomes_ready_on_its_own() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", Duration::MAX);
    assert_eq!(queue.delayed_len(), 1);
    // The longest step a fake clock can take (it saturates) does not reach "never".
    clock.step(Duration::MAX);
    clock.step(Duration::MAX);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.delayed_len(), 1);
}

#[test]
fn add_after_duration_max_then_add_is_ready_at_once() {
    let (_clock, queue) = fake_clock_queue();
    queue.add_after("key", Duration::MAX);
    queue.add("key");
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.delayed_len(), 0);
}

#[test]
fn add_after_duration_max_on_the_real_clock_neither_panics_nor_hangs() {
    let finished = spawn(|| {
        let queue = WorkQueue::new();
        // Starts the timer thread with a deadline centuries away.
        queue.add_after("never", Duration::MAX);
        // A sooner item still comes out: the timer re-arms for it.
        queue.add_after("soon", ms(1));
        let lease = queue.blocking_get().unwrap();
        assert_eq!(*lease, "soon");
        drop(lease);
        assert_eq!(queue.delayed_len(), 1);
        // Dropping the last handle ends the timer thread although "never" is still delayed.
        drop(queue);
    });
    finished.join("a queue with a Duration::MAX delay");
}

#[test]
fn add_after_with_huge_delays_mixed_with_short_ones_orders_by_ready_time() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("max", Duration::MAX);
    queue.add_after("century", 36_500 * DAY);
    queue.add_after("second", secs(1));
    clock.step(secs(1));
    assert_eq!(take_all(&queue), ["second"]);
    clock.step(36_500 * DAY);
    assert_eq!(take_all(&queue), ["century"]);
    assert_eq!(queue.delayed_len(), 1);
}

// ===== dedup against queued and processing items =====

#[test]
fn add_of_a_delayed_item_makes_it_ready_now_and_not_again_when_the_delay_passes() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", secs(5));
    queue.add("key");
    assert_eq!(queue.len(), 1);
    // The delayed entry is gone, not merely shadowed (client-go keeps it, kubernetes#126027).
    assert_eq!(queue.delayed_len(), 0);
    drop(queue.try_get().unwrap());

    // When the old delay passes, nothing is delivered a second time.
    clock.step(secs(5));
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.tracked_len(), 0);
}

#[test]
fn add_after_zero_of_a_delayed_item_makes_it_ready_now_and_only_once() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", secs(5));
    queue.add_after("key", Duration::ZERO);
    assert_eq!(take_all(&queue), ["key"]);
    clock.step(secs(5));
    assert_eq!(queue.len(), 0);
}

#[test]
fn add_after_of_a_queued_item_leaves_it_queued_once() {
    let (clock, queue) = fake_clock_queue();
    queue.add("key");
    queue.add_after("key", secs(1));
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.delayed_len(), 0);
    drop(queue.try_get().unwrap());

    // No delayed copy comes due later (client-go would add it again).
    clock.step(secs(1));
    assert_eq!(queue.len(), 0);
}

#[test]
fn add_after_of_a_processing_item_hands_it_out_again_after_the_delay_and_the_lease() {
    let (clock, queue) = fake_clock_queue();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add_after("key", secs(1));

    // Due while still being processed: not handed to a second worker.
    clock.step(secs(1));
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().is_err());

    // Queued again once the lease drops.
    drop(lease);
    assert_eq!(take_all(&queue), ["key"]);
}

#[test]
fn add_after_of_a_processing_item_still_waits_for_its_delay_after_the_lease_drops() {
    let (clock, queue) = fake_clock_queue();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add_after("key", secs(1));
    drop(lease);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.delayed_len(), 1);
    clock.step(secs(1));
    assert_eq!(take_all(&queue), ["key"]);
}

#[test]
fn add_of_a_processing_item_with_a_delayed_re_add_hands_it_out_once() {
    let (clock, queue) = fake_clock_queue();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add_after("key", secs(1));
    // An add now is sooner than the delayed one, which therefore goes.
    queue.add("key");
    assert_eq!(queue.delayed_len(), 0);
    drop(lease);
    assert_eq!(take_all(&queue), ["key"]);
    clock.step(secs(1));
    assert_eq!(queue.len(), 0);
}

#[test]
fn a_delayed_item_is_freed_once_its_lease_drops() {
    let (clock, queue) = fake_clock_queue();
    let item = std::sync::Arc::new("key".to_owned());
    let weak = std::sync::Arc::downgrade(&item);
    queue.add_after(item, secs(1));
    clock.step(secs(1));
    drop(queue.try_get().unwrap());
    assert!(weak.upgrade().is_none());
}

// ===== order =====

#[test]
fn items_due_in_one_step_join_behind_ready_items_earliest_first_ties_in_add_order() {
    let (clock, queue) = fake_clock_queue();
    queue.add("ready");
    queue.add_after("late", ms(30));
    queue.add_after("tie-1", ms(10));
    queue.add_after("early", ms(5));
    queue.add_after("tie-2", ms(10));
    clock.step(ms(30));
    assert_eq!(
        take_all(&queue),
        ["ready", "early", "tie-1", "tie-2", "late"]
    );
}

#[test]
fn items_due_in_later_steps_join_behind_items_added_meanwhile() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("delayed", ms(10));
    queue.add("first");
    clock.step(ms(10));
    queue.add("second");
    assert_eq!(take_all(&queue), ["first", "delayed", "second"]);
}

// ===== waking getters =====

#[test]
fn a_waiting_get_future_is_woken_by_a_fake_clock_step() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", secs(1));
    let mut get = queue.get();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut get, &waker).is_pending());

    clock.step(secs(1) - Duration::from_nanos(1));
    assert_eq!(wakes.wakes(), 0, "woken before the item was due");
    clock.step(Duration::from_nanos(1));
    assert_eq!(wakes.wakes(), 1);
    let Poll::Ready(Some(lease)) = poll_once(&mut get, &waker) else {
        panic!("the woken getter found no item");
    };
    assert_eq!(*lease, "key");
}

#[test]
fn a_blocked_thread_is_woken_by_a_fake_clock_step() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", secs(1));
    let getter = {
        let queue = queue.clone();
        spawn(move || queue.blocking_get().map(|lease| *lease))
    };
    // Whether the getter already waits or not, the step makes the item ready.
    clock.step(secs(1));
    assert_eq!(getter.join("blocking_get"), Some("key"));
}

#[test]
fn each_item_coming_due_wakes_one_waiting_getter() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("a", secs(1));
    queue.add_after("b", secs(2));
    let mut first = queue.get();
    let mut second = queue.get();
    let (first_wakes, first_waker) = CountingWaker::new();
    let (second_wakes, second_waker) = CountingWaker::new();
    assert!(poll_once(&mut first, &first_waker).is_pending());
    assert!(poll_once(&mut second, &second_waker).is_pending());

    // One item due: one getter woken, the one that waited longest.
    clock.step(secs(1));
    assert_eq!((first_wakes.wakes(), second_wakes.wakes()), (1, 0));
    clock.step(secs(1));
    assert_eq!((first_wakes.wakes(), second_wakes.wakes()), (1, 1));

    let Poll::Ready(Some(a)) = poll_once(&mut first, &first_waker) else {
        panic!("first getter got nothing");
    };
    let Poll::Ready(Some(b)) = poll_once(&mut second, &second_waker) else {
        panic!("second getter got nothing");
    };
    assert_eq!([*a, *b], ["a", "b"]);
}

#[test]
fn a_delayed_item_on_the_real_clock_wakes_a_blocked_getter() {
    let queue = WorkQueue::new();
    let getter = {
        let queue = queue.clone();
        spawn(move || queue.blocking_get().map(|lease| *lease))
    };
    queue.add_after("key", ms(20));
    assert_eq!(
        getter.join("blocking_get of a 20 ms delayed item"),
        Some("key")
    );
}

#[test]
fn an_earlier_add_after_re_arms_the_real_clock_timer() {
    let queue = WorkQueue::new();
    // The timer thread goes to sleep for an hour...
    queue.add_after("later", secs(3600));
    let getter = {
        let queue = queue.clone();
        spawn(move || queue.blocking_get().map(|lease| *lease))
    };
    // ...and must wake for this one instead.
    queue.add_after("sooner", ms(10));
    assert_eq!(
        getter.join("blocking_get of the sooner item"),
        Some("sooner")
    );
    assert_eq!(queue.delayed_len(), 1);
}

#[test]
fn a_delayed_item_on_the_real_clock_wakes_an_async_getter() {
    let queue = WorkQueue::new();
    queue.add_after("key", ms(20));
    let lease = futures::executor::block_on(queue.get()).unwrap();
    assert_eq!(*lease, "key");
}

#[test]
fn one_fake_clock_step_promotes_items_in_every_queue_on_it() {
    let clock = FakeClock::new();
    let first: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    let second: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    first.add_after("a", secs(1));
    second.add_after("b", secs(2));
    clock.step(secs(2));
    assert_eq!(take_all(&first), ["a"]);
    assert_eq!(take_all(&second), ["b"]);
}

#[test]
fn fake_clock_advance_to_promotes_due_items() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("key", secs(1));
    clock.advance_to(clock.now() + secs(1));
    assert_eq!(queue.len(), 1);
}

// ===== never blocking =====

#[test]
fn add_after_never_blocks_with_100k_pending_on_the_real_clock() {
    let queue = WorkQueue::new();
    // client-go's AddAfter blocks once 1000 adds wait in its channel; ours files each one in
    // the heap before it returns.
    let adder = {
        let queue = queue.clone();
        spawn(move || {
            for i in 0..100_000_u32 {
                queue.add_after(i, secs(3600) + Duration::from_nanos(u64::from(i)));
            }
        })
    };
    adder.join("100 000 add_after calls");
    assert_eq!(queue.delayed_len(), 100_000);
    assert_eq!(queue.len(), 0);
}

#[test]
fn add_after_of_100k_items_on_a_fake_clock_releases_them_in_ready_order() {
    let (clock, queue) = fake_clock_queue();
    // Ready times descend as i grows, so the release order is the reverse of the add order.
    for i in 0..100_000_u64 {
        queue.add_after(i, ms(1) + Duration::from_nanos(100_000 - i));
    }
    assert_eq!(queue.delayed_len(), 100_000);
    clock.step(secs(1));
    assert_eq!(queue.len(), 100_000);
    let order = take_all(&queue);
    assert!(order.iter().rev().copied().eq(0..100_000));
}
