//! Leases: a re-add while processing is delivered once, after the lease drops; a dropped
//! `get` future passes its wake-up on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use loom::thread;

use super::InFlight;
use crate::{TryGetError, WorkQueue};

/// An item re-added while a worker holds it (racing the worker's drop of the lease) is
/// handed out again exactly once, to a getter that was already waiting, and never while the
/// first lease is alive.
#[test]
fn loom_readd_while_processing_is_delivered_once_after_done() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let in_flight = InFlight::default();
        queue.add(1);
        let lease = queue.try_get().unwrap();
        in_flight.enter(*lease);

        let adder = {
            let queue = queue.clone();
            thread::spawn(move || queue.add(1))
        };
        let getter = {
            let queue = queue.clone();
            let in_flight = in_flight.clone();
            thread::spawn(move || {
                let lease = queue.blocking_get().expect("not shut down");
                in_flight.enter(*lease);
                in_flight.leave(*lease);
            })
        };
        // The worker finishes; the add above came before or after this, so either the drop
        // queues the dirty item or the add queues it fresh: one delivery either way.
        in_flight.leave(*lease);
        drop(lease);

        adder.join().unwrap();
        getter.join().unwrap();
        assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
        assert_eq!(queue.tracked_len(), 0);
    });
}

/// Adds of a processing item collapse: however many race the lease drop, the item comes
/// back once.
#[test]
fn loom_readds_while_processing_collapse_into_one_delivery() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add(1);
        let lease = queue.try_get().unwrap();
        let adder = {
            let queue = queue.clone();
            thread::spawn(move || {
                queue.add(1);
                queue.add(1);
            })
        };
        queue.add(1);
        drop(lease);
        adder.join().unwrap();
        let again = queue.try_get().expect("re-added, so queued again");
        assert_eq!(*again, 1);
        assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
        drop(again);
        assert_eq!(queue.tracked_len(), 0);
    });
}

/// An async getter that was woken for an item but is dropped before it takes it passes the
/// wake-up to the next waiter, here a parked blocking getter, which must then get the item.
#[test]
fn loom_dropped_get_future_passes_wakeup_on() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();

        // Register the async getter first, so it is the oldest waiter the add will wake.
        let mut future = Box::pin(queue.get());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));

        let blocking = {
            let queue = queue.clone();
            thread::spawn(move || *queue.blocking_get().expect("not shut down"))
        };
        queue.add(1);
        drop(future);
        assert_eq!(blocking.join().unwrap(), 1);
    });
}

/// The same with the add on its own thread, racing the drop of the woken future.
#[test]
fn loom_dropped_get_future_racing_add_loses_no_item() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let mut future = Box::pin(queue.get());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));

        let taken = Arc::new(AtomicBool::new(false));
        let blocking = {
            let queue = queue.clone();
            let taken = taken.clone();
            thread::spawn(move || {
                let lease = queue.blocking_get().expect("not shut down");
                taken.store(true, Ordering::SeqCst);
                *lease
            })
        };
        let producer = {
            let queue = queue.clone();
            thread::spawn(move || queue.add(1))
        };
        drop(future);
        producer.join().unwrap();
        assert_eq!(blocking.join().unwrap(), 1);
        assert!(taken.load(Ordering::SeqCst));
    });
}

/// A worker's step from one item to the next in one lock round (`done_and_next` in memory)
/// racing an adder and a parked getter: every item is delivered exactly once more (the
/// re-added one included), never to two holders at once, and the parked getter is never
/// left waiting while an item is ready.
#[test]
fn loom_done_and_next_loses_no_wakeup_and_no_item() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let in_flight = InFlight::default();
        queue.add(1);
        let lease = queue.try_get().unwrap();
        in_flight.enter(*lease);

        let adder = {
            let queue = queue.clone();
            thread::spawn(move || {
                queue.add(1);
                queue.add(2);
            })
        };
        let getter = {
            let queue = queue.clone();
            let in_flight = in_flight.clone();
            thread::spawn(move || {
                let lease = queue.blocking_get().expect("not shut down");
                in_flight.enter(*lease);
                in_flight.leave(*lease);
                *lease
            })
        };
        in_flight.leave(*lease);
        let mut delivered = Vec::new();
        if let Some(next) = lease.done_and_try_get() {
            in_flight.enter(*next);
            delivered.push(*next);
            in_flight.leave(*next);
        }
        adder.join().unwrap();
        delivered.push(getter.join().unwrap());
        while let Ok(rest) = queue.try_get() {
            delivered.push(*rest);
        }
        delivered.sort_unstable();
        assert_eq!(delivered, [1, 2]);
        assert_eq!(queue.tracked_len(), 0);
    });
}
