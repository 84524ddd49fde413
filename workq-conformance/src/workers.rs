//! The `Workers` suite every backend runs: each rule drives a `workq::Workers` pool over
//! a queue through the `workq::Queue` trait and checks the same outcomes, retries,
//! give-ups, panics, timeouts, stops and summaries. A backend's tests implement [`Backend`]
//! for its queues and instantiate every rule with
//! `workq_conformance::for_each_workers_rule!(its_macro)`; the in-memory queue's [`Memory`]
//! is here.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workq::rate_limiter::ExponentialFailure;
use workq::{AddOptions, DoneMany, Outcome, Queue, QueueLease, WorkQueue, Workers};
use workq::{AsyncWorkers, GiveUp, GiveUpReason};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in
/// [`workers::rules`](crate::workers::rules).
#[macro_export]
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
            fifo_holds_through_slow_batched_steps,
            a_released_item_goes_back_to_the_head,
            the_pool_holds_no_lease_that_no_worker_takes,
            stop_then_drain_then_wait_returns,
            after_shut_down_every_item_is_accounted_for,
            a_stale_holders_failure_path_changes_nothing,
            a_batched_step_that_fails_as_a_whole_loses_no_item,
            a_pool_larger_than_one_step_keeps_the_promise,
        );
    };
}

/// Makes fresh queues of one backend for one test.
pub trait Backend: Send + Sync {
    /// The queues it makes.
    type Q: Queue<Item = String>;
    /// Whether a shut down handle leaves its delayed items to the other processes (they stay
    /// in the queue) instead of dropping them.
    const SHARED: bool;
    /// A fresh, empty queue.
    fn queue(&self) -> impl Future<Output = Self::Q> + Send;
    /// Shuts the queue down for everyone (in memory: `shut_down`; on Redis: the fleet).
    fn shut_down_everyone(queue: &Self::Q) -> impl Future<Output = ()> + Send;
    /// How many items wait for a delay.
    fn delayed(queue: &Self::Q) -> impl Future<Output = usize> + Send;
    /// Two handles on one fresh queue whose leases last `lease` and are not renewed, so that
    /// the second takes an item that the first holds past its lease; `None` where a lease
    /// cannot be lost (in memory: the rules then lose leases through [`Wrap::lose`]).
    fn expiring(&self, lease: Duration) -> impl Future<Output = Option<(Self::Q, Self::Q)>> + Send {
        let _ = lease;
        async { None }
    }
}

/// The in-memory `WorkQueue`.
#[derive(Debug)]
pub struct Memory;

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
/// ([`Queue::batch_limit`] 8): every rule then runs through `Workers`' batched steps, whose
/// `done_and_next_many` hands out up to the items asked for, as a server's does.
#[derive(Debug)]
pub struct BatchedMemory;

/// A [`WorkQueue`] whose steps `Workers` batch.
#[derive(Debug, Clone)]
pub struct Batched(WorkQueue<String>);

impl Batched {
    /// Wraps `queue` so that `Workers` batch its steps.
    pub fn new(queue: WorkQueue<String>) -> Self {
        Self(queue)
    }
}

impl Queue for Batched {
    type Item = String;
    type Lease = workq::Lease<String>;
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

    fn retry_and_done(
        &self,
        lease: Self::Lease,
        options: AddOptions,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        Queue::retry_and_done(&self.0, lease, options, forget)
    }

    /// The `done`s in order, then up to `max` items that are ready, as a shared backend's
    /// step hands out (the trait's default takes at most one next item per `done`). Also
    /// once the queue is shut down, as the in-memory queue's `try_get` drains it: nothing in
    /// the trait forbids it, and a stopped pool must take nothing even so.
    async fn done_and_next_many(
        &self,
        leases: Vec<(Self::Lease, bool)>,
        max: usize,
    ) -> Result<DoneMany<Self::Lease, Self::Error>, Self::Error> {
        let mut done = Vec::with_capacity(leases.len());
        for (lease, forget) in leases {
            if forget {
                self.0.forget(lease.item());
            }
            lease.done();
            done.push(Ok(()));
        }
        let mut next = Vec::new();
        while next.len() < max {
            match self.0.try_get() {
                Ok(lease) => next.push(lease),
                Err(_) => break,
            }
        }
        Ok(DoneMany { done, next })
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

/// What a [`Wrap`] does to the calls it passes on, and what it saw.
#[derive(Debug, Default)]
pub struct Faults {
    /// How long each `get` waits before it reaches the backend.
    get_delay: Mutex<Duration>,
    /// How long each batched step waits before it reaches the backend.
    step_delay: Mutex<Duration>,
    /// Batched steps still to fail as a whole: they do not reach the backend, and the leases
    /// they carried are released (the backend hands their items out again).
    failing_steps: AtomicUsize,
    /// Batched steps that failed as a whole.
    failed_steps: AtomicUsize,
    /// Batched steps still to hand out one item fewer than asked for, among those that ask
    /// only for the next items of the workers whose `done`s they carry (as when the backend
    /// skips an item it cannot take now: a row another transaction locks).
    short_steps: AtomicUsize,
    /// Items whose lease is lost: the worker's next `done`, retry or give-up of the item is
    /// refused with [`WrapError::LeaseLost`] and changes nothing; the lease is ended as by
    /// another holder that took the item and finished it (a plain `done`).
    lost: Mutex<HashSet<String>>,
    /// Leases handed out and not ended yet, and the most at once.
    out: AtomicUsize,
    most_out: AtomicUsize,
}

impl Faults {
    fn delay(of: &Mutex<Duration>) -> Duration {
        *of.lock().unwrap()
    }

    fn handed(&self, n: usize) {
        let out = self.out.fetch_add(n, Ordering::SeqCst) + n;
        self.most_out.fetch_max(out, Ordering::SeqCst);
    }

    fn ended(&self, n: usize) {
        self.out.fetch_sub(n, Ordering::SeqCst);
    }

    fn is_lost(&self, item: &str) -> bool {
        self.lost.lock().unwrap().contains(item)
    }
}

/// A backend's queue with slowness and faults a real server cannot produce on cue: slow
/// `get`s and batched steps, batched steps that fail as a whole, leases lost on demand. It
/// passes every call on to the queue it wraps (the backend's own `retry_and_done`,
/// `done_and_next_many`, `batch_limit` and `steps_in_flight` included), and counts the leases
/// it handed out that are not ended yet.
#[derive(Debug, Clone)]
pub struct Wrap<Q> {
    /// The backend's queue.
    pub inner: Q,
    /// What it does to the calls, and what it saw.
    pub faults: Arc<Faults>,
}

impl<Q: Queue<Item = String>> Wrap<Q> {
    /// `inner`, passed on without a fault until one is asked for.
    pub fn new(inner: Q) -> Self {
        Wrap {
            inner,
            faults: Arc::default(),
        }
    }

    /// Each `get` waits `delay` before it reaches the backend.
    pub fn slow_gets(&self, delay: Duration) {
        *self.faults.get_delay.lock().unwrap() = delay;
    }

    /// Each batched step waits `delay` before it reaches the backend.
    pub fn slow_steps(&self, delay: Duration) {
        *self.faults.step_delay.lock().unwrap() = delay;
    }

    /// The next `n` batched steps fail as a whole.
    pub fn fail_steps(&self, n: usize) {
        self.faults.failing_steps.store(n, Ordering::SeqCst);
    }

    /// The next `n` batched steps that ask only for the next items of the workers whose
    /// `done`s they carry hand out one item fewer (one of those workers gets no next item,
    /// and goes idle).
    pub fn short_steps(&self, n: usize) {
        self.faults.short_steps.store(n, Ordering::SeqCst);
    }

    /// Batched steps that failed as a whole so far.
    pub fn failed_steps(&self) -> usize {
        self.faults.failed_steps.load(Ordering::SeqCst)
    }

    /// The lease of `item` is lost from now on.
    pub fn lose(&self, item: &str) {
        self.faults.lost.lock().unwrap().insert(item.to_owned());
    }

    /// Leases handed out and not ended.
    pub fn leases_out(&self) -> usize {
        self.faults.out.load(Ordering::SeqCst)
    }

    /// The most leases out at once so far.
    pub fn most_leases_out(&self) -> usize {
        self.faults.most_out.load(Ordering::SeqCst)
    }

    fn wrap(&self, lease: Q::Lease) -> WrapLease<Q::Lease> {
        self.faults.handed(1);
        WrapLease {
            inner: Some(lease),
            faults: self.faults.clone(),
        }
    }

    /// Ends a lost lease as the holder that took the item would (a plain `done`).
    async fn end_lost(&self, lease: WrapLease<Q::Lease>) -> WrapError<Q::Error> {
        let _ = QueueLease::done(lease.into_inner()).await;
        self.faults.ended(1);
        WrapError::LeaseLost
    }
}

/// A [`Wrap`]'s lease.
#[derive(Debug)]
pub struct WrapLease<L> {
    inner: Option<L>,
    faults: Arc<Faults>,
}

impl<L> WrapLease<L> {
    /// The backend's lease; the caller ends it and counts it ended.
    fn into_inner(mut self) -> L {
        self.inner.take().expect("a lease not ended")
    }
}

impl<L> Drop for WrapLease<L> {
    fn drop(&mut self) {
        if self.inner.take().is_some() {
            // Dropped without done or release: the backend's rule ends it.
            self.faults.ended(1);
        }
    }
}

impl<L: QueueLease> QueueLease for WrapLease<L> {
    type Item = L::Item;
    type Error = WrapError<L::Error>;

    fn item(&self) -> &L::Item {
        self.inner.as_ref().expect("a lease not ended").item()
    }

    fn priority(&self) -> i32 {
        self.inner.as_ref().expect("a lease not ended").priority()
    }

    async fn done(self) -> Result<(), Self::Error> {
        let faults = self.faults.clone();
        let inner = self.into_inner();
        let out = inner.done().await.map_err(WrapError::Backend);
        faults.ended(1);
        out
    }

    async fn release(self) -> Result<bool, Self::Error> {
        let faults = self.faults.clone();
        let inner = self.into_inner();
        let out = inner.release().await.map_err(WrapError::Backend);
        faults.ended(1);
        out
    }
}

/// A [`Wrap`]'s error: the backend's, or one the wrapper made.
#[derive(Debug)]
pub enum WrapError<E> {
    /// The backend's.
    Backend(E),
    /// A batched step failed as a whole ([`Wrap::fail_steps`]).
    StepFailed,
    /// The lease was lost ([`Wrap::lose`]).
    LeaseLost,
}

impl<E: std::fmt::Display> std::fmt::Display for WrapError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WrapError::Backend(error) => error.fmt(f),
            WrapError::StepFailed => f.write_str("the step failed (a fault the test made)"),
            WrapError::LeaseLost => f.write_str("the lease was lost (a fault the test made)"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for WrapError<E> {}

impl<Q: Queue<Item = String>> Queue for Wrap<Q> {
    type Item = String;
    type Lease = WrapLease<Q::Lease>;
    type Error = WrapError<Q::Error>;

    fn name(&self) -> Option<&str> {
        self.inner.name()
    }

    async fn add_with(&self, item: String, options: AddOptions) -> Result<bool, Self::Error> {
        Queue::add_with(&self.inner, item, options)
            .await
            .map_err(WrapError::Backend)
    }

    async fn add_all_with(
        &self,
        items: Vec<String>,
        options: AddOptions,
    ) -> Result<usize, Self::Error> {
        Queue::add_all_with(&self.inner, items, options)
            .await
            .map_err(WrapError::Backend)
    }

    async fn forget(&self, item: &String) -> Result<(), Self::Error> {
        Queue::forget(&self.inner, item)
            .await
            .map_err(WrapError::Backend)
    }

    async fn num_requeues(&self, item: &String) -> Result<usize, Self::Error> {
        Queue::num_requeues(&self.inner, item)
            .await
            .map_err(WrapError::Backend)
    }

    async fn len(&self) -> Result<usize, Self::Error> {
        Queue::len(&self.inner).await.map_err(WrapError::Backend)
    }

    async fn get(&self) -> Result<Option<Self::Lease>, Self::Error> {
        let delay = Faults::delay(&self.faults.get_delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let lease = Queue::get(&self.inner).await.map_err(WrapError::Backend)?;
        Ok(lease.map(|lease| self.wrap(lease)))
    }

    async fn done_and_next(
        &self,
        lease: Self::Lease,
        forget: bool,
    ) -> Result<Option<Self::Lease>, Self::Error> {
        if self.faults.is_lost(lease.item()) {
            return Err(self.end_lost(lease).await);
        }
        let out = Queue::done_and_next(&self.inner, lease.into_inner(), forget).await;
        self.faults.ended(1);
        let next = out.map_err(WrapError::Backend)?;
        Ok(next.map(|lease| self.wrap(lease)))
    }

    async fn retry_and_done(
        &self,
        lease: Self::Lease,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<Self::Lease>, Self::Error> {
        if self.faults.is_lost(lease.item()) {
            return Err(self.end_lost(lease).await);
        }
        let faults = lease.faults.clone();
        match Queue::retry_and_done(&self.inner, lease.into_inner(), options, forget).await {
            Ok(Some(back)) => Ok(Some(WrapLease {
                inner: Some(back),
                faults,
            })),
            Ok(None) => {
                self.faults.ended(1);
                Ok(None)
            }
            Err(error) => {
                self.faults.ended(1);
                Err(WrapError::Backend(error))
            }
        }
    }

    fn is_lease_lost(error: &Self::Error) -> bool {
        match error {
            WrapError::Backend(error) => Q::is_lease_lost(error),
            WrapError::StepFailed => false,
            WrapError::LeaseLost => true,
        }
    }

    async fn done_and_next_many(
        &self,
        leases: Vec<(Self::Lease, bool)>,
        max: usize,
    ) -> Result<DoneMany<Self::Lease, Self::Error>, Self::Error> {
        let delay = Faults::delay(&self.faults.step_delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let failing = self
            .faults
            .failing_steps
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            // The call did not reach the backend: its leases are let go of.
            for (lease, _) in leases {
                let _ = QueueLease::release(lease).await;
            }
            self.faults.failed_steps.fetch_add(1, Ordering::SeqCst);
            return Err(WrapError::StepFailed);
        }
        // Lost leases are refused on their own; the others go to the backend in one step.
        let mut outcomes: Vec<Option<Result<(), Self::Error>>> = Vec::new();
        let mut passed = Vec::new();
        for (lease, forget) in leases {
            if self.faults.is_lost(lease.item()) {
                outcomes.push(Some(Err(self.end_lost(lease).await)));
            } else {
                outcomes.push(None);
                passed.push((lease.into_inner(), forget));
            }
        }
        // Short only where every item asked for is for a worker whose `done` the step
        // carries: one of them then goes idle.
        let short = max > 0
            && max <= passed.len()
            && self
                .faults
                .short_steps
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let max = if short { max - 1 } else { max };
        let count = passed.len();
        let step = Queue::done_and_next_many(&self.inner, passed, max).await;
        self.faults.ended(count);
        let step = step.map_err(WrapError::Backend)?;
        let mut done = step.done.into_iter();
        let done = outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    done.next()
                        .expect("an outcome per done")
                        .map_err(WrapError::Backend)
                })
            })
            .collect();
        let next = step
            .next
            .into_iter()
            .map(|lease| self.wrap(lease))
            .collect();
        Ok(DoneMany { done, next })
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    fn steps_in_flight(&self) -> usize {
        self.inner.steps_in_flight()
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.inner)
    }

    async fn shut_down_with_drain(&self) -> Result<(), Self::Error> {
        Queue::shut_down_with_drain(&self.inner)
            .await
            .map_err(WrapError::Backend)
    }

    async fn is_shutting_down(&self) -> Result<bool, Self::Error> {
        Queue::is_shutting_down(&self.inner)
            .await
            .map_err(WrapError::Backend)
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
pub async fn eventually<F, Fut>(what: &str, mut check: F)
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
        sink.lock().unwrap().push(gave_up.clone());
    })
}

/// Runs `body` to its end on a tokio runtime of its own with one thread (on a thread of its
/// own, so that it may be called from inside another runtime, which waits), and hands back
/// its panic if it panics.
fn on_one_thread<F>(body: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(body)
        });
        run.join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// `item-000`, `item-001`, ...: `n` items.
fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|n| format!("item-{n:03}")).collect()
}

/// Each item once, in the order of its first start.
fn first_starts(started: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    started
        .iter()
        .filter(|item| seen.insert(item.as_str()))
        .cloned()
        .collect()
}

/// A backlog through slow batched steps: two workers over a [`Wrap`] of a fresh queue whose
/// batched steps take 10 ms and whose `get`s 30 ms. The handler notes the order items start
/// in, and retries the first attempt of each item of `retry_first`. Once five items started,
/// two steps hand out one item fewer than asked for: the worker whose `done` such a step
/// carries goes idle, and waits for an item through the pool's one `get` while the other
/// worker's `done`s come (the moment a step used to take a lease for the worker that the
/// `get` serves, and to keep it for nobody while the backlog lasted).
struct Backlog<Q: Queue<Item = String>> {
    queue: Wrap<Q>,
    workers: AsyncWorkers<String, Wrap<Q>>,
    /// Every start, in order (an item retried starts twice).
    started: Arc<Mutex<Vec<String>>>,
    /// The items whose handler returned done, in order.
    succeeded: Arc<Mutex<Vec<String>>>,
}

impl<Q: Queue<Item = String>> Backlog<Q> {
    async fn start<B: Backend<Q = Q>>(backend: &B, items: &[String], retry_first: &[&str]) -> Self {
        let queue = Wrap::new(backend.queue().await);
        for item in items {
            add(&queue, item).await;
        }
        queue.slow_gets(Duration::from_millis(30));
        queue.slow_steps(Duration::from_millis(10));
        let started = Arc::new(Mutex::new(Vec::new()));
        let succeeded = Arc::new(Mutex::new(Vec::new()));
        let retry: HashSet<String> = retry_first.iter().map(|&item| item.to_owned()).collect();
        let (handler_started, handler_succeeded) = (started.clone(), succeeded.clone());
        let workers = Workers::new(queue.clone())
            .count(2)
            .spawn_async(move |item: String| {
                let first = {
                    let mut started = handler_started.lock().unwrap();
                    let first = !started.contains(&item);
                    started.push(item.clone());
                    first
                };
                let outcome = if first && retry.contains(&item) {
                    Outcome::Retry
                } else {
                    handler_succeeded.lock().unwrap().push(item);
                    Outcome::Done
                };
                async move { outcome }
            });
        eventually("five items to start", || async {
            started.lock().unwrap().len() >= 5
        })
        .await;
        queue.short_steps(1);
        Backlog {
            queue,
            workers,
            started,
            succeeded,
        }
    }
}

/// What a list shared with a handler holds now.
fn snapshot(list: &Mutex<Vec<String>>) -> Vec<String> {
    list.lock().unwrap().clone()
}

/// What a stale holder's handler returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stale {
    Done,
    Retry,
    RetryAfter,
    GiveUp,
    /// An error, with `max_retries` reached: given up.
    ErrorPastMaxRetries,
}

/// One case of [`rules::a_stale_holders_failure_path_changes_nothing`].
async fn stale_holder<B: Backend>(backend: &B, case: Stale) {
    const ITEM: &str = "stale";
    let (queue, other) = match backend.expiring(Duration::from_millis(400)).await {
        Some((queue, other)) => (Wrap::new(queue), Some(other)),
        None => (Wrap::new(backend.queue().await), None),
    };
    // Two failures so far: a give-up or a delayed retry would forget them, a retry count a
    // third.
    let rate_limited = AddOptions::default().rate_limited();
    for _ in 0..2 {
        Queue::add_with(&queue, ITEM.to_owned(), rate_limited)
            .await
            .unwrap();
    }
    assert_eq!(queue.num_requeues(&ITEM.to_owned()).await.unwrap(), 2);
    let started = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(tokio::sync::Notify::new());
    let (gave_up, on_give_up) = give_ups();
    let (handler_started, handler_go) = (started.clone(), go.clone());
    let workers = Workers::new(queue.clone())
        .count(1)
        .max_retries(if case == Stale::ErrorPastMaxRetries {
            2
        } else {
            10
        })
        .on_give_up(on_give_up)
        .spawn_async(move |_: String| {
            handler_started.fetch_add(1, Ordering::SeqCst);
            let go = handler_go.clone();
            async move {
                go.notified().await;
                match case {
                    Stale::Done => Ok(Outcome::Done),
                    Stale::Retry => Ok(Outcome::Retry),
                    Stale::RetryAfter => Ok(Outcome::RetryAfter(Duration::from_secs(3600))),
                    Stale::GiveUp => Ok(Outcome::GiveUp),
                    Stale::ErrorPastMaxRetries => Err("boom"),
                }
            }
        });
    eventually("the handler to start", || async {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    // The lease is lost: another consumer takes the item (or, in memory, the wrapper
    // refuses the worker's calls as a backend would).
    let taken = match &other {
        Some(other) => Some(
            tokio::time::timeout(Duration::from_secs(10), Queue::get(other))
                .await
                .expect("the second handle takes the item once the lease expired")
                .unwrap()
                .expect("not shut down"),
        ),
        None => {
            queue.lose(ITEM);
            None
        }
    };
    go.notify_one();
    wait_processed(&workers, 1).await;
    let summary = workers.shut_down().await;
    assert_eq!(started.load(Ordering::SeqCst), 1, "{case:?}: handled again");
    assert_eq!(summary.lease_lost, 1, "{case:?}: {summary:?}");

    assert_eq!(
        (summary.succeeded, summary.retried, summary.given_up),
        (0, 0, 0),
        "{case:?}: {summary:?}"
    );
    assert!(
        gave_up.lock().unwrap().is_empty(),
        "{case:?}: a give-up was reported for an item another worker holds"
    );
    let reader = other.as_ref().unwrap_or(&queue.inner);
    assert_eq!(
        Queue::num_requeues(reader, &ITEM.to_owned()).await.unwrap(),
        2,
        "{case:?}: the stale holder moved the failure count"
    );
    match taken {
        Some(taken) => {
            // Its holder ends it: a re-add the stale holder made would queue it again.
            QueueLease::done(taken).await.unwrap();
            let other = other.as_ref().unwrap();
            assert_eq!(
                (Queue::len(other).await.unwrap(), B::delayed(other).await),
                (0, 0),
                "{case:?}: the stale holder re-added the item"
            );
        }
        None => {
            assert_eq!(summary.left_in_queue, 0, "{case:?}: {summary:?}");
            assert!(summary.unfinished.is_empty(), "{case:?}: {summary:?}");
        }
    }
}

/// The rules, one async function each: `rule(&backend).await` panics when the backend
/// breaks it.
pub mod rules {
    #![expect(missing_docs, reason = "each rule's name is its statement")]

    use super::*;

    pub async fn outcomes_map_to_forget_retry_retry_after_and_give_up<B: Backend>(backend: &B) {
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

    pub async fn an_item_that_keeps_failing_is_given_up_after_max_retries<B: Backend>(backend: &B) {
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

    pub async fn a_panicking_handler_is_retried_and_its_worker_keeps_running<B: Backend>(
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

    pub async fn a_handler_past_its_timeout_is_cancelled_and_retried<B: Backend>(backend: &B) {
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

    /// A pool with more workers than one batched step carries keeps several steps on their
    /// way at once (see `Queue::steps_in_flight`), and the promise holds across them: every
    /// item is handled, none by two workers at once, an item re-added while it is processed
    /// is handed out again only after its done, and the pool ends holding no lease.
    pub async fn a_pool_larger_than_one_step_keeps_the_promise<B: Backend>(backend: &B) {
        const WORKERS: usize = 300;
        let queue = backend.queue().await;
        let attempts = Attempts::default();
        let busy = Arc::new(Mutex::new(HashSet::new()));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let (handler_attempts, handler_busy, handler_overlaps, handler_queue) = (
            attempts.clone(),
            busy.clone(),
            overlaps.clone(),
            queue.clone(),
        );
        let workers =
            Workers::new(queue.clone())
                .count(WORKERS)
                .spawn_async(move |item: String| {
                    let (attempts, busy, overlaps, queue) = (
                        handler_attempts.clone(),
                        handler_busy.clone(),
                        handler_overlaps.clone(),
                        handler_queue.clone(),
                    );
                    async move {
                        if !busy.lock().unwrap().insert(item.clone()) {
                            overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                        // Every tenth item is added again, once, while it is processed.
                        if attempts.next(&item) == 1 && item.ends_with('0') {
                            Queue::add_with(&queue, item.clone(), AddOptions::default())
                                .await
                                .unwrap();
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        busy.lock().unwrap().remove(&item);
                    }
                });
        let items = numbered(1_000);
        let added = Queue::add_all_with(&queue, items.clone(), AddOptions::default())
            .await
            .unwrap();
        assert_eq!(added, items.len());
        eventually("every item and every re-add to be handled", || async {
            workers.stats().succeeded >= 1_100
        })
        .await;
        eventually("the queue to drain", || async {
            queue.len().await.unwrap() == 0 && workers.stats().in_flight.is_empty()
        })
        .await;
        let summary = workers.shut_down().await;
        assert_eq!(
            overlaps.load(Ordering::Relaxed),
            0,
            "an item had two holders"
        );
        for item in &items {
            let expected = if item.ends_with('0') { 2 } else { 1 };
            assert_eq!(attempts.of(item), expected, "{item} was handled so often");
        }
        assert_eq!((summary.processed, summary.succeeded), (1_100, 1_100));
        assert_eq!(summary.left_in_queue, 0);
        assert!(summary.unfinished.is_empty(), "{:?}", summary.unfinished);
        assert!(summary.in_flight.is_empty(), "{:?}", summary.in_flight);
    }

    pub async fn no_item_is_processed_by_two_workers_at_once<B: Backend>(backend: &B) {
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

    pub async fn shut_down_waits_for_items_in_flight<B: Backend>(backend: &B) {
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

    pub async fn shut_down_with_a_deadline_reports_what_is_still_in_flight<B: Backend>(
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

    pub async fn one_worker_takes_items_by_priority<B: Backend>(backend: &B) {
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
    pub async fn a_batched_done_requeues_due_re_adds_in_the_order_of_the_step<B: Backend>(
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

    pub async fn workers_end_when_the_queue_is_shut_down_and_empty<B: Backend>(backend: &B) {
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

    pub async fn a_stop_lists_or_keeps_the_delayed_retries<B: Backend>(backend: &B) {
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

    /// No item of a backlog starts after items added after it, through slow batched steps
    /// (FIFO, as one item at a time; on a server, but for the answers of two calls on their
    /// way at once, see below): a step takes a next item only for a worker that will take
    /// it. An idle worker that the pool's one `get` already serves was served by the
    /// next step too, and the extra lease waited, kept for nobody, until a worker was idle
    /// again: in memory the item after the retried one started after the late item.
    pub async fn fifo_holds_through_slow_batched_steps<B: Backend>(backend: &B) {
        // On a runtime of one thread, tasks run in the order they were woken: which worker
        // starts its item first is the pool's doing, not the scheduling of threads on a
        // loaded machine.
        on_one_thread(async {
            let items = numbered(100);
            let run = Backlog::start(backend, &items, &["item-005"]).await;
            eventually("ten items to start", || async {
                snapshot(&run.started).len() >= 10
            })
            .await;
            add(&run.queue, "late").await;
            eventually("every item to succeed", || async {
                snapshot(&run.succeeded).len() == 101
            })
            .await;
            let summary = run.workers.shut_down().await;
            assert_eq!((summary.succeeded, summary.retried), (101, 1));
            let mut added = items.clone();
            added.push("late".to_owned());
            let firsts = first_starts(&snapshot(&run.started));
            assert_eq!(firsts.len(), 101);
            // In memory an item is handed out and its worker told in one moment, and on one
            // thread the workers start their items in the order they were handed out: no
            // item starts after an item added after it. On a server the hand-out and its
            // answer are apart, and two calls that hand out run at once on two connections
            // (the pool's `get` for an idle worker and a step for a worker that finished; on
            // Redis also two steps): the answer of the later hand-out may come first, and
            // its worker starts first. The pool cannot tell (a lease does not say when it
            // was handed out), so there an item may start after one item added after it
            // (the other worker's), never after more.
            let allowed = usize::from(B::SHARED);
            for (place, item) in added.iter().enumerate() {
                let start = firsts.iter().position(|i| i == item).unwrap();
                let overtaken = added[place + 1..]
                    .iter()
                    .filter(|later| firsts.iter().position(|i| i == *later).unwrap() < start)
                    .count();
                assert!(
                    overtaken <= allowed,
                    "{item} started {} of {}, after {overtaken} items added after it: {firsts:?}",
                    start + 1,
                    firsts.len()
                );
            }
        });
    }

    /// A lease handed back unprocessed (what the pool does with a lease that no worker takes)
    /// puts its item back where it was taken from, at the head of the queue, so that items
    /// added after it do not start before it. In memory it went to the tail.
    pub async fn a_released_item_goes_back_to_the_head<B: Backend>(backend: &B) {
        let queue = backend.queue().await;
        for item in ["a", "b", "c"] {
            add(&queue, item).await;
        }
        let a = Queue::get(&queue).await.unwrap().expect("an item");
        assert_eq!(a.item(), "a");
        add(&queue, "late").await;
        assert!(QueueLease::release(a).await.unwrap());
        let mut order = Vec::new();
        for _ in 0..4 {
            let lease = Queue::get(&queue).await.unwrap().expect("an item");
            order.push(lease.item().clone());
            QueueLease::done(lease).await.unwrap();
        }
        assert_eq!(order, ["a", "b", "c", "late"]);
    }

    /// Every lease the pool holds is a worker's: with two workers, never more than two
    /// leases are out (a lease a step took for nobody was a third), and once the backlog is
    /// through and the workers wait, none (while the pool still runs).
    pub async fn the_pool_holds_no_lease_that_no_worker_takes<B: Backend>(backend: &B) {
        let items = numbered(60);
        let run = Backlog::start(backend, &items, &["item-005", "item-030"]).await;
        eventually("every item to succeed", || async {
            snapshot(&run.succeeded).len() == 60
        })
        .await;
        eventually("every lease to end", || async {
            run.queue.leases_out() == 0
        })
        .await;
        assert!(
            run.queue.most_leases_out() <= 2,
            "{} leases were out at once, for two workers",
            run.queue.most_leases_out()
        );
        let summary = run.workers.shut_down().await;
        assert_eq!((summary.succeeded, summary.retried), (60, 2));
        assert_eq!(run.queue.leases_out(), 0);
    }

    /// Everything a pool holds is released at its stop: `stop`, then the queue's
    /// `shut_down_with_drain` (which waits until no lease is held), then `wait` return. A
    /// lease kept for nobody held the drain, and so the `wait`, forever.
    pub async fn stop_then_drain_then_wait_returns<B: Backend>(backend: &B) {
        let items = numbered(100);
        let run = Backlog::start(backend, &items, &["item-005"]).await;
        eventually("thirty items to start", || async {
            snapshot(&run.started).len() >= 30
        })
        .await;
        run.workers.stop();
        tokio::time::timeout(
            Duration::from_secs(10),
            Queue::shut_down_with_drain(&run.queue),
        )
        .await
        .expect("the drain returns: the stopped pool holds no lease")
        .unwrap();
        let summary = tokio::time::timeout(Duration::from_secs(10), run.workers.wait())
            .await
            .expect("the workers end");
        assert!(summary.is_drained());
        assert_eq!(run.queue.leases_out(), 0);
    }

    /// After `shut_down`, every item of a backlog is accounted for: processed once, or left
    /// in the queue (queued, delayed on a shared backend, or listed in `unfinished`). A
    /// lease a step kept for nobody was released after the summary (in memory, into a
    /// queue shut down: the item was lost).
    pub async fn after_shut_down_every_item_is_accounted_for<B: Backend>(backend: &B) {
        let items = numbered(100);
        let run = Backlog::start(backend, &items, &["item-005"]).await;
        eventually("thirty items to start", || async {
            snapshot(&run.started).len() >= 30
        })
        .await;
        let summary = run.workers.shut_down().await;
        let succeeded = snapshot(&run.succeeded);
        let once: HashSet<&String> = succeeded.iter().collect();
        assert_eq!(once.len(), succeeded.len(), "an item succeeded twice");
        let mut left = summary.left_in_queue;
        if B::SHARED {
            left += B::delayed(&run.queue.inner).await;
        }
        assert_eq!(
            succeeded.len() + left,
            items.len(),
            "{} succeeded, {left} left in the queue ({} listed unfinished)",
            succeeded.len(),
            summary.unfinished.len()
        );
        assert_eq!(summary.succeeded as usize, succeeded.len());
    }

    /// A worker whose lease was lost (it expired and another consumer took the item) changes
    /// nothing on any path: whatever its handler returns (done, retry, retry after a delay,
    /// give up, or an error past `max_retries`), the item's failure count stays, nothing is
    /// re-added, no give-up is reported, and the summary counts the call as `lease_lost`.
    /// On a shared backend the lease really expires and a second handle takes the item; in
    /// memory, where a lease cannot be lost, a [`Wrap`] refuses the worker's calls as lost.
    pub async fn a_stale_holders_failure_path_changes_nothing<B: Backend>(backend: &B) {
        for case in [
            Stale::Done,
            Stale::Retry,
            Stale::RetryAfter,
            Stale::GiveUp,
            Stale::ErrorPastMaxRetries,
        ] {
            stale_holder(backend, case).await;
        }
    }

    /// A batched step that fails as a whole (past the backend's own retries) stops nothing
    /// and loses nothing: its items are handed out again (here at once: the fault releases
    /// them), the idle workers it was to serve are served, later items are processed, and no
    /// call counts as a lost lease.
    pub async fn a_batched_step_that_fails_as_a_whole_loses_no_item<B: Backend>(backend: &B) {
        let queue = Wrap::new(backend.queue().await);
        queue.slow_steps(Duration::from_millis(5));
        queue.fail_steps(2);
        let attempts = Attempts::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let (handler_attempts, handler_calls) = (attempts.clone(), calls.clone());
        let workers = Workers::new(queue.clone())
            .count(3)
            .spawn_async(move |item: String| {
                handler_attempts.next(&item);
                handler_calls.fetch_add(1, Ordering::SeqCst);
                async {}
            });
        let first = numbered(12);
        for item in &first {
            add(&queue, item).await;
        }
        eventually("every item to be processed", || async {
            first.iter().all(|item| attempts.of(item) >= 1)
                && queue.len().await.unwrap() == 0
                && queue.leases_out() == 0
        })
        .await;
        if queue.batch_limit() > 1 {
            assert_eq!(queue.failed_steps(), 2, "the faults were not met");
        }
        for item in ["after-1", "after-2", "after-3"] {
            add(&queue, item).await;
        }
        eventually("the items added after the faults", || async {
            ["after-1", "after-2", "after-3"]
                .iter()
                .all(|item| attempts.of(item) == 1)
        })
        .await;
        eventually("the last dones", || async {
            workers.stats().processed == calls.load(Ordering::SeqCst) as u64
        })
        .await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, calls.load(Ordering::SeqCst) as u64);
        assert_eq!(summary.succeeded, summary.processed);
        assert_eq!(summary.lease_lost, 0);
        assert!(summary.unfinished.is_empty(), "{:?}", summary.unfinished);
        assert_eq!(queue.leases_out(), 0);
    }
}
