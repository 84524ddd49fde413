//! Shut down: every waiter wakes; a drain returns only after the last lease drops.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loom::thread;

use crate::{TryGetError, WorkQueue};

/// A blocking and an async getter wait on an empty queue; one shut down wakes both, and
/// both see `None`.
#[test]
fn loom_shut_down_wakes_every_waiter() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let blocking = {
            let queue = queue.clone();
            thread::spawn(move || queue.blocking_get().is_none())
        };
        let asynchronous = {
            let queue = queue.clone();
            thread::spawn(move || loom::future::block_on(queue.get()).is_none())
        };
        queue.shut_down();
        assert!(blocking.join().unwrap());
        assert!(asynchronous.join().unwrap());
    });
}

/// Shut down hands out what is already queued: with one item and two waiting getters, one
/// getter receives the item and the other `None`; the add after shut down is ignored.
#[test]
fn loom_shut_down_still_hands_out_queued_items() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add(1);
        let getter = |queue: WorkQueue<u32>| move || queue.blocking_get().map(|lease| *lease);
        let first = thread::spawn(getter(queue.clone()));
        let second = thread::spawn(getter(queue.clone()));
        queue.shut_down();
        queue.add(2);
        let mut got = [first.join().unwrap(), second.join().unwrap()];
        got.sort();
        assert_eq!(got, [None, Some(1)]);
        assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    });
}

/// Two workers hold leases; a blocking drain returns only once both are dropped.
#[test]
fn loom_drain_returns_only_after_last_lease_drops() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add(1);
        queue.add(2);
        let finished = Arc::new(AtomicUsize::new(0));
        let worker = |lease: crate::Lease<u32>, finished: Arc<AtomicUsize>| {
            move || {
                // Count before the drop: when the drain returns, both counts must be in.
                finished.fetch_add(1, Ordering::SeqCst);
                drop(lease);
            }
        };
        let first = thread::spawn(worker(queue.try_get().unwrap(), finished.clone()));
        let second = thread::spawn(worker(queue.try_get().unwrap(), finished.clone()));
        queue.blocking_shut_down_with_drain();
        assert_eq!(finished.load(Ordering::SeqCst), 2);
        assert_eq!(queue.processing_len(), 0);
        first.join().unwrap();
        second.join().unwrap();
    });
}

/// The async drain, with a lease whose drop re-queues its item (re-added while processing,
/// before shut down): the drain returns once that lease is dropped, not before, and the
/// re-queued item is still handed out afterwards. A drain waits for items being processed,
/// not for queued ones (client-go's rule).
#[test]
fn loom_async_drain_waits_for_lease_that_requeues() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add(1);
        let lease = queue.try_get().unwrap();
        queue.add(1); // dirty: queued again when the lease drops
        let dropping = Arc::new(AtomicUsize::new(0));
        let worker = {
            let dropping = dropping.clone();
            thread::spawn(move || {
                dropping.store(1, Ordering::SeqCst);
                drop(lease);
            })
        };
        loom::future::block_on(queue.shut_down_with_drain());
        assert_eq!(
            dropping.load(Ordering::SeqCst),
            1,
            "drain returned with the lease out"
        );
        worker.join().unwrap();
        assert_eq!(queue.processing_len(), 0);
        let again = queue.try_get().expect("re-queued items survive shut down");
        assert_eq!(*again, 1);
        drop(again);
        assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    });
}

/// A plain shut down cuts a drain short while a lease is still out.
#[test]
fn loom_shut_down_cuts_drain_short() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add(1);
        let lease = queue.try_get().unwrap();
        let drainer = {
            let queue = queue.clone();
            thread::spawn(move || queue.blocking_shut_down_with_drain())
        };
        // Wait until the drain has begun: a drain that begins after the plain shut down
        // waits for the lease as usual (client-go's rule too).
        while !queue.is_shutting_down() {
            thread::yield_now();
        }
        queue.shut_down();
        drainer.join().unwrap();
        assert_eq!(queue.processing_len(), 1);
        drop(lease);
    });
}
