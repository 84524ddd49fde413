//! The step task against a backend the test answers by hand ([`Scripted`]): each `get` and
//! each batched step waits until the test answers it, so a test sets up exactly the moment it
//! means (a `done` while the `get` waits, a worker gone while its item is on its way, a stop
//! while a step is on its way). Unit tests for those moments, and a model test that drives
//! random sequences of them and checks the accounting after every one: no lease held with
//! no worker to take it, every lease taken handed to exactly one worker or released, no item
//! taken for a worker another call already serves, and an idle worker never left waiting
//! with nothing on its way.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Fetched, Reply, Stepper};
use crate::workers::StopToken;
use crate::workers::unfinished::Unfinished;
use crate::{AddOptions, DoneMany, Queue, QueueLease};

/// A backend error; `lost` says it is a lost lease.
#[derive(Debug, Clone, Copy)]
struct ScriptError {
    lost: bool,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.lost { "lease lost" } else { "failed" })
    }
}

impl std::error::Error for ScriptError {}

/// How the test answers a batched step.
enum StepAnswer {
    /// Every `done` applied, and this many next leases (at most the step's `max`).
    Give(usize),
    /// The step failed as a whole, with this error.
    Fail(ScriptError),
}

/// A batched step waiting for the test's answer.
struct PendingStep {
    /// The leases whose `done`s it carries.
    dones: Vec<u32>,
    /// How many next items it asked for.
    max: usize,
    /// Whether the pool was stopped when it was sent.
    after_stop: bool,
    answer: oneshot::Sender<StepAnswer>,
}

/// What the backend did, for the checks.
struct Script {
    /// The last lease id handed out.
    last: u32,
    /// Leases handed out and not ended.
    out: BTreeSet<u32>,
    /// Leases released, and leases marked done.
    released: Vec<u32>,
    done: Vec<u32>,
    /// Leases dropped without done or release.
    dropped: Vec<u32>,
    /// Leases whose `done` was in a step that failed as a whole.
    failed: Vec<u32>,
    /// `get`s waiting for the test's answer.
    gets: VecDeque<oneshot::Sender<Result<u32, ScriptError>>>,
    /// Steps waiting for the test's answer.
    steps: VecDeque<PendingStep>,
    /// Whether a release keeps the item (`false`: a shut-down in-memory queue).
    release_keeps: bool,
    /// The pool's stop.
    stop: StopToken,
}

impl Script {
    fn hand_out(&mut self) -> u32 {
        self.last += 1;
        self.out.insert(self.last);
        self.last
    }

    /// Gets still waiting (a dropped `get` is cancelled, and its answer would go nowhere).
    fn live_gets(&self) -> usize {
        self.gets.iter().filter(|get| !get.is_closed()).count()
    }
}

#[derive(Clone)]
struct Scripted(Arc<Mutex<Script>>);

impl Scripted {
    fn new(stop: StopToken) -> Self {
        Scripted(Arc::new(Mutex::new(Script {
            last: 0,
            out: BTreeSet::new(),
            released: Vec::new(),
            done: Vec::new(),
            dropped: Vec::new(),
            failed: Vec::new(),
            gets: VecDeque::new(),
            steps: VecDeque::new(),
            release_keeps: true,
            stop,
        })))
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.0.lock().unwrap()
    }

    /// Answers the oldest `get` still waiting: a new lease, or an error. `false` if none
    /// waits.
    fn answer_get(&self, fail: bool) -> bool {
        let mut script = self.script();
        while let Some(get) = script.gets.pop_front() {
            if get.is_closed() {
                continue;
            }
            let answer = if fail {
                Err(ScriptError { lost: false })
            } else {
                Ok(script.hand_out())
            };
            if let Err(Ok(id)) = get.send(answer) {
                // Dropped between the check and the send: nobody has it.
                script.out.remove(&id);
            }
            return true;
        }
        false
    }

    /// Answers the oldest step; `false` if none waits.
    fn answer_step(&self, answer: StepAnswer) -> bool {
        let Some(step) = self.script().steps.pop_front() else {
            return false;
        };
        let _ = step.answer.send(answer);
        true
    }

    fn lease(&self, id: u32) -> ScriptLease {
        ScriptLease {
            id,
            script: self.0.clone(),
            ended: false,
        }
    }
}

struct ScriptLease {
    id: u32,
    script: Arc<Mutex<Script>>,
    ended: bool,
}

impl fmt::Debug for ScriptLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScriptLease({})", self.id)
    }
}

impl ScriptLease {
    fn end(&mut self) -> std::sync::MutexGuard<'_, Script> {
        self.ended = true;
        let mut script = self.script.lock().unwrap();
        assert!(script.out.remove(&self.id), "lease {} ended twice", self.id);
        script
    }
}

impl Drop for ScriptLease {
    fn drop(&mut self) {
        if !self.ended {
            let id = self.id;
            self.end().dropped.push(id);
        }
    }
}

impl QueueLease for ScriptLease {
    type Item = u32;
    type Error = ScriptError;

    fn item(&self) -> &u32 {
        &self.id
    }

    fn priority(&self) -> i32 {
        0
    }

    async fn done(mut self) -> Result<(), ScriptError> {
        let id = self.id;
        self.end().done.push(id);
        Ok(())
    }

    async fn release(mut self) -> Result<bool, ScriptError> {
        let id = self.id;
        let mut script = self.end();
        script.released.push(id);
        Ok(script.release_keeps)
    }
}

impl Queue for Scripted {
    type Item = u32;
    type Lease = ScriptLease;
    type Error = ScriptError;

    fn name(&self) -> Option<&str> {
        None
    }

    async fn add_with(&self, _item: u32, _options: AddOptions) -> Result<bool, ScriptError> {
        Ok(true)
    }

    async fn forget(&self, _item: &u32) -> Result<(), ScriptError> {
        Ok(())
    }

    async fn num_requeues(&self, _item: &u32) -> Result<usize, ScriptError> {
        Ok(0)
    }

    async fn len(&self) -> Result<usize, ScriptError> {
        Ok(0)
    }

    async fn get(&self) -> Result<Option<ScriptLease>, ScriptError> {
        let (answer, answered) = oneshot::channel();
        self.script().gets.push_back(answer);
        match answered.await {
            Ok(Ok(id)) => Ok(Some(self.lease(id))),
            Ok(Err(error)) => Err(error),
            Err(_) => std::future::pending().await,
        }
    }

    async fn done_and_next_many(
        &self,
        leases: Vec<(ScriptLease, bool)>,
        max: usize,
    ) -> Result<DoneMany<ScriptLease, ScriptError>, ScriptError> {
        let (answer, answered) = oneshot::channel();
        {
            let mut script = self.script();
            let after_stop = script.stop.is_stopped();
            script.steps.push_back(PendingStep {
                dones: leases.iter().map(|(lease, _)| lease.id).collect(),
                max,
                after_stop,
                answer,
            });
        }
        let answer = answered
            .await
            .unwrap_or(StepAnswer::Fail(ScriptError { lost: false }));
        let mut done = Vec::new();
        match answer {
            StepAnswer::Give(count) => {
                assert!(count <= max, "the test gave more than the step asked for");
                for (lease, _) in leases {
                    done.push(lease.done().await);
                }
                let next = (0..count)
                    .map(|_| {
                        let id = self.script().hand_out();
                        self.lease(id)
                    })
                    .collect();
                Ok(DoneMany { done, next })
            }
            StepAnswer::Fail(error) => {
                // The call's fate is unknown: the backend takes the leases back by its own
                // rules (a release, or an expiry).
                for (mut lease, _) in leases {
                    let id = lease.id;
                    lease.end().failed.push(id);
                }
                Err(error)
            }
        }
    }

    fn batch_limit(&self) -> usize {
        4
    }

    fn shut_down(&self) -> Vec<u32> {
        Vec::new()
    }

    async fn shut_down_with_drain(&self) -> Result<(), ScriptError> {
        Ok(())
    }

    async fn is_shutting_down(&self) -> Result<bool, ScriptError> {
        Ok(false)
    }

    fn is_lease_lost(error: &ScriptError) -> bool {
        error.lost
    }
}

/// Lets every task run until none can go on (a current-thread runtime).
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
}

/// A pool's step task over a [`Scripted`] backend, with the workers played by the test.
struct Harness {
    backend: Scripted,
    stepper: Arc<Stepper<Scripted>>,
    stop: StopToken,
    unfinished: Unfinished<u32>,
}

impl Harness {
    fn start(in_flight: usize) -> Self {
        let stop = StopToken::new();
        let backend = Scripted::new(stop.clone());
        let unfinished: Unfinished<u32> = Arc::default();
        let stepper = Stepper::start(
            backend.clone(),
            stop.clone(),
            backend.batch_limit(),
            in_flight,
            unfinished.clone(),
        );
        Harness {
            backend,
            stepper: Arc::new(stepper),
            stop,
            unfinished,
        }
    }

    /// A worker going idle: its answer, once it comes.
    fn idle(&self) -> JoinHandle<Fetched<Scripted>> {
        let stepper = self.stepper.clone();
        tokio::spawn(async move { stepper.next().await })
    }

    /// A worker sending its `done`: its answer, once it comes.
    fn done(&self, lease: ScriptLease) -> JoinHandle<Reply<Scripted>> {
        let stepper = self.stepper.clone();
        tokio::spawn(async move {
            match stepper.done_and_next(lease, false).await {
                Ok(reply) => reply,
                Err(_) => panic!("the steps ended"),
            }
        })
    }

    /// The steps waiting for an answer: each one's `done`s and `max`.
    fn steps(&self) -> Vec<(Vec<u32>, usize)> {
        self.backend
            .script()
            .steps
            .iter()
            .map(|step| (step.dones.clone(), step.max))
            .collect()
    }

    fn out(&self) -> BTreeSet<u32> {
        self.backend.script().out.clone()
    }
}

/// The answer a finished task gave.
async fn answer<T>(task: JoinHandle<T>) -> T {
    assert!(task.is_finished(), "the worker has no answer yet");
    task.await.unwrap()
}

/// A worker that holds a lease: it went idle and the `get` served it.
async fn holding(harness: &Harness) -> ScriptLease {
    let worker = harness.idle();
    settle().await;
    assert!(harness.backend.answer_get(false));
    settle().await;
    answer(worker).await.unwrap().expect("a lease")
}

/// An idle worker whom the waiting `get` serves is not served by a step too: a `done` that
/// comes meanwhile takes a next item for its own worker only (it took one more, and the
/// extra lease was kept for nobody).
#[test]
fn a_step_takes_no_item_for_the_worker_the_get_serves() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        let busy = holding(&harness).await;
        let busy_id = busy.id;
        let idle = harness.idle();
        settle().await;
        assert_eq!(harness.backend.script().live_gets(), 1);
        let done = harness.done(busy);
        settle().await;
        assert_eq!(harness.steps(), [(vec![busy_id], 1)]);
        assert!(harness.backend.answer_step(StepAnswer::Give(1)));
        assert!(harness.backend.answer_get(false));
        settle().await;
        let (outcome, next) = answer(done).await;
        assert!(outcome.is_ok());
        let next = next.expect("the done's worker's next item");
        let got = answer(idle).await.unwrap().expect("the get's item");
        assert_eq!(harness.out(), BTreeSet::from([next.id, got.id]));
    });
}

/// A lease that no worker takes (its worker is gone) is released at once, while the pool
/// runs: it was kept as a spare until an idle worker came.
#[test]
fn a_lease_for_a_worker_that_is_gone_is_released_at_once() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        let gone = harness.idle();
        settle().await;
        gone.abort();
        settle().await;
        assert!(harness.backend.answer_get(false));
        settle().await;
        let script = harness.backend.script();
        assert!(script.out.is_empty(), "held for nobody: {:?}", script.out);
        assert_eq!(script.released, [1]);
    });
}

/// Once the queue no longer holds a released item (in memory, once shut down), it is listed
/// in the pool's `unfinished`, as a worker's is.
#[test]
fn a_released_item_the_queue_no_longer_holds_is_listed_unfinished() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        harness.backend.script().release_keeps = false;
        let gone = harness.idle();
        settle().await;
        gone.abort();
        settle().await;
        assert!(harness.backend.answer_get(false));
        settle().await;
        assert_eq!(*harness.unfinished.lock(), [1]);
    });
}

/// Idle workers gone before the step is sent: the step takes nothing for them.
#[test]
fn a_step_takes_no_item_for_a_worker_that_is_gone() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        let first = holding(&harness).await;
        let second = holding(&harness).await;
        let first_id = first.id;
        // A step on its way, so that the `done` below waits for the next one.
        let _first_done = harness.done(first);
        settle().await;
        let gone = [harness.idle(), harness.idle()];
        settle().await;
        for worker in gone {
            worker.abort();
        }
        settle().await;
        let second_id = second.id;
        let second_done = harness.done(second);
        settle().await;
        // The get for the gone workers' is answered after the second step went: only the
        // `done`s' own next items were asked for.
        assert_eq!(harness.steps(), [(vec![first_id], 1), (vec![second_id], 1)]);
        assert!(harness.backend.answer_step(StepAnswer::Give(1)));
        assert!(harness.backend.answer_step(StepAnswer::Give(1)));
        settle().await;
        assert!(answer(second_done).await.1.is_some());
    });
}

/// A `get` that fails tells the idle workers no step is serving; those a step on its way
/// took an item for wait for it (the error answered them too, and their leases, when the
/// step came, had no taker).
#[test]
fn a_failed_get_leaves_the_workers_a_step_serves_waiting() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        // Two idle workers: the get serves one, and once it answers, a step the other.
        let first = harness.idle();
        let second = harness.idle();
        settle().await;
        assert!(harness.backend.answer_get(false));
        settle().await;
        let lease = answer(first).await.unwrap().expect("a lease");
        assert_eq!(harness.steps(), [(vec![], 1)]);
        // A third goes idle: a get for it.
        let third = harness.idle();
        settle().await;
        assert!(harness.backend.answer_get(true));
        settle().await;
        assert!(answer(third).await.is_err(), "the get's worker is told");
        assert!(!second.is_finished(), "the step's worker waits for it");
        assert!(harness.backend.answer_step(StepAnswer::Give(1)));
        settle().await;
        let served = answer(second).await.unwrap().expect("the step's lease");
        assert_eq!(harness.out(), BTreeSet::from([lease.id, served.id]));
    });
}

/// Once stopped, a step takes no item (not even for the workers whose `done`s it carries:
/// they would only hand it back), and the idle workers no step serves are answered at once,
/// while a step sent before the stop is still on its way.
#[test]
fn a_stopped_pools_steps_take_nothing() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        let busy = holding(&harness).await;
        let early = holding(&harness).await;
        let early_done = harness.done(early);
        let idle = harness.idle();
        settle().await;
        assert_eq!(harness.steps().len(), 1);
        harness.stop.stop();
        settle().await;
        assert!(matches!(answer(idle).await, Ok(None)));
        let id = busy.id;
        let done = harness.done(busy);
        settle().await;
        assert_eq!(harness.steps()[1], (vec![id], 0));
        assert!(harness.backend.answer_step(StepAnswer::Give(1)));
        assert!(harness.backend.answer_step(StepAnswer::Give(0)));
        settle().await;
        let (outcome, next) = answer(done).await;
        assert!(outcome.is_ok() && next.is_none());
        // The early done's next item is its worker's (which hands it back, being stopped).
        let (_, next) = answer(early_done).await;
        let next = next.expect("taken before the stop");
        assert_eq!(harness.out(), BTreeSet::from([next.id]));
    });
}

/// A step that fails as a whole is about the call, not a lease: no `done` in it counts as
/// a lost lease, whatever the error says.
#[test]
fn a_step_that_fails_as_a_whole_counts_no_lease_lost() {
    runtime().block_on(async {
        let harness = Harness::start(2);
        let busy = holding(&harness).await;
        let done = harness.done(busy);
        settle().await;
        assert!(
            harness
                .backend
                .answer_step(StepAnswer::Fail(ScriptError { lost: true }))
        );
        settle().await;
        let (outcome, next) = answer(done).await;
        assert!(next.is_none());
        let failure = outcome.expect_err("the step failed");
        assert!(!failure.lost);
    });
}

// ===== the model =====

/// How many workers the model plays.
const WORKERS: usize = 4;

/// What the test does next.
#[derive(Debug, Clone)]
enum Op {
    /// A free worker goes idle.
    Idle(usize),
    /// A worker holding a lease sends its `done`.
    Done(usize),
    /// A worker waiting for an answer is aborted (after a shutdown timeout): it is gone.
    Abort(usize),
    /// The oldest waiting `get` is answered with a lease, or fails.
    Get { fail: bool },
    /// The oldest step is answered with this share (in eighths) of what it asked for, or
    /// fails as a whole.
    Step { eighths: usize, fail: bool },
    /// The pool is stopped.
    Stop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..WORKERS).prop_map(Op::Idle),
        4 => (0..WORKERS).prop_map(Op::Done),
        1 => (0..WORKERS).prop_map(Op::Abort),
        3 => (0..6u8).prop_map(|n| Op::Get { fail: n == 0 }),
        4 => (0..=8usize, 0..8u8).prop_map(|(eighths, n)| Op::Step { eighths, fail: n == 0 }),
        1 => Just(Op::Stop),
    ]
}

/// One worker, as the model plays it.
enum Worker {
    /// Neither holding a lease nor waiting.
    Free,
    /// Holding a lease.
    Holding(ScriptLease),
    /// Waiting for an item.
    Idle(JoinHandle<Fetched<Scripted>>),
    /// Waiting for its `done`'s answer; the lease it sent.
    Done(JoinHandle<Reply<Scripted>>, u32),
    /// Aborted, or ended once the pool stopped.
    Gone,
}

impl Worker {
    fn is_answered(&self) -> bool {
        match self {
            Worker::Idle(task) => task.is_finished(),
            Worker::Done(task, _) => task.is_finished(),
            _ => false,
        }
    }
}

/// The workers take the answers that came, as the pool's workers would (once stopped, a
/// worker hands back a lease it gets and ends); lets the tasks run until no answer comes.
async fn take_answers(
    harness: &Harness,
    workers: &mut [Worker],
    given: &mut BTreeSet<u32>,
) -> Result<(), TestCaseError> {
    loop {
        settle().await;
        let stopped = harness.stop.is_stopped();
        let mut any = false;
        for worker in workers.iter_mut() {
            if !worker.is_answered() {
                continue;
            }
            any = true;
            let next = match std::mem::replace(worker, Worker::Free) {
                Worker::Idle(task) => match task.await.unwrap() {
                    Ok(Some(lease)) => Some(lease),
                    Ok(None) => {
                        prop_assert!(stopped, "an idle worker was told nothing while running");
                        *worker = Worker::Gone;
                        None
                    }
                    Err(_) => None,
                },
                Worker::Done(task, _) => task.await.unwrap().1,
                _ => unreachable!("answered"),
            };
            if let Some(lease) = next {
                prop_assert!(given.insert(lease.id), "lease {} given twice", lease.id);
                if stopped {
                    let _ = lease.release().await;
                    *worker = Worker::Gone;
                } else {
                    *worker = Worker::Holding(lease);
                }
            }
        }
        if !any {
            return Ok(());
        }
    }
}

/// Runs `ops` against the step task and checks the accounting after each.
fn check(ops: &[Op], in_flight: usize) -> Result<(), TestCaseError> {
    runtime().block_on(async {
        let harness = Harness::start(in_flight);
        let mut workers: Vec<Worker> = (0..WORKERS).map(|_| Worker::Free).collect();
        // Every lease a worker was given (none twice).
        let mut given = BTreeSet::new();
        // The leases whose worker was aborted while its `done` waited: the task carries them.
        let mut orphan_dones = BTreeSet::new();
        let mut aborted = false;
        for op in ops {
            match *op {
                Op::Idle(w) => {
                    if matches!(workers[w], Worker::Free) {
                        workers[w] = Worker::Idle(harness.idle());
                    }
                }
                Op::Done(w) => {
                    if matches!(workers[w], Worker::Holding(_)) {
                        let Worker::Holding(lease) =
                            std::mem::replace(&mut workers[w], Worker::Free)
                        else {
                            unreachable!("holding")
                        };
                        let id = lease.id;
                        workers[w] = Worker::Done(harness.done(lease), id);
                    }
                }
                Op::Abort(w) => {
                    let abort = match &workers[w] {
                        Worker::Idle(task) => Some((task.abort_handle(), None)),
                        Worker::Done(task, id) => Some((task.abort_handle(), Some(*id))),
                        _ => None,
                    };
                    if let Some((task, done)) = abort {
                        task.abort();
                        orphan_dones.extend(done);
                        workers[w] = Worker::Gone;
                        aborted = true;
                    }
                }
                Op::Get { fail } => {
                    harness.backend.answer_get(fail);
                }
                Op::Step { eighths, fail } => {
                    let max = harness.steps().first().map_or(0, |(_, max)| *max);
                    harness.backend.answer_step(if fail {
                        StepAnswer::Fail(ScriptError { lost: false })
                    } else {
                        StepAnswer::Give(max * eighths / 8)
                    });
                }
                Op::Stop => harness.stop.stop(),
            }
            take_answers(&harness, &mut workers, &mut given).await?;
            let script = harness.backend.script();
            prop_assert!(
                script.dropped.is_empty(),
                "leases dropped: {:?}",
                script.dropped
            );
            // Every lease out is a worker's: held, or carried by its `done`.
            let held: BTreeSet<u32> = workers
                .iter()
                .filter_map(|worker| match worker {
                    Worker::Holding(lease) => Some(lease.id),
                    Worker::Done(_, id) => Some(*id),
                    _ => None,
                })
                .collect();
            for id in &script.out {
                prop_assert!(
                    held.contains(id) || orphan_dones.contains(id),
                    "lease {id} is held for nobody (out {:?}, the workers' {held:?})",
                    script.out
                );
            }
            // Every lease taken went to exactly one worker, or was released at once.
            for id in 1..=script.last {
                prop_assert!(
                    given.contains(&id) != script.released.contains(&id)
                        || (given.contains(&id) && harness.stop.is_stopped()),
                    "lease {id}: given {}, released {}",
                    given.contains(&id),
                    script.released.contains(&id)
                );
            }
            let idle = workers
                .iter()
                .filter(|worker| matches!(worker, Worker::Idle(_)))
                .count();
            let asked: usize = script.live_gets()
                + script
                    .steps
                    .iter()
                    .map(|step| step.max.saturating_sub(step.dones.len()))
                    .sum::<usize>();
            if harness.stop.is_stopped() {
                for step in script.steps.iter().filter(|step| step.after_stop) {
                    prop_assert!(
                        step.max == 0,
                        "a stopped pool's step asks for {} items",
                        step.max
                    );
                }
                // Only the idle workers a step on its way took an item for wait for it; the
                // others were told at once that nothing more comes.
                let promised: usize = script
                    .steps
                    .iter()
                    .map(|step| step.max.saturating_sub(step.dones.len()))
                    .sum();
                prop_assert!(
                    idle <= promised,
                    "{idle} idle workers wait after the stop, for {promised} items on their way"
                );
            } else {
                // No item is asked for a worker another call serves (while no worker went
                // away: a gone worker's item is released, never kept).
                if !aborted {
                    prop_assert!(asked <= idle, "{asked} items asked for {idle} idle workers");
                }
                // An idle worker never waits with nothing on its way.
                if idle > 0 {
                    prop_assert!(asked > 0, "{idle} idle workers and nothing asked for");
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_step_task_holds_no_lease_for_nobody(
        ops in prop::collection::vec(op(), 1..60),
        in_flight in 1..=2usize,
    ) {
        check(&ops, in_flight)?;
    }
}
