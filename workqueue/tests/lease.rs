//! Leases: reading the item, marking it done by drop or `done`, and freeing it when the
//! worker holding it panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;

use workqueue::{TryGetError, WorkQueue};

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
