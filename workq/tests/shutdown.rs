//! Shut down and drain: what happens to adds, queued, delayed and in-flight items, waiting
//! getters and drain callers, and the background timer thread.
//!
//! The drain follows client-go's rule: it returns once no lease is out (items still queued
//! do not hold it), or when a plain `shut_down` cuts it short.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use support::{CountingWaker, GENEROUS, poll_once, spawn};
use workq::clock::FakeClock;
use workq::{TryGetError, WorkQueue};

fn fake_clock_queue<T: Eq + std::hash::Hash + Clone + Send + Sync + 'static>()
-> (FakeClock, WorkQueue<T>) {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    (clock, queue)
}

// ===== shut_down =====

#[test]
fn after_shut_down_adds_are_ignored_and_queued_items_are_still_handed_out() {
    let queue = WorkQueue::new();
    queue.add("queued-1");
    queue.add("queued-2");
    queue.shut_down();
    assert!(queue.is_shutting_down());

    queue.add("late");
    queue.add_after("late-delayed", Duration::from_millis(1));
    assert_eq!(queue.len(), 2);

    assert_eq!(*queue.blocking_get().unwrap(), "queued-1");
    assert_eq!(*queue.blocking_get().unwrap(), "queued-2");
    // Then nothing: get returns None, try_get says shut down.
    assert!(queue.blocking_get().is_none());
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    assert!(futures::executor::block_on(queue.get()).is_none());
}

#[test]
fn shut_down_twice_is_harmless() {
    let queue = WorkQueue::new();
    queue.add("key");
    queue.shut_down();
    queue.shut_down();
    assert!(queue.is_shutting_down());
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn shut_down_drops_delayed_items() {
    let (clock, queue) = fake_clock_queue();
    queue.add_after("delayed", Duration::from_secs(1));
    queue.shut_down();
    assert_eq!(queue.delayed_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
    clock.step(Duration::from_secs(1));
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
}

#[test]
fn shut_down_frees_the_delayed_items_themselves() {
    let (_clock, queue) = fake_clock_queue();
    let item = Arc::new("delayed".to_owned());
    let weak = Arc::downgrade(&item);
    queue.add_after(item, Duration::from_secs(1));
    queue.shut_down();
    // The queue is alive, but it holds the item no more.
    assert!(weak.upgrade().is_none());
}

#[test]
fn shut_down_of_a_real_clock_queue_with_delayed_items_returns_and_leaves_it_usable() {
    let queue = WorkQueue::new();
    // Starts the timer thread, asleep for an hour.
    queue.add_after("delayed", Duration::from_secs(3600));
    queue.add("queued");
    let shut_down = {
        let queue = queue.clone();
        // Joins the timer thread before returning: it must not wait out the hour.
        spawn(move || queue.shut_down())
    };
    shut_down.join("shut_down with a delayed item");

    assert_eq!(queue.delayed_len(), 0);
    assert_eq!(queue.len(), 1);
    assert_eq!(*queue.blocking_get().unwrap(), "queued");
    assert!(queue.blocking_get().is_none());
}

#[test]
fn add_after_once_shut_down_starts_nothing_and_is_ignored() {
    let queue = WorkQueue::new();
    queue.shut_down();
    queue.add_after("key", Duration::from_millis(1));
    assert_eq!(queue.delayed_len(), 0);
    assert_eq!(queue.tracked_len(), 0);
    assert!(queue.blocking_get().is_none());
}

#[test]
fn shut_down_wakes_every_waiting_get_future() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    let mut getters: Vec<_> = (0..3).map(|_| queue.get()).collect();
    let wakers: Vec<_> = (0..3).map(|_| CountingWaker::new()).collect();
    for (get, (_, waker)) in getters.iter_mut().zip(&wakers) {
        assert!(poll_once(get, waker).is_pending());
    }

    queue.shut_down();

    for (get, (wakes, waker)) in getters.iter_mut().zip(&wakers) {
        assert_eq!(wakes.wakes(), 1);
        assert!(matches!(poll_once(get, waker), Poll::Ready(None)));
    }
}

#[test]
fn shut_down_wakes_every_blocked_thread() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let queue = queue.clone();
            spawn(move || queue.blocking_get().is_none())
        })
        .collect();
    queue.shut_down();
    for getter in getters {
        assert!(getter.join("a blocked getter after shut_down"));
    }
}

#[test]
fn a_lease_dropped_after_shut_down_re_queues_a_dirty_item() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add("key"); // dirty
    queue.shut_down();
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);

    drop(lease);
    // client-go's Done re-queues it even after shut down, so it is handed out once more.
    assert_eq!(*queue.try_get().unwrap(), "key");
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
}

#[test]
fn a_re_add_after_shut_down_of_an_item_being_processed_is_ignored() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.shut_down();
    // client-go ignores every add after shut down, also one that would mark the item dirty.
    queue.add("key");
    drop(lease);
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    assert_eq!(queue.tracked_len(), 0);
}

#[test]
fn a_delayed_re_add_of_a_processing_item_is_dropped_by_shut_down() {
    let (clock, queue) = fake_clock_queue();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add_after("key", Duration::from_secs(1));
    queue.shut_down();
    drop(lease);
    clock.step(Duration::from_secs(1));
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
    assert_eq!(queue.tracked_len(), 0);
}

// ===== drain =====

#[test]
fn drain_of_an_idle_queue_returns_at_once() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    queue.blocking_shut_down_with_drain();
    assert!(queue.is_shutting_down());
    futures::executor::block_on(queue.shut_down_with_drain());
}

#[test]
fn drain_does_not_wait_for_queued_items_nobody_holds() {
    let queue = WorkQueue::new();
    queue.add("queued");
    // client-go waits only for items being processed.
    queue.blocking_shut_down_with_drain();
    assert_eq!(*queue.try_get().unwrap(), "queued");
}

#[test]
fn drain_shuts_down_before_it_is_first_polled() {
    let queue = WorkQueue::new();
    queue.add("queued");
    let lease = queue.try_get().unwrap();
    let drain = queue.shut_down_with_drain();
    assert!(queue.is_shutting_down());
    queue.add("late");
    assert_eq!(queue.len(), 0);
    drop(drain);
    drop(lease);
}

#[test]
fn drain_returns_when_the_last_lease_drops() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    let b = queue.try_get().unwrap();

    let mut drain = queue.shut_down_with_drain();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut drain, &waker).is_pending());

    drop(a);
    assert_eq!(wakes.wakes(), 0, "woken with a lease still out");
    assert!(poll_once(&mut drain, &waker).is_pending());

    drop(b);
    assert_eq!(wakes.wakes(), 1);
    assert!(poll_once(&mut drain, &waker).is_ready());
}

#[test]
fn drain_waits_for_leases_taken_after_it_started() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();

    let mut drain = queue.shut_down_with_drain();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut drain, &waker).is_pending());

    // A worker takes the queued item after the drain began: it is in flight too.
    let b = queue.try_get().unwrap();
    drop(a);
    assert!(poll_once(&mut drain, &waker).is_pending());
    drop(b);
    assert_eq!(wakes.wakes(), 1);
    assert!(poll_once(&mut drain, &waker).is_ready());
}

#[test]
fn drain_returns_when_the_lease_drops_even_if_that_re_queues_the_item() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    queue.add("key"); // dirty: queued again when the lease drops

    let mut drain = queue.shut_down_with_drain();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut drain, &waker).is_pending());

    // No lease is out any more, so the drain is over (client-go's rule), although the item
    // is queued again and still handed out.
    drop(lease);
    assert_eq!(wakes.wakes(), 1);
    assert!(poll_once(&mut drain, &waker).is_ready());
    assert_eq!(*queue.try_get().unwrap(), "key");
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
}

#[test]
fn shut_down_cuts_a_drain_short() {
    let queue = WorkQueue::new();
    queue.add("key");
    let _lease = queue.try_get().unwrap();

    let mut drain = queue.shut_down_with_drain();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut drain, &waker).is_pending());

    queue.shut_down();
    assert_eq!(wakes.wakes(), 1);
    assert!(
        poll_once(&mut drain, &waker).is_ready(),
        "the lease is still out"
    );
}

#[test]
fn shut_down_cuts_a_blocking_drain_short() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    let drain = {
        let queue = queue.clone();
        spawn(move || queue.blocking_shut_down_with_drain())
    };
    // Once the drain has shut the queue down (it is empty, so this waits for that), cut it.
    assert!(queue.blocking_get().is_none());
    queue.shut_down();
    drain.join("a drain cut short by shut_down");
    drop(lease);
}

#[test]
fn every_drain_caller_returns_when_the_last_lease_drops() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();

    let mut first = queue.shut_down_with_drain();
    let mut second = queue.shut_down_with_drain();
    let (first_wakes, first_waker) = CountingWaker::new();
    let (second_wakes, second_waker) = CountingWaker::new();
    assert!(poll_once(&mut first, &first_waker).is_pending());
    assert!(poll_once(&mut second, &second_waker).is_pending());

    // client-go wakes one drain caller per Done (kubernetes#141079); all of ours return.
    drop(lease);
    assert_eq!((first_wakes.wakes(), second_wakes.wakes()), (1, 1));
    assert!(poll_once(&mut first, &first_waker).is_ready());
    assert!(poll_once(&mut second, &second_waker).is_ready());
}

#[test]
fn a_dropped_drain_future_leaves_the_queue_shut_down() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    let mut drain = queue.shut_down_with_drain();
    assert!(poll_once(&mut drain, &futures::task::noop_waker()).is_pending());
    drop(drain);
    assert!(queue.is_shutting_down());
    // The lease can still drop normally.
    drop(lease);
    assert_eq!(queue.processing_len(), 0);
}

// ===== the timer thread and the last handle =====

#[test]
fn dropping_the_last_handle_with_delayed_items_on_the_real_clock_frees_the_queue() {
    let item = Arc::new("delayed".to_owned());
    let weak = Arc::downgrade(&item);
    let dropped = spawn(move || {
        let queue = WorkQueue::new();
        // Starts the timer thread, which holds the queue while it runs.
        queue.add_after(item, Duration::from_secs(3600));
        let clone = queue.clone();
        drop(queue);
        // One handle is left: the timer thread must still be there for it.
        assert_eq!(clone.delayed_len(), 1);
        drop(clone);
    });
    dropped.join("dropping the last handle");
    // The timer thread was joined and let go of the queue, so the queue and the item it held
    // are gone.
    assert!(weak.upgrade().is_none());
}

#[test]
fn a_remaining_handle_still_gets_delayed_items_after_others_drop() {
    let queue = WorkQueue::new();
    let other = queue.clone();
    queue.add_after("key", Duration::from_millis(10));
    drop(queue);
    let getter = spawn(move || other.blocking_get().map(|lease| *lease));
    assert_eq!(
        getter.join("blocking_get on the remaining handle"),
        Some("key")
    );
}

#[test]
fn a_dropped_fake_clock_queue_stops_listening_to_the_clock() {
    let clock = FakeClock::new();
    let queue: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after("key", Duration::from_secs(1));
    assert!(clock.has_listeners());
    drop(queue);
    assert!(!clock.has_listeners());
    // Stepping a clock whose queue is gone is harmless.
    clock.step(Duration::from_secs(1));
}

#[test]
fn a_lease_may_outlive_every_handle() {
    let queue = WorkQueue::new();
    queue.add_after("delayed", Duration::from_secs(3600));
    queue.add("key");
    let lease = queue.try_get().unwrap();
    let dropped = spawn(move || drop(queue));
    dropped.join("dropping the last handle while a lease is out");
    assert_eq!(*lease, "key");
    drop(lease);
}

/// A boxed future that owns a queue handle.
type OwnedGet = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A waker that, when woken, drops the future it was given (as an executor whose queue of
/// runnable tasks is gone drops a woken task), then reports that it did.
struct DropTaskOnWake {
    task: Mutex<Option<OwnedGet>>,
    dropped: Mutex<mpsc::Sender<()>>,
}

impl Wake for DropTaskOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = self.task.lock().unwrap().take();
        drop(task);
        let _ = self.dropped.lock().unwrap().send(());
    }
}

#[test]
fn the_last_handle_dropped_by_a_waker_on_the_timer_thread_ends_it_cleanly() {
    let queue = WorkQueue::new();
    // Starts the timer thread; it wakes the getter below in 20 ms.
    queue.add_after("key", Duration::from_millis(20));
    // The getter's task owns the last handle.
    let mut task: OwnedGet = Box::pin(async move {
        let _ = queue.get().await;
    });
    let (dropped_tx, dropped) = mpsc::channel();
    let waker_state = Arc::new(DropTaskOnWake {
        task: Mutex::new(None),
        dropped: Mutex::new(dropped_tx),
    });
    let waker = Waker::from(waker_state.clone());
    assert!(
        task.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    *waker_state.task.lock().unwrap() = Some(task);
    drop(waker);
    drop(waker_state);

    // The timer thread wakes the getter; the waker drops the task and with it the last
    // handle, on the timer thread. That must end the thread quietly: dropping the handle must
    // not try to join the thread it runs on (shut_down already avoids this).
    dropped
        .recv_timeout(GENEROUS)
        .expect("the waker did not finish: the timer thread panicked while dropping the queue");
}
