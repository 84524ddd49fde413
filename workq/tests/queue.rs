//! The plain queue: order, dedup, `len`, handles, and `get` in its three forms (async on any
//! executor, blocking, non-blocking), including the cancel safety of the `get` future.

mod support;

use std::collections::HashSet;
use std::task::Poll;
use std::time::Duration;

use futures::task::noop_waker;
use support::{CountingWaker, poll_once, spawn};
use workq::clock::FakeClock;
use workq::{TryGetError, WorkQueue};

/// Takes every ready item, in hand-out order.
fn take_all<T: Eq + std::hash::Hash + Clone + Send + Sync + 'static>(
    queue: &WorkQueue<T>,
) -> Vec<T> {
    std::iter::from_fn(|| queue.try_get().ok().map(|lease| lease.item().clone())).collect()
}

// ===== order, dedup, len =====

#[test]
fn items_come_out_in_the_order_they_were_added() {
    let queue = WorkQueue::new();
    for key in ["c", "a", "b"] {
        queue.add(key);
    }
    assert_eq!(take_all(&queue), ["c", "a", "b"]);
}

#[test]
fn a_duplicate_add_keeps_the_first_position() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    queue.add("a");
    assert_eq!(take_all(&queue), ["a", "b"]);
}

#[test]
fn an_item_re_added_while_processing_goes_to_the_tail_when_its_lease_drops() {
    let queue = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    queue.add("a");
    queue.add("c");
    drop(a);
    assert_eq!(take_all(&queue), ["b", "c", "a"]);
}

#[test]
fn an_item_is_never_handed_to_two_workers_at_once() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = queue.try_get().unwrap();
    for _ in 0..3 {
        queue.add("key");
    }
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
    drop(lease);
    // However many re-adds, one more hand-out.
    assert_eq!(take_all(&queue), ["key"]);
}

#[test]
fn len_counts_only_ready_items() {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    queue.add("ready");
    queue.add("processing");
    queue.add_after("delayed", Duration::from_secs(1));
    assert_eq!(queue.len(), 2, "a delayed item is not counted");

    let _ready = queue.try_get().unwrap();
    let processing = queue.try_get().unwrap();
    assert_eq!(queue.len(), 0, "items being processed are not counted");

    queue.add("processing");
    assert_eq!(queue.len(), 0, "a re-add while processing is not counted");
    drop(processing);
    assert_eq!(queue.len(), 1, "counted again once its lease drops");

    clock.step(Duration::from_secs(1));
    assert_eq!(queue.len(), 2, "counted once its delay passed");
    assert_eq!(queue.processing_len(), 1);
    assert_eq!(queue.tracked_len(), 3);
}

#[test]
fn is_empty_follows_len() {
    let queue = WorkQueue::new();
    assert!(queue.is_empty());
    queue.add("key");
    assert!(!queue.is_empty());
    let _lease = queue.try_get().unwrap();
    assert!(queue.is_empty());
}

#[test]
fn try_get_on_an_empty_queue_reports_empty() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    let err = queue.try_get().unwrap_err();
    assert_eq!(err, TryGetError::Empty);
    assert!(err.is_empty());
    assert!(!err.is_shut_down());
}

// ===== handles =====

#[test]
fn clones_share_one_queue() {
    let queue = WorkQueue::new();
    let other = queue.clone();
    other.add("key");
    assert_eq!(queue.len(), 1);
    let lease = queue.try_get().unwrap();
    other.add("key");
    assert_eq!(other.len(), 0, "the clone sees the item as processing");
    drop(lease);
    assert_eq!(other.len(), 1);
}

#[test]
fn default_is_an_empty_unnamed_queue() {
    let queue: WorkQueue<u32> = WorkQueue::default();
    assert!(queue.is_empty());
    assert_eq!(queue.name(), None);
    assert!(!queue.is_shutting_down());
}

#[test]
fn builder_name_is_reported() {
    let queue: WorkQueue<u32> = WorkQueue::builder().name("pods").build();
    assert_eq!(queue.name(), Some("pods"));
}

#[test]
fn debug_output_needs_no_debug_items() {
    #[derive(PartialEq, Eq, Hash, Clone)]
    struct Opaque;

    let queue = WorkQueue::new();
    queue.add(Opaque);
    let text = format!("{queue:?}");
    assert!(text.contains("WorkQueue"), "{text}");
}

// ===== blocking_get =====

#[test]
fn blocking_get_is_woken_by_an_add_from_another_thread() {
    let queue = WorkQueue::new();
    let getter = {
        let queue = queue.clone();
        spawn(move || queue.blocking_get().map(|lease| *lease))
    };
    queue.add("key");
    assert_eq!(getter.join("blocking_get"), Some("key"));
}

#[test]
fn blocked_threads_each_get_one_of_the_items_added_later() {
    let queue = WorkQueue::new();
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            // Each keeps its lease until it returns, so no item comes out twice.
            spawn(move || {
                let lease = queue.blocking_get().unwrap();
                *lease
            })
        })
        .collect();
    for i in 0..4_u32 {
        queue.add(i);
    }
    let got: HashSet<_> = getters
        .into_iter()
        .map(|getter| getter.join("blocking_get"))
        .collect();
    assert_eq!(got, (0..4).collect());
}

// ===== get on executors =====

#[test]
fn get_works_under_futures_block_on() {
    let queue = WorkQueue::new();
    queue.add("key");
    let lease = futures::executor::block_on(queue.get()).unwrap();
    assert_eq!(*lease, "key");
}

#[test]
fn get_under_futures_block_on_is_woken_by_an_add_from_another_thread() {
    let queue = WorkQueue::new();
    let getter = {
        let queue = queue.clone();
        spawn(move || futures::executor::block_on(queue.get()).map(|lease| *lease))
    };
    queue.add("key");
    assert_eq!(getter.join("block_on(get)"), Some("key"));
}

#[tokio::test]
async fn get_works_on_a_tokio_current_thread_runtime() {
    let queue = WorkQueue::new();
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await.map(|lease| *lease) }
    });
    // Let the worker start waiting before the add (one thread: it runs when we yield).
    tokio::task::yield_now().await;
    queue.add("key");
    assert_eq!(worker.await.unwrap(), Some("key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_works_on_a_tokio_multi_thread_runtime() {
    let queue = WorkQueue::new();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(lease) = queue.get().await {
                    got.push(*lease);
                }
                got
            })
        })
        .collect();
    for i in 0..100_u32 {
        queue.add(i);
    }
    queue.shut_down();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_tokio_getter_is_woken_by_an_add_from_a_plain_thread() {
    let queue = WorkQueue::new();
    let adder = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.add("key"))
    };
    let lease = queue.get().await.unwrap();
    assert_eq!(*lease, "key");
    adder.join().unwrap();
}

// ===== cancel safety of get =====

#[test]
fn a_dropped_get_future_passes_its_wake_up_to_the_next_get_future() {
    let queue = WorkQueue::new();
    let noop = noop_waker();
    // The first getter registers, with a waker that does nothing.
    let mut first = queue.get();
    assert!(poll_once(&mut first, &noop).is_pending());
    // A second getter registers behind it.
    let mut second = queue.get();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut second, &waker).is_pending());

    // The add wakes the first getter only...
    queue.add("key");
    assert_eq!(wakes.wakes(), 0);
    // ...which is dropped before it takes the item: the wake-up must move on.
    drop(first);
    assert_eq!(
        wakes.wakes(),
        1,
        "the wake-up was lost with the dropped future"
    );
    let Poll::Ready(Some(lease)) = poll_once(&mut second, &waker) else {
        panic!("the second getter found no item");
    };
    assert_eq!(*lease, "key");
}

#[test]
fn a_dropped_get_future_passes_its_wake_up_to_a_blocked_thread() {
    let queue = WorkQueue::new();
    let noop = noop_waker();
    let mut first = queue.get();
    assert!(poll_once(&mut first, &noop).is_pending());
    let getter = {
        let queue = queue.clone();
        spawn(move || queue.blocking_get().map(|lease| *lease))
    };
    queue.add("key");
    // If the thread waited when the add came, only the dropped future was woken, and the
    // drop must pass the wake-up on; if not, the thread finds the item by itself. Either way
    // it gets the item.
    drop(first);
    assert_eq!(
        getter.join("blocking_get after a dropped future"),
        Some("key")
    );
}

#[test]
fn a_woken_get_future_that_is_dropped_leaves_the_item_queued() {
    let queue = WorkQueue::new();
    let mut get = queue.get();
    let (wakes, waker) = CountingWaker::new();
    assert!(poll_once(&mut get, &waker).is_pending());
    queue.add("key");
    assert_eq!(wakes.wakes(), 1);
    drop(get);
    assert_eq!(queue.len(), 1);
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn a_get_future_dropped_before_any_add_takes_nothing() {
    let queue = WorkQueue::new();
    let mut get = queue.get();
    assert!(poll_once(&mut get, &noop_waker()).is_pending());
    drop(get);
    queue.add("key");
    assert_eq!(queue.len(), 1);
    assert_eq!(*queue.try_get().unwrap(), "key");
}

#[test]
fn a_get_future_that_is_never_polled_takes_nothing() {
    let queue = WorkQueue::new();
    queue.add("key");
    drop(queue.get());
    assert_eq!(queue.len(), 1);
}

#[test]
fn a_get_future_polled_with_a_new_waker_wakes_the_new_one() {
    let queue = WorkQueue::new();
    let mut get = queue.get();
    let (old_wakes, old_waker) = CountingWaker::new();
    let (new_wakes, new_waker) = CountingWaker::new();
    assert!(poll_once(&mut get, &old_waker).is_pending());
    // Executors may move a task: the last waker given is the one to wake.
    assert!(poll_once(&mut get, &new_waker).is_pending());
    queue.add("key");
    assert_eq!((old_wakes.wakes(), new_wakes.wakes()), (0, 1));
}

#[tokio::test]
async fn a_get_losing_a_select_loses_no_item() {
    let queue = WorkQueue::new();
    // The get branch is pending when the other branch wins; the get future is dropped.
    tokio::select! {
        biased;
        _ = queue.get() => panic!("nothing was queued"),
        () = tokio::task::yield_now() => {}
    }
    queue.add("key");
    tokio::select! {
        biased;
        () = std::future::ready(()) => {}
        _ = queue.get() => panic!("the ready branch is polled first"),
    }
    let lease = queue.get().await.unwrap();
    assert_eq!(*lease, "key");
}
