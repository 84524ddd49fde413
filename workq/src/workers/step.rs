//! Batched steps for async workers on a backend whose calls cost a round trip: the `done`s
//! that workers send while a step is on its way go together in the next one
//! ([`Queue::done_and_next_many`]), which also takes each of those workers' next items, and
//! items for the workers that wait for one.
//!
//! One task per pool runs the steps, up to the backend's [`Queue::steps_in_flight`] at a
//! time: it takes every request already sent (up to the backend's [`Queue::batch_limit`]
//! `done`s), makes one call, and hands each worker its outcome and its next lease, and the
//! leases left over to the idle workers. A step costs one round trip and, on Redis, one
//! script run whatever its size, so the more workers finish together, the less each item
//! costs the server.
//!
//! Idle workers do not each wait in [`Queue::get`]: the task waits in one `get` for all of
//! them, and when it returns, takes the items the others need in one more step. So one item
//! added to an idle pool costs one hand-out on the server, not one look per worker.
//!
//! No lease is held for nobody: a step takes a next item only for a worker that will take it
//! (the worker whose `done` it carries, or an idle worker that neither the waiting `get`
//! nor another step on its way is serving), and a lease that no worker takes after all (its
//! worker is gone) is released at once, so the item is handed out again rather than kept
//! while others that came after it run.
//!
//! Once the pool is stopped, the task takes no new item (its steps carry the `done`s and ask
//! for nothing): it stops waiting and answers the idle workers with nothing, at once, but for
//! those a step sent before the stop took an item for (they get it, and hand it back as
//! unprocessed). A worker that is gone by the time its answer comes (aborted after the
//! shutdown timeout) cannot take its lease: it is released, so the item is handed out again
//! (in memory, once shut down, it is listed in the summary's `unfinished`). Releases are
//! sent at once, so a drain that follows the stop is not held by them, and awaited before
//! the task ends.
//!
//! A step that fails as a whole (past the backend's own retries) is logged once, as an
//! error; its workers' `done`s count as failed, not as lost leases, and whether each applied
//! is unknown: an item whose `done` did not apply is handed out again when its lease
//! expires, by the backend's rules.

use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::StopToken;
use super::unfinished::Unfinished;
use crate::backend::DoneMany;
use crate::{Queue, QueueLease};

/// What a worker asks of the task.
enum Request<Q: Queue> {
    /// Its `done`, for the next step.
    Done {
        lease: Q::Lease,
        forget: bool,
        reply: oneshot::Sender<Reply<Q>>,
    },
    /// It is idle: an item when one comes.
    Idle { reply: oneshot::Sender<Fetched<Q>> },
}

/// The answer to a worker's `done`: its outcome and its next lease, if the step took one for
/// it.
pub(crate) type Reply<Q> = (Result<(), StepFailure>, Option<<Q as Queue>::Lease>);

/// Why a `done` sent through a step failed.
#[derive(Debug)]
pub(crate) struct StepFailure {
    /// The backend said the lease was lost ([`Queue::is_lease_lost`]).
    pub(crate) lost: bool,
    /// The error's message.
    pub(crate) message: String,
}

impl StepFailure {
    fn of<Q: Queue>(error: &Q::Error) -> Self {
        StepFailure {
            lost: Q::is_lease_lost(error),
            message: error.to_string(),
        }
    }

    fn other(message: &str) -> Self {
        StepFailure {
            lost: false,
            message: message.to_owned(),
        }
    }
}

/// The answer to an idle worker, as [`Queue::get`]'s: a lease, nothing more to hand out
/// (the queue is shut down, or the pool stopped), or the backend's failure.
pub(crate) type Fetched<Q> = Result<Option<<Q as Queue>::Lease>, String>;

/// The workers' side of the steps.
pub(crate) struct Stepper<Q: Queue> {
    requests: mpsc::UnboundedSender<Request<Q>>,
}

impl<Q: Queue> fmt::Debug for Stepper<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stepper").finish_non_exhaustive()
    }
}

impl<Q: Queue> Stepper<Q> {
    /// Starts the task that runs the steps for `queue`, up to `limit` `done`s each and
    /// `in_flight` at once, until the stepper is dropped; it takes no new item once `stop`
    /// is stopped. An item whose lease it releases and that the queue no longer holds (in
    /// memory, once shut down) goes to `unfinished` (the pool's summary lists it).
    pub(crate) fn start(
        queue: Q,
        stop: StopToken,
        limit: usize,
        in_flight: usize,
        unfinished: Unfinished<Q::Item>,
    ) -> Self {
        let (requests, incoming) = mpsc::unbounded_channel();
        tokio::spawn(run(
            queue,
            stop,
            incoming,
            limit.max(1),
            in_flight.max(1),
            unfinished,
        ));
        Self { requests }
    }

    /// Marks `lease` done (forgetting its item's failures first if `forget`) in the next
    /// step; its outcome and the next lease the step took for this worker. `Err(lease)` if
    /// the steps have ended (the caller ends the lease itself).
    pub(crate) async fn done_and_next(
        &self,
        lease: Q::Lease,
        forget: bool,
    ) -> Result<Reply<Q>, Q::Lease> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(request)) = self.requests.send(Request::Done {
            lease,
            forget,
            reply,
        }) {
            let Request::Done { lease, .. } = request else {
                unreachable!("a done was sent")
            };
            return Err(lease);
        }
        Ok(answer.await.unwrap_or_else(|_| {
            (
                Err(StepFailure::other("the batched step was cancelled")),
                None,
            )
        }))
    }

    /// Waits for an item for an idle worker. Not cancel safe: a worker awaits it to the end
    /// (the task answers at once when the pool stops).
    pub(crate) async fn next(&self) -> Fetched<Q> {
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Request::Idle { reply }).is_err() {
            return Ok(None);
        }
        answer.await.unwrap_or_else(|_| {
            tracing::error!("the workers' step task ended; the worker stops");
            Ok(None)
        })
    }
}

/// A `done` waiting for a step.
type Pending<Q> = (<Q as Queue>::Lease, bool, oneshot::Sender<Reply<Q>>);

/// The one `get` the task waits in for the idle workers.
type Waiting<Q> =
    Pin<Box<dyn Future<Output = Result<Option<<Q as Queue>::Lease>, <Q as Queue>::Error>> + Send>>;

/// A step on its way: it answers its workers itself, and returns the leases it took beyond
/// theirs (for idle workers), with how many it was asked to take for them.
type InFlight<Q> = Pin<Box<dyn Future<Output = (Vec<<Q as Queue>::Lease>, usize)> + Send>>;

/// The most steps a large pool keeps on their way at once (see [`steps_for_pool`]).
pub(crate) const MOST_STEPS_FOR_A_LARGE_POOL: usize = 4;

/// How many steps a pool of `workers` keeps on their way at once, with steps of up to
/// `limit` `done`s each and the backend's `backend` ([`Queue::steps_in_flight`]): the
/// backend's number, or more when the pool has more workers than that many steps can carry
/// (one step per `limit` workers, at most [`MOST_STEPS_FOR_A_LARGE_POOL`]).
///
/// A pool of thousands of workers on PostgreSQL (one step at a time, 64 `done`s a step)
/// otherwise waits for one step's commit with its other workers' `done`s queued behind it,
/// and leaves the server's second core idle: W7B, 2,000 workers burning down a backlog, ran
/// 13-35% faster with four steps than with one, while at W7's 16 workers four steps cost up
/// to 47% (their commits no longer carry the `done`s that came meanwhile), so a pool that
/// one step can carry keeps the backend's number.
pub(crate) fn steps_for_pool(workers: usize, limit: usize, backend: usize) -> usize {
    let carried = workers.div_ceil(limit.max(1));
    backend.max(1).max(carried.min(MOST_STEPS_FOR_A_LARGE_POOL))
}

// How many steps are on their way at once is the backend's (`Queue::steps_in_flight`). A
// `done` that comes while one is on its way is sent at once in a second, rather than wait a
// round trip for it; `done`s that come while all are on their way wait, and go together.
// Measured in W7 on Redis (16 workers, handler 1 ms): with one step at a time the pickup
// p99 was 7-190 ms over five runs on a loaded machine, with two 3-15 ms; three or more
// would batch less for no further gain there. On PostgreSQL, whose steps each wait for a
// commit's flush, one at a time did better at every W7 shape (the 1-process, 1 ms shape
// 5.0 -> 6.0 k items/s, pickup p99 6.7 -> 4.1 ms), and three worse.

/// What woke the task.
enum Event<Q: Queue> {
    Request(Option<Request<Q>>),
    Stopped,
    Got(Result<Option<Q::Lease>, Q::Error>),
    Stepped(Vec<Q::Lease>, usize),
}

/// The task's state.
struct Steps<Q: Queue> {
    queue: Q,
    stop: StopToken,
    limit: usize,
    /// `done`s for the next step.
    dones: Vec<Pending<Q>>,
    /// Idle workers, longest waiting first (a lease goes to the longest waiting).
    idle: VecDeque<oneshot::Sender<Fetched<Q>>>,
    /// Leases the steps on their way were asked to take for idle workers.
    promised: usize,
    /// Whether the one `get` is waiting: it serves one idle worker, whom no step counts.
    getting: bool,
    /// Releases of leases no worker took, awaited before the task ends.
    releasing: JoinSet<()>,
    /// Where an item goes whose release the queue refused (it no longer holds it).
    unfinished: Unfinished<Q::Item>,
}

/// The steps' task.
async fn run<Q: Queue>(
    queue: Q,
    stop: StopToken,
    mut incoming: mpsc::UnboundedReceiver<Request<Q>>,
    limit: usize,
    max_in_flight: usize,
    unfinished: Unfinished<Q::Item>,
) {
    let mut steps = Steps {
        queue,
        stop: stop.clone(),
        limit,
        dones: Vec::new(),
        idle: VecDeque::new(),
        promised: 0,
        getting: false,
        releasing: JoinSet::new(),
        unfinished,
    };
    let mut stopped = stop.stopped();
    let mut waiting: Option<Waiting<Q>> = None;
    let mut in_flight: Vec<InFlight<Q>> = Vec::with_capacity(max_in_flight);
    let mut open = true;
    while open || !steps.dones.is_empty() || !in_flight.is_empty() {
        // Workers that are gone (aborted after the shutdown timeout) wait for nothing.
        steps.forget_gone();
        if steps.stop.is_stopped() {
            // No new item once stopped (a `get` waiting in the local wake-ups is dropped:
            // `get` is cancel safe), and only the workers a step on its way took an item
            // for wait for it; the others are answered at once.
            waiting = None;
            steps.answer_unpromised_with_nothing();
        } else if waiting.is_none() && steps.unserved() > 0 {
            let queue = steps.queue.clone();
            waiting = Some(Box::pin(async move { queue.get().await }));
        }
        steps.getting = waiting.is_some();
        // Reap the releases that are through, so the set stays small.
        while steps.releasing.try_join_next().is_some() {}
        if !steps.dones.is_empty() && in_flight.len() < max_in_flight {
            in_flight.push(steps.step());
            continue;
        }
        let event = tokio::select! {
            biased;
            (rest, promised) = poll_fn(|cx| {
                for (i, step) in in_flight.iter_mut().enumerate() {
                    if let Poll::Ready(out) = step.as_mut().poll(cx) {
                        drop(in_flight.swap_remove(i));
                        return Poll::Ready(out);
                    }
                }
                Poll::Pending
            }) => Event::Stepped(rest, promised),
            request = incoming.recv(), if open => Event::Request(request),
            () = &mut stopped, if !steps.stop.is_stopped() => Event::Stopped,
            got = poll_fn(|cx| match waiting.as_mut() {
                Some(get) => get.as_mut().poll(cx),
                None => Poll::Pending,
            }) => Event::Got(got),
        };
        match event {
            Event::Request(None) => open = false,
            Event::Request(Some(request)) => {
                steps.take(request);
                // Every request already sent goes in this step.
                while steps.dones.len() < steps.limit {
                    match incoming.try_recv() {
                        Ok(request) => steps.take(request),
                        Err(_) => break,
                    }
                }
            }
            Event::Stopped => {}
            Event::Stepped(rest, promised) => {
                steps.promised -= promised;
                for lease in rest {
                    steps.hand_or_release(lease);
                }
            }
            Event::Got(got) => {
                waiting = None;
                steps.getting = false;
                if let Some(step) = steps.got(got) {
                    in_flight.push(step);
                }
            }
        }
    }
    steps.answer_idle_with_nothing();
    while steps.releasing.join_next().await.is_some() {}
}

impl<Q: Queue> Steps<Q> {
    fn take(&mut self, request: Request<Q>) {
        match request {
            Request::Done {
                lease,
                forget,
                reply,
            } => self.dones.push((lease, forget, reply)),
            Request::Idle { reply } => self.idle.push_back(reply),
        }
    }

    /// Idle workers that neither the waiting `get` nor a step on its way is serving.
    fn unserved(&self) -> usize {
        self.idle
            .len()
            .saturating_sub(self.promised + usize::from(self.getting))
    }

    /// Drops the idle workers that are gone (a lease sent to one would come back).
    fn forget_gone(&mut self) {
        self.idle.retain(|worker| !worker.is_closed());
    }

    /// Gives `lease` to the idle worker waiting longest, or releases it at once if no idle
    /// worker is left to take it: a lease is never kept for nobody (it would keep its item
    /// from the other consumers, and from its place in the order, while a backlog lasts).
    fn hand_or_release(&mut self, lease: Q::Lease) {
        if let Some(lease) = self.hand(lease) {
            let queue = self.queue.clone();
            let unfinished = self.unfinished.clone();
            self.releasing
                .spawn(async move { release(&queue, lease, &unfinished).await });
        }
    }

    /// Gives `lease` to the idle worker waiting longest that is still there; the lease back
    /// if none is.
    fn hand(&mut self, mut lease: Q::Lease) -> Option<Q::Lease> {
        while let Some(worker) = self.idle.pop_front() {
            match worker.send(Ok(Some(lease))) {
                Ok(()) => return None,
                Err(Ok(Some(back))) => lease = back,
                Err(_) => unreachable!("a lease was sent"),
            }
        }
        Some(lease)
    }

    fn answer_idle_with_nothing(&mut self) {
        for worker in self.idle.drain(..) {
            let _ = worker.send(Ok(None));
        }
    }

    /// Once stopped: answers the idle workers that no step on its way took an item for.
    fn answer_unpromised_with_nothing(&mut self) {
        let keep = self.promised.min(self.idle.len());
        for worker in self.idle.drain(keep..) {
            let _ = worker.send(Ok(None));
        }
    }

    /// The waiting `get` answered; a step to take what is ready for the other idle workers.
    fn got(&mut self, got: Result<Option<Q::Lease>, Q::Error>) -> Option<InFlight<Q>> {
        match got {
            Ok(Some(lease)) => {
                self.hand_or_release(lease);
                (self.unserved() > 0 && !self.stop.is_stopped()).then(|| self.step())
            }
            // The queue (or this handle) is shut down and has nothing more.
            Ok(None) => {
                self.answer_idle_with_nothing();
                None
            }
            Err(error) => {
                // Each idle worker that no step on its way took an item for logs it and
                // backs off, as after its own failed `get`.
                let message = error.to_string();
                let keep = self.promised.min(self.idle.len());
                for worker in self.idle.drain(keep..) {
                    let _ = worker.send(Err(message.clone()));
                }
                None
            }
        }
    }

    /// Sends a step: the pending `done`s, and a next item for each of their workers and for
    /// each idle worker not yet provided for by the waiting `get` or another step (no item
    /// at all once the pool is stopped).
    fn step(&mut self) -> InFlight<Q> {
        let dones = std::mem::take(&mut self.dones);
        let (max, for_idle) = if self.stop.is_stopped() {
            (0, 0)
        } else {
            let for_idle = self.unserved().min(self.limit.saturating_sub(dones.len()));
            (dones.len() + for_idle, for_idle)
        };
        self.promised += for_idle;
        let queue = self.queue.clone();
        Box::pin(async move {
            let count = dones.len();
            let mut leases = Vec::with_capacity(count);
            let mut replies = Vec::with_capacity(count);
            for (lease, forget, reply) in dones {
                leases.push((lease, forget));
                replies.push(reply);
            }
            let mut rest = Vec::new();
            match queue.done_and_next_many(leases, max).await {
                Ok(DoneMany { done, next }) => {
                    let mut done = done.into_iter();
                    let mut next = next.into_iter();
                    for reply in replies {
                        let outcome = done.next().map_or_else(
                            || Err(StepFailure::other("the backend gave no outcome")),
                            |outcome| outcome.map_err(|e| StepFailure::of::<Q>(&e)),
                        );
                        if let Err((_, Some(lease))) = reply.send((outcome, next.next())) {
                            rest.push(lease);
                        }
                    }
                    rest.extend(next);
                }
                Err(error) => {
                    // The step failed as a whole, past the backend's own retries: whether
                    // each `done` applied is unknown. No item is lost (one whose `done` did
                    // not apply is handed out again when its lease expires), and no lease
                    // is counted lost: the error is about the call, not about a lease.
                    let message = error.to_string();
                    tracing::error!(
                        queue = queue.name(),
                        dones = count,
                        for_idle,
                        error = %message,
                        "a batched step failed as a whole: whether its dones applied is unknown; an item whose done did not apply is handed out again when its lease expires"
                    );
                    for reply in replies {
                        let _ = reply.send((Err(StepFailure::other(&message)), None));
                    }
                }
            }
            (rest, for_idle)
        })
    }
}

/// Hands back a lease nobody will process; an item the queue no longer holds (in memory,
/// once shut down) goes to `unfinished`.
async fn release<Q: Queue>(queue: &Q, lease: Q::Lease, unfinished: &Unfinished<Q::Item>) {
    let item = lease.item().clone();
    match lease.release().await {
        Ok(true) => {}
        Ok(false) => unfinished.lock().push(item),
        Err(error) => tracing::warn!(
            queue = queue.name(),
            %error,
            "cannot release an item no worker took; the backend takes it back when its lease expires"
        ),
    }
}

#[cfg(test)]
#[path = "step_model.rs"]
mod model;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{MOST_STEPS_FOR_A_LARGE_POOL, steps_for_pool};
    use crate::{AddOptions, DoneMany, Lease, Queue, WorkQueue, Workers};

    /// The in-memory queue as a backend whose steps are slow and worth batching: each step
    /// waits, so the `done`s of the other workers pile up behind it. Records each step's size.
    #[derive(Clone)]
    struct Slow {
        queue: WorkQueue<u32>,
        steps: Arc<Mutex<Vec<usize>>>,
    }

    impl Queue for Slow {
        type Item = u32;
        type Lease = Lease<u32>;
        type Error = Infallible;

        fn name(&self) -> Option<&str> {
            None
        }

        fn add_with(
            &self,
            item: u32,
            options: AddOptions,
        ) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::add_with(&self.queue, item, options)
        }

        fn forget(&self, item: &u32) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::forget(&self.queue, item)
        }

        fn num_requeues(
            &self,
            item: &u32,
        ) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::num_requeues(&self.queue, item)
        }

        fn len(&self) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::len(&self.queue)
        }

        fn get(&self) -> impl Future<Output = Result<Option<Lease<u32>>, Infallible>> + Send {
            Queue::get(&self.queue)
        }

        async fn done_and_next_many(
            &self,
            leases: Vec<(Lease<u32>, bool)>,
            max: usize,
        ) -> Result<DoneMany<Lease<u32>, Infallible>, Infallible> {
            self.steps.lock().unwrap().push(leases.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut step = DoneMany {
                done: Vec::new(),
                next: Vec::new(),
            };
            for (lease, forget) in leases {
                if forget {
                    self.queue.forget(lease.item());
                }
                lease.done();
                step.done.push(Ok(()));
            }
            while step.next.len() < max {
                match self.queue.try_get() {
                    Ok(lease) => step.next.push(lease),
                    Err(_) => break,
                }
            }
            Ok(step)
        }

        fn batch_limit(&self) -> usize {
            16
        }

        fn shut_down(&self) -> Vec<u32> {
            Queue::shut_down(&self.queue)
        }

        fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::shut_down_with_drain(&self.queue)
        }

        fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::is_shutting_down(&self.queue)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_send_the_dones_of_a_slow_step_together_in_the_next() {
        let slow = Slow {
            queue: WorkQueue::new(),
            steps: Arc::default(),
        };
        for item in 0..64 {
            slow.queue.add(item);
        }
        let seen: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
        let handled = seen.clone();
        let workers = Workers::new(slow.clone())
            .count(8)
            .spawn_async(move |item: u32| {
                *handled.lock().unwrap().entry(item).or_default() += 1;
                async {}
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while workers.stats().processed < 64 {
            assert!(std::time::Instant::now() < deadline, "the workers stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 64);
        assert_eq!(summary.succeeded, 64);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 64);
        assert!(
            seen.values().all(|&n| n == 1),
            "an item ran twice: {seen:?}"
        );
        // Every done went through a step, and the steps batched them.
        let steps = slow.steps.lock().unwrap();
        assert_eq!(steps.iter().sum::<usize>(), 64);
        assert!(steps.iter().all(|&n| n <= 16));
        assert!(
            steps.iter().any(|&n| n > 1),
            "no step carried more than one done: {steps:?}"
        );
        assert!(slow.queue.is_empty() && slow.queue.processing_len() == 0);
    }

    /// A pool that one step carries keeps the backend's number of steps; a larger pool one
    /// per `limit` workers, never more than the most, never fewer than the backend's.
    #[test]
    fn a_pool_keeps_more_steps_only_when_one_step_cannot_carry_it() {
        // PostgreSQL's numbers: one step, 64 `done`s.
        assert_eq!(steps_for_pool(1, 64, 1), 1);
        assert_eq!(steps_for_pool(16, 64, 1), 1);
        assert_eq!(steps_for_pool(64, 64, 1), 1);
        assert_eq!(steps_for_pool(65, 64, 1), 2);
        assert_eq!(steps_for_pool(192, 64, 1), 3);
        assert_eq!(steps_for_pool(2_000, 64, 1), MOST_STEPS_FOR_A_LARGE_POOL);
        // Redis's: two steps stay two until the pool needs more.
        assert_eq!(steps_for_pool(16, 64, 2), 2);
        assert_eq!(steps_for_pool(129, 64, 2), 3);
        // A backend that asks for more than the most keeps its number.
        assert_eq!(steps_for_pool(16, 64, 8), 8);
        // Degenerate settings are clamped, not divided by.
        assert_eq!(steps_for_pool(0, 0, 0), 1);
        assert_eq!(steps_for_pool(10, 0, 1), MOST_STEPS_FOR_A_LARGE_POOL);
    }
}
