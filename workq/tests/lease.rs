//! Leases: reading the item, marking it done by drop or `done`, and freeing it when the
//! worker holding it panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;

use workq::{Lease, Queue, TryGetError, WorkQueue};

#[test]
fn a_lease_reads_as_its_item() {
    let queue = WorkQueue::new();
    queue.add("default/web-0".to_owned());
    let lease = queue.try_get().unwrap();
    assert_eq!(*lease, "default/web-0");
    assert_eq!(lease.item(), "default/web-0");
    assert_eq!(lease.as_ref(), "default/web-0");
    // Deref reaches the item's own methods.
    assert!(lease.starts_with("default/"));
}

#[test]
fn dropping_a_lease_marks_the_item_done() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    assert_eq!(queue.processing_len(), 1);
    drop(lease);
    assert_eq!(queue.processing_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
    // Done and not re-added: nothing comes out again.
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
}

#[test]
fn done_marks_the_item_done_like_drop() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add("key");
    lease.done();
    assert_eq!(queue.processing_len(), 0);
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn a_lease_without_priorities_has_priority_zero() {
    let queue = WorkQueue::new();
    queue.add("key");
    assert_eq!(queue.try_get().unwrap().priority(), 0);
}

#[test]
fn lease_drop_marks_item_done_even_on_panic() {
    let queue = WorkQueue::new();
    queue.add("key");

    let result = catch_unwind(AssertUnwindSafe(|| {
        let lease = queue.try_get().unwrap();
        panic!("worker failed while processing {}", *lease);
    }));
    assert!(result.is_err());

    // The unwinding dropped the lease: the item is free.
    assert_eq!(queue.processing_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
    // A re-add hands it out again.
    queue.add("key");
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn an_item_re_added_before_its_worker_panics_is_handed_out_again() {
    let queue = WorkQueue::new();
    queue.add("key");

    let result = catch_unwind(AssertUnwindSafe(|| {
        let lease = queue.try_get().unwrap();
        // Changed again while being processed, then the worker dies.
        queue.add(*lease);
        panic!("worker failed");
    }));
    assert!(result.is_err());

    assert_eq!(queue.processing_len(), 0);
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn a_worker_thread_that_panics_frees_its_item() {
    let queue = WorkQueue::new();
    queue.add("key");
    let worker = {
        let queue = queue.clone();
        thread::spawn(move || {
            let _lease = queue.blocking_get().unwrap();
            panic!("worker thread failed");
        })
    };
    assert!(worker.join().is_err());

    assert_eq!(queue.processing_len(), 0);
    queue.add("key");
    assert_eq!(*queue.blocking_get().unwrap(), "key");
}

#[test]
fn a_lease_can_be_dropped_on_another_thread() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add("key");
    thread::spawn(move || drop(lease)).join().unwrap();
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn lease_debug_needs_no_debug_item() {
    #[derive(PartialEq, Eq, Hash, Clone)]
    struct Opaque;

    let queue = WorkQueue::new();
    queue.add(Opaque);
    let lease = queue.try_get().unwrap();
    let text = format!("{lease:?}");
    assert!(text.starts_with("Lease"), "{text}");
}

/// `Queue::done_and_next` on the in-memory queue, whose future is ready at once.
fn step<T>(queue: &WorkQueue<T>, lease: Lease<T>, forget: bool) -> Option<Lease<T>>
where
    T: Eq + std::hash::Hash + Clone + Send + Sync + 'static,
{
    let next = futures::executor::block_on(Queue::done_and_next(queue, lease, forget));
    next.unwrap_or_else(|never| match never {})
}

/// `Queue::done_and_next` in memory: one lock round marks the item done and hands out the
/// next ready one, in the queue's order; `None` once nothing is ready.
#[test]
fn done_and_next_hands_out_the_next_item_in_order() {
    let queue = WorkQueue::new();
    for key in ["a", "b", "c"] {
        queue.add(key);
    }
    let a = queue.try_get().unwrap();
    let b = step(&queue, a, false).expect("b is ready");
    assert_eq!(*b, "b");
    assert_eq!(queue.processing_len(), 1, "a is done, b is out");
    let c = step(&queue, b, false).expect("c is ready");
    assert_eq!(*c, "c");
    let none = step(&queue, c, false);
    assert!(none.is_none());
    assert_eq!(queue.processing_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
}

/// An item re-added while processing goes to the tail when `done_and_next` ends its lease,
/// behind the items already waiting, and comes out once more.
#[test]
fn done_and_next_queues_a_re_added_item_behind_the_others() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    queue.add("a");
    queue.add("c");
    let mut order = Vec::new();
    let mut next = step(&queue, a, false);
    while let Some(lease) = next {
        order.push(*lease);
        next = step(&queue, lease, false);
    }
    assert_eq!(order, ["b", "c", "a"]);
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
}

/// With `forget`, `done_and_next` clears the item's failures (after a success); without,
/// it keeps them.
#[test]
fn done_and_next_forgets_only_when_asked() {
    let queue = WorkQueue::new();
    queue.add("x");
    queue.add("y");
    let x = queue.try_get().unwrap();
    queue.add_rate_limited("x");
    queue.add_rate_limited("x");
    assert_eq!(queue.num_requeues(&"x"), 2);
    let y = step(&queue, x, false).unwrap();
    assert_eq!(queue.num_requeues(&"x"), 2, "kept without forget");
    queue.add_rate_limited("y");
    assert_eq!(queue.num_requeues(&"y"), 1);
    let _ = step(&queue, y, true);
    assert_eq!(queue.num_requeues(&"y"), 0, "forgotten");
}

/// Once the queue is shut down, `done_and_next` only marks the item done: the items still
/// queued are left for `get` (a worker pool that stopped its queue takes no more work), and
/// a drain ends with the last lease.
#[test]
fn done_and_next_hands_nothing_out_once_the_queue_is_shut_down() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.blocking_shut_down_with_drain())
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    assert!(step(&queue, a, false).is_none());
    assert_eq!(queue.len(), 1, "b stays queued");
    drainer.join().unwrap();
    assert_eq!(queue.processing_len(), 0);
    // Queued items are still handed out after a shut down, by get.
    assert_eq!(*queue.try_get().unwrap(), "b");
}

/// A lease handed back unprocessed ([`QueueLease::release`], what `Workers` do with a lease
/// no worker takes) puts its item back where it was taken from: at the head of its
/// priority, as the shared backends do, so that items added after it do not start before
/// it. It went to the tail: `a` came out after `late`.
#[test]
fn a_released_item_goes_back_to_the_head_of_its_priority() {
    use futures::executor::block_on;
    use workq::{AddOptions, QueueLease, clock::FakeClock};

    let queue: WorkQueue<&str> = WorkQueue::builder().clock(FakeClock::new()).build();
    for item in ["a", "b", "c"] {
        queue.add(item);
    }
    queue.add_with("urgent", AddOptions::default().priority(5));
    let urgent = queue.try_get().unwrap();
    let a = queue.try_get().unwrap();
    queue.add("late");
    assert_eq!(block_on(QueueLease::release(a)), Ok(true));
    assert_eq!(block_on(QueueLease::release(urgent)), Ok(true));
    assert_eq!(queue.processing_len(), 0);
    let mut order = Vec::new();
    while let Ok(lease) = queue.try_get() {
        order.push(*lease.item());
    }
    assert_eq!(order, ["urgent", "a", "b", "c", "late"]);

    // Re-adds while it was held: a delayed one is dropped (the item is ready now), a raise
    // of its priority is kept.
    for item in ["x", "y"] {
        queue.add(item);
    }
    let x = queue.try_get().unwrap();
    queue.add("z");
    queue.add_after("x", std::time::Duration::from_secs(3600));
    queue.add_with(
        "x",
        AddOptions::default()
            .priority(3)
            .after(std::time::Duration::from_secs(60)),
    );
    assert_eq!(block_on(QueueLease::release(x)), Ok(true));
    assert_eq!(queue.delayed_len(), 0);
    let next = queue.try_get().unwrap();
    assert_eq!((*next.item(), next.priority()), ("x", 3));
    drop(next);
    assert_eq!(*queue.try_get().unwrap().item(), "y");

    // Once the queue is shut down, a release is refused and the item leaves the queue.
    queue.shut_down();
    let z = queue.try_get().unwrap();
    assert_eq!(block_on(QueueLease::release(z)), Ok(false));
    assert_eq!((queue.len(), queue.processing_len()), (0, 0));
}
