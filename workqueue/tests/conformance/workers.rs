//! The `Workers` suite every backend runs: each rule drives a `workqueue::Workers` pool over
//! a queue through the `workqueue::Queue` trait and checks the same outcomes, retries,
//! give-ups, panics, timeouts, stops and summaries. A backend's test crate includes this
//! file by path, implements [`Backend`] for its queues and instantiates every rule with
//! `for_each_workers_rule!(its_macro)`; the in-memory queue's [`Memory`] is here.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workqueue::rate_limiter::ExponentialFailure;
use workqueue::{AddOptions, Outcome, Queue, QueueLease, WorkQueue, Workers};
use workqueue::{AsyncWorkers, GiveUp, GiveUpReason};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in [`rules`].
#[allow(
    unused_macros,
    reason = "used by the workers tests, not by every test binary"
)]
macro_rules! for_each_workers_rule {
    ($suite:ident) => {
        $suite!(
            outcomes_map_to_forget_retry_retry_after_and_give_up,
            an_item_that_keeps_failing_is_given_up_after_max_retries,
            a_panicking_handler_is_retried_and_its_worker_keeps_running,
            a_handler_past_its_timeout_is_cancelled_and_retried,
            no_item_is_processed_by_two_workers_at_once,
            shut_down_waits_for_items_in_flight,
            shut_down_with_a_deadline_reports_what_is_still_in_flight,
            workers_end_when_the_queue_is_shut_down_and_empty,
            a_stop_lists_or_keeps_the_delayed_retries,
            one_worker_takes_items_by_priority,
            a_batched_done_requeues_due_re_adds_in_the_order_of_the_step,
        );
    };
}

/// Makes fresh queues of one backend for one test.
pub(crate) trait Backend: Send + Sync {
    type Q: Queue<Item = String>;
    /// Whether a shut down handle leaves its delayed items to the other processes (they stay
    /// in the queue) instead of dropping them.
    const SHARED: bool;
    fn queue(&self) -> impl Future<Output = Self::Q> + Send;
    /// Shuts the queue down for everyone (in memory: `shut_down`; on Redis: the fleet).
    fn shut_down_everyone(queue: &Self::Q) -> impl Future<Output = ()> + Send;
    /// How many items wait for a delay.
    fn delayed(queue: &Self::Q) -> impl Future<Output = usize> + Send;
}

pub(crate) struct Memory;

impl Backend for Memory {
    type Q = WorkQueue<String>;
    const SHARED: bool = false;

    async fn queue(&self) -> WorkQueue<String> {
        WorkQueue::builder()
            .rate_limiter(ExponentialFailure::new(
                Duration::from_millis(5),
                Duration::from_secs(1),
            ))
            .build()
    }

    async fn shut_down_everyone(queue: &WorkQueue<String>) {
        queue.shut_down();
    }

    async fn delayed(queue: &WorkQueue<String>) -> usize {
        queue.delayed_len()
    }
}

/// The in-memory queue seen as a backend that batches the workers' steps
/// ([`Queue::batch_limit`] 8): every rule then runs through `Workers`' batched steps, with
/// the trait's default `done_and_next_many`.
pub(crate) struct BatchedMemory;

/// A [`WorkQueue`] whose steps `Workers` batch.
#[derive(Clone)]
pub(crate) struct Batched(WorkQueue<String>);

impl Queue for Batched {
    type Item = String;
    type Lease = workqueue::Lease<String>;
    type Error = std::convert::Infallible;

    fn name(&self) -> Option<&str> {
        Queue::name(&self.0)
    }

    fn add_with(
        &self,
        item: String,
        options: AddOptions,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        Queue::add_with(&self.0, item, options)
    }

    fn forget(&self, item: &String) -> impl Future<Output = Result<(), Self::Error>> + Send {
        Queue::forget(&self.0, item)
    }

    fn num_requeues(
        &self,
        item: &String,
    ) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        Queue::num_requeues(&self.0, item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        Queue::len(&self.0)
    }

    fn get(&self) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        Queue::get(&self.0)
    }

    fn done_and_next(
        &self,
        lease: Self::Lease,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        Queue::done_and_next(&self.0, lease, forget)
    }

    fn batch_limit(&self) -> usize {
        8
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.0)
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        Queue::shut_down_with_drain(&self.0)
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        Queue::is_shutting_down(&self.0)
    }
}

impl Backend for BatchedMemory {
    type Q = Batched;
    const SHARED: bool = false;

    async fn queue(&self) -> Batched {
        Batched(Memory.queue().await)
    }

    async fn shut_down_everyone(queue: &Batched) {
        queue.0.shut_down();
    }

    async fn delayed(queue: &Batched) -> usize {
        queue.0.delayed_len()
    }
}

async fn add<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    assert!(
        Queue::add_with(queue, item.to_owned(), AddOptions::default())
            .await
            .unwrap()
    );
}

/// Waits until `check` holds, for at most 10 s.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_processed<Q: Queue<Item = String>>(workers: &AsyncWorkers<String, Q>, n: u64) {
    eventually("the workers to process the items", || async {
        workers.stats().processed >= n
    })
    .await;
}

/// How many times the handler saw each item.
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<HashMap<String, u32>>>);

impl Attempts {
    /// Counts an attempt of `item`; returns its number (1 for the first).
    fn next(&self, item: &str) -> u32 {
        let mut seen = self.0.lock().unwrap();
        let n = seen.entry(item.to_owned()).or_default();
        *n += 1;
        *n
    }
    fn of(&self, item: &str) -> u32 {
        self.0.lock().unwrap().get(item).copied().unwrap_or(0)
    }
}

/// The give-up reports a pool made.
type GaveUp = Arc<Mutex<Vec<GiveUp<String>>>>;

/// Collects the give-up reports.
fn give_ups() -> (GaveUp, impl Fn(&GiveUp<String>) + Send + Sync + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (seen, move |gave_up: &GiveUp<String>| {
        sink.lock().unwrap().push(gave_up.clone())
    })
}

pub(crate) mod rules {
    use super::*;

    pub(crate) async fn outcomes_map_to_forget_retry_retry_after_and_give_up<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        let attempts = Attempts::default();
        let (gave_up, on_give_up) = give_ups();
        let handler_attempts = attempts.clone();
        let workers = Workers::new(queue.clone())
            .count(2)
            .on_give_up(on_give_up)
            .spawn_async(move |item: String| {
                let attempt = handler_attempts.next(&item);
                async move {
                    match (item.as_str(), attempt) {
                        ("retry", 1) => Outcome::Retry,
                        ("after", 1) => Outcome::RetryAfter(Duration::from_millis(30)),
                        ("give-up", _) => Outcome::GiveUp,
                        _ => Outcome::Done,
                    }
                }
            });
        for item in ["done", "retry", "after", "give-up"] {
            add(&queue, item).await;
        }
        wait_processed(&workers, 6).await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 6);
        assert_eq!(summary.succeeded, 3);
        assert_eq!(summary.retried, 2);
        assert_eq!(summary.given_up, 1);
        assert_eq!((summary.panicked, summary.timed_out), (0, 0));
        assert!(summary.is_drained());
        assert!(summary.unfinished.is_empty(), "{:?}", summary.unfinished);
        assert_eq!(
            [
                attempts.of("done"),
                attempts.of("retry"),
                attempts.of("after"),
                attempts.of("give-up")
            ],
            [1, 2, 2, 1]
        );
        // Success forgets the failures the retry counted.
        for item in ["done", "retry", "after", "give-up"] {
            assert_eq!(queue.num_requeues(&item.to_owned()).await.unwrap(), 0);
        }
        let gave_up = gave_up.lock().unwrap();
        assert_eq!(gave_up.len(), 1);
        assert_eq!(gave_up[0].item, "give-up");
        assert_eq!(gave_up[0].reason, GiveUpReason::Handler);
        assert_eq!(gave_up[0].error, None);
    }

    pub(crate) async fn an_item_that_keeps_failing_is_given_up_after_max_retries<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        let attempts = Attempts::default();
        let (gave_up, on_give_up) = give_ups();
        let handler_attempts = attempts.clone();
        let workers = Workers::new(queue.clone())
            .max_retries(2)
            .on_give_up(on_give_up)
            .spawn_async(move |item: String| {
                handler_attempts.next(&item);
                async move { Err::<(), _>("boom") }
            });
        add(&queue, "flaky").await;
        wait_processed(&workers, 3).await;
        // No fourth attempt comes.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let summary = workers.shut_down().await;
        assert_eq!(attempts.of("flaky"), 3);
        assert_eq!(
            (summary.processed, summary.retried, summary.given_up),
            (3, 2, 1)
        );
        assert_eq!(queue.num_requeues(&"flaky".to_owned()).await.unwrap(), 0);
        let gave_up = gave_up.lock().unwrap();
        assert_eq!(gave_up.len(), 1);
        assert_eq!(gave_up[0].reason, GiveUpReason::MaxRetries);
        assert_eq!(gave_up[0].retries, 2);
        // The handler's error keeps its type on the way to the callback.
        assert_eq!(
            gave_up[0]
                .error
                .as_ref()
                .and_then(|failure| failure.downcast_ref::<&str>()),
            Some(&"boom")
        );
    }

    pub(crate) async fn a_panicking_handler_is_retried_and_its_worker_keeps_running<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        let attempts = Attempts::default();
        let handler_attempts = attempts.clone();
        let workers = Workers::new(queue.clone())
            .count(1)
            .spawn_async(move |item: String| {
                let attempt = handler_attempts.next(&item);
                if item == "panics-at-call" && attempt == 1 {
                    panic!("handler panicked before its future");
                }
                async move {
                    if item == "panics-in-future" && attempt == 1 {
                        panic!("future panicked");
                    }
                    Outcome::Done
                }
            });
        add(&queue, "panics-at-call").await;
        add(&queue, "panics-in-future").await;
        add(&queue, "fine").await;
        wait_processed(&workers, 5).await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 5);
        assert_eq!(summary.panicked, 2);
        assert_eq!(summary.retried, 2);
        assert_eq!(summary.succeeded, 3);
        assert_eq!(attempts.of("fine"), 1);
    }

    pub(crate) async fn a_handler_past_its_timeout_is_cancelled_and_retried<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        let attempts = Attempts::default();
        let handler_attempts = attempts.clone();
        let workers = Workers::new(queue.clone())
            .timeout(Duration::from_millis(100))
            .spawn_async(move |item: String| {
                let attempt = handler_attempts.next(&item);
                async move {
                    if attempt == 1 {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    Outcome::Done
                }
            });
        add(&queue, "slow").await;
        wait_processed(&workers, 2).await;
        let summary = workers.shut_down().await;
        assert_eq!(attempts.of("slow"), 2);
        assert_eq!(
            (summary.timed_out, summary.retried, summary.succeeded),
            (1, 1, 1)
        );
    }

    pub(crate) async fn no_item_is_processed_by_two_workers_at_once<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        let busy = Arc::new(Mutex::new(HashSet::new()));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let (handler_busy, handler_overlaps) = (busy.clone(), overlaps.clone());
        let workers = Workers::new(queue.clone())
            .count(4)
            .spawn_async(move |item: String| {
                let (busy, overlaps) = (handler_busy.clone(), handler_overlaps.clone());
                async move {
                    if !busy.lock().unwrap().insert(item.clone()) {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    busy.lock().unwrap().remove(&item);
                }
            });
        for round in 0..5 {
            for n in 0..8 {
                add(&queue, &format!("item-{n}")).await;
            }
            if round % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
        eventually("the queue to drain", || async {
            queue.len().await.unwrap() == 0 && workers.stats().in_flight.is_empty()
        })
        .await;
        let summary = workers.shut_down().await;
        assert_eq!(overlaps.load(Ordering::Relaxed), 0);
        // Dedup: at least one processing per item, at most one per add.
        assert!(
            (8..=40).contains(&summary.processed),
            "processed {}",
            summary.processed
        );
        assert_eq!(summary.succeeded, summary.processed);
    }

    pub(crate) async fn shut_down_waits_for_items_in_flight<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        let workers = Workers::new(queue.clone())
            .count(2)
            .spawn_async(|_: String| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        add(&queue, "a").await;
        add(&queue, "b").await;
        add(&queue, "c").await;
        eventually("two items in flight", || async {
            workers.stats().in_flight.len() == 2
        })
        .await;
        let summary = workers.shut_down().await;
        assert_eq!((summary.processed, summary.succeeded), (2, 2));
        assert!(summary.is_drained());
        // The third was never taken: intake had stopped.
        assert_eq!(summary.left_in_queue, 1);
        assert!(summary.unfinished.is_empty());
        assert_eq!(queue.len().await.unwrap(), 1);
    }

    pub(crate) async fn shut_down_with_a_deadline_reports_what_is_still_in_flight<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        let workers = Workers::new(queue.clone())
            .shutdown_timeout(Duration::from_millis(100))
            .spawn_async(|_: String| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        add(&queue, "stuck").await;
        eventually("the item in flight", || async {
            !workers.stats().in_flight.is_empty()
        })
        .await;
        let started = Instant::now();
        let summary = workers.shut_down().await;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(summary.in_flight, ["stuck"]);
        assert!(!summary.is_drained());
        assert_eq!(summary.processed, 0);
    }

    pub(crate) async fn one_worker_takes_items_by_priority<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        for (item, priority) in [("a", None), ("b", Some(2)), ("c", Some(-1)), ("d", Some(2))] {
            let mut options = AddOptions::default();
            if let Some(p) = priority {
                options = options.priority(p);
            }
            assert!(
                Queue::add_with(&queue, item.to_owned(), options)
                    .await
                    .unwrap()
            );
        }
        // Raised while queued: behind d at priority 2.
        Queue::add_with(&queue, "a".to_owned(), AddOptions::default().priority(2))
            .await
            .unwrap();
        B::shut_down_everyone(&queue).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let seen = order.clone();
        let workers = Workers::new(queue.clone())
            .count(1)
            .spawn_async(move |item: String| {
                let seen = seen.clone();
                async move { seen.lock().unwrap().push(item) }
            });
        let summary = tokio::time::timeout(Duration::from_secs(10), workers.wait())
            .await
            .expect("the workers end by themselves");
        assert_eq!((summary.processed, summary.succeeded), (4, 4));
        assert_eq!(*order.lock().unwrap(), ["b", "d", "a", "c"]);
    }

    /// The step of `Workers` on a batching backend (`Queue::done_and_next_many`): items whose
    /// delayed re-adds came due while they were processed are queued again in the order of
    /// the step, as one done after another would queue them, whatever the backend saw of
    /// those re-adds before (a's came due before b's and c's were added; b's and c's came due
    /// with nothing run since).
    pub(crate) async fn a_batched_done_requeues_due_re_adds_in_the_order_of_the_step<B: Backend>(
        backend: &B,
    ) {
        let queue = backend.queue().await;
        for item in ["a", "b", "c"] {
            add(&queue, item).await;
        }
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push((Queue::get(&queue).await.unwrap().unwrap(), false));
        }
        let after = |ms| AddOptions::default().after(Duration::from_millis(ms));
        Queue::add_with(&queue, "a".to_owned(), after(20))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        for item in ["b", "c"] {
            Queue::add_with(&queue, item.to_owned(), after(1))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let step = Queue::done_and_next_many(&queue, held, 3).await.unwrap();
        assert_eq!(step.done.len(), 3);
        assert!(step.done.iter().all(Result::is_ok));
        let items: Vec<&str> = step
            .next
            .iter()
            .map(|lease| QueueLease::item(lease).as_str())
            .collect();
        assert_eq!(items, ["a", "b", "c"]);
    }

    pub(crate) async fn workers_end_when_the_queue_is_shut_down_and_empty<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        add(&queue, "a").await;
        add(&queue, "b").await;
        B::shut_down_everyone(&queue).await;
        let workers = Workers::new(queue.clone())
            .count(2)
            .spawn_async(|_: String| async {});
        let summary = tokio::time::timeout(Duration::from_secs(10), workers.wait())
            .await
            .expect("the workers end by themselves");
        assert_eq!((summary.processed, summary.succeeded), (2, 2));
        assert_eq!(summary.left_in_queue, 0);
    }

    pub(crate) async fn a_stop_lists_or_keeps_the_delayed_retries<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        let workers = Workers::new(queue.clone())
            .spawn_async(|_: String| async { Outcome::RetryAfter(Duration::from_secs(3600)) });
        add(&queue, "later").await;
        wait_processed(&workers, 1).await;
        let summary = workers.shut_down().await;
        assert_eq!((summary.processed, summary.retried), (1, 1));
        if B::SHARED {
            // The handle stopped; the queue did not: the delayed retry waits on the server
            // for the other processes.
            assert!(summary.unfinished.is_empty(), "{:?}", summary.unfinished);
            assert_eq!(B::delayed(&queue).await, 1);
        } else {
            // The shut down dropped the delayed retry: the summary hands it back.
            assert_eq!(summary.unfinished, ["later"]);
            assert_eq!(summary.left_in_queue, 1);
            assert_eq!(B::delayed(&queue).await, 0);
        }
    }
}
