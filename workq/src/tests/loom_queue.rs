//! Adds racing getters: no wake-up is lost, and no item reaches two getters.

use std::collections::BTreeSet;
use std::time::Duration;

use loom::thread;

use super::InFlight;
use crate::clock::FakeClock;
use crate::{TryGetError, WorkQueue};

/// A getter that finds the queue empty registers and parks; an add racing it, before, during
/// or after the registration, must still reach it.
#[test]
fn loom_add_racing_blocking_get_never_loses_wakeup() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let producer = {
            let queue = queue.clone();
            thread::spawn(move || queue.add(1))
        };
        let lease = queue.blocking_get().expect("the queue is not shut down");
        assert_eq!(*lease, 1);
        producer.join().unwrap();
    });
}

/// The same race with the async getter: the add must wake the task's waker.
#[test]
fn loom_add_racing_async_get_never_loses_wakeup() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let producer = {
            let queue = queue.clone();
            thread::spawn(move || queue.add(1))
        };
        let lease = loom::future::block_on(queue.get()).expect("the queue is not shut down");
        assert_eq!(*lease, 1);
        producer.join().unwrap();
    });
}

/// Two items added while a blocking and an async getter wait: each add wakes one getter
/// and both getters are served, whichever order they registered in.
#[test]
fn loom_two_adds_serve_a_blocking_and_an_async_getter() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let blocking = {
            let queue = queue.clone();
            thread::spawn(move || *queue.blocking_get().expect("not shut down"))
        };
        let asynchronous = {
            let queue = queue.clone();
            thread::spawn(move || *loom::future::block_on(queue.get()).expect("not shut down"))
        };
        queue.add(1);
        queue.add(2);
        let got: BTreeSet<u32> = [blocking.join().unwrap(), asynchronous.join().unwrap()].into();
        assert_eq!(got, BTreeSet::from([1, 2]));
    });
}

/// Two getters race for one item (one of them polling with `try_get`): exactly one of them
/// receives it, and it is not handed out again.
#[test]
fn loom_two_getters_never_receive_the_same_item() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let in_flight = InFlight::default();
        let getter = |queue: WorkQueue<u32>, in_flight: InFlight| {
            move || match queue.try_get() {
                Ok(lease) => {
                    in_flight.enter(*lease);
                    // Hold the lease across a scheduling point so the other getter can run.
                    thread::yield_now();
                    in_flight.leave(*lease);
                    1
                }
                Err(TryGetError::Empty) => 0,
                Err(TryGetError::ShutDown) => unreachable!("never shut down"),
            }
        };
        queue.add(1);
        let first = thread::spawn(getter(queue.clone(), in_flight.clone()));
        let second = thread::spawn(getter(queue.clone(), in_flight.clone()));
        let received = first.join().unwrap() + second.join().unwrap();
        // Either one getter took it, or the first dropped its lease before the second
        // looked (the item is then absent, not queued again).
        assert_eq!(received, 1);
        assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
        assert_eq!(queue.tracked_len(), 0);
    });
}

/// Two blocking getters and a producer of two items: the getters receive different items.
#[test]
fn loom_two_blocking_getters_receive_different_items() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let in_flight = InFlight::default();
        let getter = |queue: WorkQueue<u32>, in_flight: InFlight| {
            move || {
                let lease = queue.blocking_get().expect("not shut down");
                in_flight.enter(*lease);
                let item = *lease;
                in_flight.leave(item);
                item
            }
        };
        let first = thread::spawn(getter(queue.clone(), in_flight.clone()));
        let second = thread::spawn(getter(queue.clone(), in_flight.clone()));
        queue.add(1);
        queue.add(2);
        let got: BTreeSet<u32> = [first.join().unwrap(), second.join().unwrap()].into();
        assert_eq!(got, BTreeSet::from([1, 2]));
    });
}

/// A delayed item that comes due when a fake clock steps wakes a getter that is already
/// waiting: the step's promotion hands out the wake-up, without a timer thread.
#[test]
fn loom_clock_step_wakes_waiting_getter() {
    loom::model(|| {
        let clock = FakeClock::new();
        let queue: WorkQueue<u32> = WorkQueue::builder().clock(clock.clone()).build();
        queue.add_after(1, Duration::from_secs(1));
        let getter = {
            let queue = queue.clone();
            thread::spawn(move || *queue.blocking_get().expect("not shut down"))
        };
        clock.step(Duration::from_secs(1));
        assert_eq!(getter.join().unwrap(), 1);
        assert_eq!(queue.delayed_len(), 0);
    });
}
