//! The queue at its edges: a stop that accounts for every item it touched (a retry it
//! refuses changes nothing), a panicking
//! `Clone`, user code (a `Drop`, a metrics recorder) that calls back into the queue, a
//! panicking waker on the timer thread, the order `done` keeps with due items, and a token
//! bucket without a limit.
//!
//! Tests that could deadlock run their body on a thread and fail after a generous bound
//! instead of hanging. Real time is used only where the timer thread is under test (with
//! millisecond delays) and to bound waits, never to assert a duration.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use workq::clock::{Clock, FakeClock};
use workq::metrics::{MetricsProvider, QueueMetrics, QueueProbe};
use workq::rate_limiter::{RateLimiter, TokenBucket};
use workq::{AddOptions, Outcome, Queue, StopToken, TryGetError, WorkQueue, Workers};

/// Far above what any correct run needs; only turns a hang into a failure.
const GENEROUS: Duration = Duration::from_secs(20);

/// Runs `body` on its own thread and fails if it has not returned within [`GENEROUS`] (a
/// deadlock then fails the test instead of hanging it; the stuck thread is left behind).
fn within(what: &str, body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(GENEROUS) {
        Ok(()) => thread.join().expect("test body panicked"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(payload) = thread.join() {
                panic::resume_unwind(payload);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: deadlocked (no return in 20 s)"),
    }
}

/// Polls `condition` until it holds, at most [`GENEROUS`].
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < GENEROUS, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ----- 1. a graceful stop accounts for every item it touched -----

#[test]
fn a_retry_refused_after_the_stop_is_listed_not_counted_as_retried() {
    within("retry after stop", || {
        let clock = FakeClock::new();
        let queue: WorkQueue<String> = WorkQueue::builder().clock(clock).build();
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let workers = Workers::new(queue.clone())
            .count(1)
            .spawn_threads(move |_key: &String| {
                let _ = started_tx.send(());
                let _ = release_rx.lock().unwrap().recv();
                Outcome::Retry
            });
        queue.add("default/web-0".to_owned());
        started_rx.recv().unwrap();
        workers.stop();
        release_tx.send(()).unwrap();
        let summary = workers.wait();
        assert_eq!(summary.processed, 1);
        assert_eq!(
            summary.retried, 0,
            "the re-add was refused: nothing was put back"
        );
        assert_eq!(summary.unfinished, ["default/web-0".to_owned()]);
        assert_eq!(summary.left_in_queue, 1);
    });
}

#[test]
fn a_retry_after_refused_after_the_stop_is_listed() {
    within("retry after stop", || {
        let clock = FakeClock::new();
        let queue: WorkQueue<String> = WorkQueue::builder().clock(clock).build();
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let workers = Workers::new(queue.clone())
            .count(1)
            .spawn_threads(move |key: &String| {
                let _ = started_tx.send(());
                let _ = release_rx.lock().unwrap().recv();
                if key == "fails" {
                    Err("boom".to_owned())
                } else {
                    Ok(Outcome::RetryAfter(Duration::from_secs(5)))
                }
            });
        queue.add("later".to_owned());
        queue.add("fails".to_owned());
        started_rx.recv().unwrap();
        workers.stop();
        release_tx.send(()).unwrap();
        let summary = workers.wait();
        assert_eq!(summary.retried, 0);
        // "later" was refused; "fails" was still queued when the stop came.
        assert_eq!(summary.unfinished, ["later".to_owned()]);
        assert_eq!(queue.len(), 1);
        assert_eq!(summary.left_in_queue, 2);
    });
}

/// Counts the retries the queue accepted (a delayed add after shut down is not one) and
/// stops a token on the `n`-th get.
#[derive(Clone, Default)]
struct Hooks {
    retries: Arc<AtomicUsize>,
    gets: Arc<AtomicUsize>,
    stop_on_get: Arc<Mutex<Option<(usize, StopToken)>>>,
}

impl MetricsProvider for Hooks {
    fn new_queue(&self, _name: &str, _probe: QueueProbe) -> Box<dyn QueueMetrics> {
        Box::new(self.clone())
    }
}

impl QueueMetrics for Hooks {
    fn retry(&self) {
        self.retries.fetch_add(1, Ordering::SeqCst);
    }

    fn get(&self, _queued_for: Duration) {
        let n = self.gets.fetch_add(1, Ordering::SeqCst) + 1;
        let stop = self.stop_on_get.lock().unwrap().clone();
        if let Some((at, stop)) = stop
            && at == n
        {
            stop.stop();
        }
    }
}

#[test]
fn delayed_adds_racing_the_stop_are_all_listed() {
    within("delayed adds racing the stop", || {
        for round in 0..50u64 {
            let hooks = Hooks::default();
            let clock = FakeClock::new();
            let queue: WorkQueue<u64> = WorkQueue::builder()
                .name("race")
                .clock(clock)
                .metrics(hooks.clone())
                .build();
            let workers = Workers::new(queue.clone())
                .count(1)
                .spawn_threads(|_: &u64| Outcome::Done);
            let producer = {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    for key in 0..20_000u64 {
                        queue.add_after(key, Duration::from_secs(3600));
                        if queue.is_shutting_down() {
                            break;
                        }
                    }
                })
            };
            wait_until("the producer started", || queue.delayed_len() > 0);
            let summary = workers.shut_down();
            producer.join().unwrap();
            let accepted = hooks.retries.load(Ordering::SeqCst);
            let mut listed = summary.unfinished.clone();
            listed.sort_unstable();
            listed.dedup();
            assert_eq!(
                listed.len(),
                accepted,
                "round {round}: every delayed add the queue accepted is listed once"
            );
            assert_eq!(summary.left_in_queue, accepted);
        }
    });
}

#[test]
fn an_item_handed_to_a_thread_worker_during_the_stop_is_listed() {
    within("item handed out during the stop", || {
        let hooks = Hooks::default();
        let stop = StopToken::new();
        *hooks.stop_on_get.lock().unwrap() = Some((2, stop.clone()));
        let queue: WorkQueue<&'static str> = WorkQueue::builder()
            .name("handed")
            .clock(FakeClock::new())
            .metrics(hooks.clone())
            .build();
        queue.add("first");
        queue.add("second");
        let handled = Arc::new(Mutex::new(Vec::new()));
        let workers = {
            let handled = handled.clone();
            Workers::new(queue.clone())
                .count(1)
                .stop_token(stop.clone())
                .spawn_threads(move |key: &&'static str| handled.lock().unwrap().push(*key))
        };
        let summary = workers.wait();
        assert_eq!(*handled.lock().unwrap(), ["first"]);
        assert_eq!(summary.unfinished, ["second"]);
        assert_eq!(summary.left_in_queue, 1);
    });
}

// ----- 2. a panicking Clone loses nothing -----

/// An item whose `Clone` panics while its switch is on.
#[derive(Debug)]
struct Brittle {
    id: u32,
    panic_on_clone: Arc<AtomicBool>,
}

impl Clone for Brittle {
    fn clone(&self) -> Self {
        assert!(
            !self.panic_on_clone.load(Ordering::SeqCst),
            "clone of {} refused",
            self.id
        );
        Self {
            id: self.id,
            panic_on_clone: self.panic_on_clone.clone(),
        }
    }
}

impl PartialEq for Brittle {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Brittle {}

impl Hash for Brittle {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

#[test]
fn a_panicking_clone_in_get_loses_nothing() {
    let switch = Arc::new(AtomicBool::new(false));
    let item = |id| Brittle {
        id,
        panic_on_clone: switch.clone(),
    };
    let queue: WorkQueue<Brittle> = WorkQueue::builder().clock(FakeClock::new()).build();
    queue.add(item(1));
    queue.add(item(2));
    switch.store(true, Ordering::SeqCst);
    let got = panic::catch_unwind(AssertUnwindSafe(|| queue.try_get()));
    assert!(got.is_err(), "the clone panicked");
    switch.store(false, Ordering::SeqCst);
    assert_eq!(queue.len(), 2, "both items are still queued");
    let first = queue
        .try_get()
        .expect("the first item is handed out after all");
    assert_eq!(first.id, 1);
    drop(first);
    let second = queue.try_get().unwrap();
    assert_eq!(second.id, 2);
    drop(second);
    queue.add(item(1));
    assert_eq!(queue.len(), 1, "a later add of the item is not swallowed");
}

// ----- 3. no user code under the queue's lock -----

/// An item whose `Drop` reads the queue it belongs to, once hooked.
#[derive(Clone)]
struct Reentrant {
    id: u32,
    hook: Arc<Mutex<Option<WorkQueue<Reentrant>>>>,
}

impl PartialEq for Reentrant {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Reentrant {}

impl Hash for Reentrant {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl Drop for Reentrant {
    fn drop(&mut self) {
        let queue = self.hook.lock().unwrap().clone();
        if let Some(queue) = queue {
            let _ = queue.len();
            let _ = queue.tracked_len();
        }
    }
}

/// A queue on a fake clock whose items read it when dropped, and a maker of such items.
fn reentrant_queue() -> (
    FakeClock,
    WorkQueue<Reentrant>,
    impl Fn(u32) -> Reentrant + Clone,
) {
    let clock = FakeClock::new();
    let queue: WorkQueue<Reentrant> = WorkQueue::builder().clock(clock.clone()).build();
    let hook = Arc::new(Mutex::new(Some(queue.clone())));
    let make = move |id| Reentrant {
        id,
        hook: hook.clone(),
    };
    (clock, queue, make)
}

/// Breaks the cycle a hooked item makes with its queue.
fn unhook(item: &Reentrant) {
    *item.hook.lock().unwrap() = None;
}

#[test]
fn a_duplicate_add_drops_its_item_outside_the_lock() {
    within("duplicate add", || {
        let (_clock, queue, make) = reentrant_queue();
        queue.add(make(1));
        queue.add(make(1));
        queue.add_after(make(1), Duration::from_secs(1));
        assert_eq!(queue.len(), 1);
        let lease = queue.try_get().unwrap();
        queue.add(make(1)); // dirty
        queue.add(make(1)); // duplicate of a dirty item
        drop(lease);
        unhook(&make(0));
    });
}

#[test]
fn items_refused_after_shut_down_are_dropped_outside_the_lock() {
    within("adds after shut down", || {
        let (_clock, queue, make) = reentrant_queue();
        queue.shut_down();
        queue.add(make(1));
        queue.add_after(make(2), Duration::from_secs(1));
        queue.add_rate_limited(make(3));
        assert_eq!(queue.tracked_len(), 0);
        unhook(&make(0));
    });
}

#[test]
fn delayed_items_dropped_by_shut_down_are_dropped_outside_the_lock() {
    within("shut down with delayed items", || {
        let (_clock, queue, make) = reentrant_queue();
        queue.add_after(make(1), Duration::from_secs(1));
        queue.add_after(make(2), Duration::from_secs(2));
        queue.shut_down();
        assert_eq!(queue.tracked_len(), 0);
        unhook(&make(0));
    });
}

/// A recorder that reads the queue through its probe on every event.
#[derive(Clone, Default)]
struct Probing {
    probe: Arc<Mutex<Option<QueueProbe>>>,
    events: Arc<AtomicUsize>,
}

impl MetricsProvider for Probing {
    fn new_queue(&self, _name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        *self.probe.lock().unwrap() = Some(probe);
        Box::new(self.clone())
    }
}

impl Probing {
    fn read(&self) {
        self.events.fetch_add(1, Ordering::SeqCst);
        let probe = self.probe.lock().unwrap().clone();
        if let Some(probe) = probe {
            assert!(probe.stats().is_some());
        }
    }
}

impl QueueMetrics for Probing {
    fn add(&self) {
        self.read();
    }
    fn get(&self, _queued_for: Duration) {
        self.read();
    }
    fn done(&self, _worked_for: Duration) {
        self.read();
    }
    fn retry(&self) {
        self.read();
    }
}

#[test]
fn the_metrics_recorder_is_called_outside_the_lock() {
    within("a recorder reading the queue", || {
        let recorder = Probing::default();
        let clock = FakeClock::new();
        let queue: WorkQueue<&'static str> = WorkQueue::builder()
            .name("probing")
            .clock(clock.clone())
            .metrics(recorder.clone())
            .build();
        queue.add("a");
        queue.add_after("b", Duration::from_secs(1));
        clock.step(Duration::from_secs(1));
        let lease = queue.try_get().unwrap();
        queue.add("a");
        drop(lease);
        let _ = queue.try_get().unwrap();
        // add a, retry b, add b (promoted), get a, add a (dirty), done a, get b.
        assert!(recorder.events.load(Ordering::SeqCst) >= 7);
    });
}

// ----- 4. the timer thread cannot die silently -----

/// A waker that panics, after saying so.
struct PanickingWaker(AtomicBool);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
        panic!("a waker that panics");
    }
}

#[test]
fn a_panicking_waker_does_not_stop_the_timer() {
    within("timer after a panicking waker", || {
        let queue: WorkQueue<&'static str> = WorkQueue::new();
        let panicking = Arc::new(PanickingWaker(AtomicBool::new(false)));
        let waker = Waker::from(panicking.clone());
        {
            let mut get = pin!(queue.get());
            assert!(matches!(
                get.as_mut().poll(&mut Context::from_waker(&waker)),
                Poll::Pending
            ));
            queue.add_after("first", Duration::from_millis(5));
            wait_until("the timer woke the panicking waker", || {
                panicking.0.load(Ordering::SeqCst)
            });
        }
        assert_eq!(*queue.try_get().unwrap(), "first");
        // The timer must still be there for the next delayed item.
        let (got_tx, got_rx) = mpsc::channel();
        let getter = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let _ = got_tx.send(queue.blocking_get().map(|lease| *lease));
            })
        };
        queue.add_after("second", Duration::from_millis(5));
        let got = got_rx.recv_timeout(Duration::from_secs(5));
        queue.shut_down();
        getter.join().unwrap();
        assert_eq!(
            got.expect("a getter waiting for a delayed item is woken"),
            Some("second")
        );
    });
}

// ----- 5. done promotes due items first -----

/// A clock that moves only when told to, and does not tell the queue (so the queue keeps its
/// own timer thread, which sleeps far longer than the test runs).
struct Manual(Mutex<Instant>);

impl Clock for Manual {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

#[test]
fn done_promotes_due_items_before_requeueing() {
    let clock = Arc::new(Manual(Mutex::new(Instant::now())));
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after("a", Duration::from_secs(3600));
    queue.add("b");
    let b = queue.try_get().unwrap();
    queue.add("b");
    *clock.0.lock().unwrap() += Duration::from_secs(3600);
    // "a" is due now; nothing has promoted it yet.
    drop(b);
    let order: Vec<_> = std::iter::from_fn(|| queue.try_get().ok().map(|lease| *lease)).collect();
    assert_eq!(order, ["a", "b"], "a was due before b was re-queued");
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
}

// ----- 6. an infinite token bucket -----

#[test]
fn an_infinite_token_bucket_with_no_burst_never_delays() {
    let bucket = TokenBucket::new(f64::INFINITY, 0);
    for _ in 0..1_000 {
        assert_eq!(bucket.when(&"a"), Duration::ZERO);
    }
    let on_fake = TokenBucket::with_clock(f64::INFINITY, 0, FakeClock::new());
    assert_eq!(on_fake.when(&"b"), Duration::ZERO);
}

#[test]
#[should_panic(expected = "TokenBucket: qps must be zero or positive, got NaN")]
fn a_nan_token_bucket_panics_with_a_message() {
    let _ = TokenBucket::new(f64::NAN, 1);
}

/// A failed item's step that the shut-down queue refuses changes nothing: the re-add after a
/// delay is refused before the item's failures are forgotten, so an item listed unfinished
/// keeps its history (the trait's default forgot first).
#[test]
fn a_retry_the_shut_down_queue_refuses_changes_nothing() {
    let queue: WorkQueue<String> = WorkQueue::builder().clock(FakeClock::new()).build();
    queue.add("key".to_owned());
    let lease = queue.try_get().unwrap();
    queue.add_rate_limited("key".to_owned());
    queue.add_rate_limited("key".to_owned());
    assert_eq!(queue.num_requeues(&"key".to_owned()), 2);
    queue.shut_down();
    let back = futures::executor::block_on(Queue::retry_and_done(
        &queue,
        lease,
        AddOptions::default().after(Duration::from_secs(1)),
        true,
    ))
    .unwrap();
    assert!(back.is_some(), "the refused retry hands the lease back");
    assert_eq!(queue.num_requeues(&"key".to_owned()), 2);
}

/// A backend that relies on the trait's default `Queue::retry_and_done`, over the in-memory
/// queue, whose leases the test can lose (as a lease expires on a server and another holder
/// takes the item): a lost lease's `done` is refused.
#[derive(Clone)]
struct Losable {
    queue: WorkQueue<String>,
    lost: Arc<AtomicBool>,
}

/// [`Losable`]'s lease.
#[derive(Debug)]
struct LosableLease {
    lease: workq::Lease<String>,
    lost: Arc<AtomicBool>,
}

/// [`Losable`]'s error: the lease was lost.
#[derive(Debug)]
struct Lost;

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lease was lost")
    }
}

impl std::error::Error for Lost {}

impl workq::QueueLease for LosableLease {
    type Item = String;
    type Error = Lost;

    fn item(&self) -> &String {
        self.lease.item()
    }

    fn priority(&self) -> i32 {
        self.lease.priority()
    }

    async fn done(self) -> Result<(), Lost> {
        if self.lost.load(Ordering::SeqCst) {
            // The other holder's to end.
            std::mem::forget(self.lease);
            return Err(Lost);
        }
        self.lease.done();
        Ok(())
    }

    async fn release(self) -> Result<bool, Lost> {
        if self.lost.load(Ordering::SeqCst) {
            std::mem::forget(self.lease);
            return Err(Lost);
        }
        Ok(workq::QueueLease::release(self.lease).await.unwrap())
    }
}

impl Queue for Losable {
    type Item = String;
    type Lease = LosableLease;
    type Error = Lost;

    fn name(&self) -> Option<&str> {
        None
    }

    async fn add_with(&self, item: String, options: AddOptions) -> Result<bool, Lost> {
        Ok(Queue::add_with(&self.queue, item, options).await.unwrap())
    }

    async fn forget(&self, item: &String) -> Result<(), Lost> {
        self.queue.forget(item);
        Ok(())
    }

    async fn num_requeues(&self, item: &String) -> Result<usize, Lost> {
        Ok(self.queue.num_requeues(item))
    }

    async fn len(&self) -> Result<usize, Lost> {
        Ok(self.queue.len())
    }

    async fn get(&self) -> Result<Option<LosableLease>, Lost> {
        Ok(self.queue.get().await.map(|lease| LosableLease {
            lease,
            lost: self.lost.clone(),
        }))
    }

    fn is_lease_lost(_: &Lost) -> bool {
        true
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.queue)
    }

    async fn shut_down_with_drain(&self) -> Result<(), Lost> {
        self.queue.shut_down_with_drain().await;
        Ok(())
    }

    async fn is_shutting_down(&self) -> Result<bool, Lost> {
        Ok(self.queue.is_shutting_down())
    }
}

/// The trait's default `Queue::retry_and_done` is fenced: for a lease that is no longer the
/// caller's, a rate-limited retry counts no failure and re-adds nothing, and a retry after
/// a delay (with its forget) forgets nothing. The default forgot and added before the
/// fenced `done`, so a stale holder moved the count 2 -> 3 and queued the item again, or
/// reset it to 0. The current holder's retries still apply.
#[test]
fn the_default_retry_and_done_changes_nothing_for_a_stale_holder() {
    use futures::executor::block_on;

    let item = || "key".to_owned();
    // A queue holding the item under a lease, with two failures counted.
    let leased = || {
        let queue = Losable {
            queue: WorkQueue::builder().clock(FakeClock::new()).build(),
            lost: Arc::new(AtomicBool::new(false)),
        };
        queue.queue.add(item());
        queue.queue.add_rate_limited(item());
        queue.queue.add_rate_limited(item());
        let lease = block_on(Queue::get(&queue)).unwrap().unwrap();
        assert_eq!(queue.queue.num_requeues(&item()), 2);
        (queue, lease)
    };
    let cases = [
        (AddOptions::default().rate_limited(), false, 3),
        (AddOptions::default().after(Duration::from_secs(1)), true, 0),
    ];
    for (options, forget, applied_count) in cases {
        let (queue, lease) = leased();
        queue.lost.store(true, Ordering::SeqCst);
        let refused = block_on(Queue::retry_and_done(&queue, lease, options, forget));
        assert!(matches!(refused, Err(Lost)), "{options:?}");
        assert_eq!(queue.queue.num_requeues(&item()), 2, "{options:?}");
        assert_eq!(
            queue.queue.delayed_len(),
            0,
            "{options:?}: nothing re-added"
        );

        let (queue, lease) = leased();
        let applied = block_on(Queue::retry_and_done(&queue, lease, options, forget));
        assert!(matches!(applied, Ok(None)), "{options:?}");
        assert_eq!(
            queue.queue.num_requeues(&item()),
            applied_count,
            "{options:?}"
        );
        assert_eq!(queue.queue.delayed_len(), 1, "{options:?}: re-added");
        assert_eq!(queue.queue.processing_len(), 0);
    }
}
