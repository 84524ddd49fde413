//! [`Running`]: a started controller. Starting it (the handler around your reconcile, the
//! feed, the signal handling), watching it, and stopping it.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::future::{self, BoxFuture};
use kube::Resource;
use kube::runtime::reflector::Store;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use workq::{AsyncWorkers, HandlerError, IntoOutcome, Outcome, Queue, StopToken, Summary, Workers};

use crate::defaults::DEFAULT_SHUTDOWN_TIMEOUT;
use crate::error::{Error, ErrorKind};
use crate::feed::{Counters, Feed, FeedStats};
use crate::gate::{Attempt, ControllerQueue, Gate, Spec};
use crate::instruments::Instruments;
use crate::leader::{ElectionHandle, Elector, Fence};
use crate::outcome::ReconcileEnd;
use crate::policy::{ErrorAction, Policy};
use crate::sources::{Role, Source};
use crate::{ObjectKey, ReconcileResult};

/// How long a stopped controller waits for its queue to take back the leases its workers
/// still held (on a shared queue, the releases of reconciles cut off by the shutdown
/// timeout or a forced stop).
const LEASE_RETURN_TIMEOUT: Duration = Duration::from_secs(5);

/// The caller's settings for the pool, applied when the controller runs.
pub(crate) type Configure<Q> = Box<
    dyn FnOnce(
            Workers<<Q as Queue>::Item, ControllerQueue<Q>>,
        ) -> Workers<<Q as Queue>::Item, ControllerQueue<Q>>
        + Send,
>;

/// What [`Controller::run`](crate::Controller::run) hands over.
pub(crate) struct Parts<K: Resource + 'static, Q: Queue, R, Ctx>
where
    K::DynamicType: Eq + Hash,
{
    pub(crate) queue: Q,
    pub(crate) controller: Arc<str>,
    pub(crate) dyntype: K::DynamicType,
    pub(crate) store: Store<K>,
    pub(crate) sources: Vec<Source<K>>,
    pub(crate) configure: Option<Configure<Q>>,
    pub(crate) error_policy: Option<Policy<K>>,
    pub(crate) sync_timeout: Duration,
    pub(crate) graceful: Vec<BoxFuture<'static, ()>>,
    pub(crate) on_signal: bool,
    pub(crate) election: Option<Elector>,
    pub(crate) reconcile: R,
    pub(crate) context: Arc<Ctx>,
}

/// Starts the workers, the feed and the signal handling.
pub(crate) fn start<K, Q, R, Fut, Ctx>(parts: Parts<K, Q, R, Ctx>) -> Running<K, Q>
where
    K: Resource + Clone + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
    R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: ReconcileResult,
    Ctx: Send + Sync + 'static,
{
    // Signal handlers first, so that a signal from here on is ours to handle.
    let signals = parts.on_signal.then(Signals::install);

    let (ready_tx, ready_rx) = watch::channel(false);
    let instruments = Instruments::new(&parts.controller);
    let fence = parts.election.as_ref().map(Elector::fence);
    let gate = Arc::new(Gate::new(ready_rx, instruments.clone(), fence.clone()));
    let (forced_tx, forced_rx) = watch::channel(false);
    let mut workers = Workers::new(ControllerQueue::new(parts.queue.clone(), gate.clone()))
        .retry_forever()
        .shutdown_timeout(DEFAULT_SHUTDOWN_TIMEOUT);
    if let Some(configure) = parts.configure {
        workers = configure(workers);
    }
    instruments.workers(workers.worker_count());
    let gone = Arc::new(AtomicU64::new(0));
    let stopping = Arc::new(OnceLock::new());
    let handler = Handler {
        store: parts.store.clone(),
        dyntype: parts.dyntype,
        queue: parts.queue.clone(),
        gate: gate.clone(),
        policy: parts.error_policy,
        gone: gone.clone(),
        forced: forced_rx,
        instruments,
        stopping: stopping.clone(),
        fence,
        reconcile: Arc::new(parts.reconcile),
        context: parts.context,
    };
    let workers = workers.spawn_async(move |key| handler.call(key));
    let stop = workers.stop_token().clone();
    let _ = stopping.set(stop.clone());
    let election = parts.election.map(|elector| elector.spawn(stop.clone()));

    let mut tasks = Vec::new();
    let ready = Arc::new(ready_tx);
    if parts
        .sources
        .first()
        .is_none_or(|main| main.role != Role::Watcher)
    {
        // The caller's store, filled by the caller's reflector: watch it become ready.
        tasks.push(tokio::spawn(watch_ready(
            parts.store.clone(),
            ready.clone(),
        )));
    }
    let forced = Arc::new(forced_tx);
    if !parts.graceful.is_empty() || signals.is_some() {
        tasks.push(tokio::spawn(stop_on(
            parts.graceful,
            signals,
            stop.clone(),
            forced.clone(),
        )));
    }
    let counters = Arc::new(Counters::default());
    let failure = Arc::new(Mutex::new(None));
    let feed = tokio::spawn(
        Feed {
            queue: parts.queue.clone(),
            gate: gate.clone(),
            ready: ready.clone(),
            sync_timeout: parts.sync_timeout,
            counters: counters.clone(),
            failure: failure.clone(),
            stop,
            controller: parts.controller,
        }
        .run(parts.sources),
    );
    Running {
        ready: ready.subscribe(),
        election,
        workers,
        queue: parts.queue,
        feed,
        tasks,
        store: parts.store,
        gone,
        gate,
        counters,
        failure,
        forced,
    }
}

/// How often [`watch_ready`] looks at a store again.
const READY_POLL: Duration = Duration::from_millis(50);

/// Sets `ready` once `store` has completed its first list.
///
/// kube's `Store::wait_until_ready` keeps only the last waker of all the tasks waiting on
/// it, so two waiters can miss the wake-up: this looks again every [`READY_POLL`] instead of
/// trusting its wake-up, and [`Running::wait_until_ready`] gives callers a readiness any
/// number of tasks can wait for.
async fn watch_ready<K>(store: Store<K>, ready: Arc<watch::Sender<bool>>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    loop {
        match tokio::time::timeout(READY_POLL, store.wait_until_ready()).await {
            Ok(Ok(())) => {
                ready.send_replace(true);
                return;
            }
            // The writer is gone: the main stream has ended, and the feed reports it.
            Ok(Err(_)) => return,
            Err(_) => {}
        }
    }
}

/// Calls the reconcile for each key, and tells the gate how the attempt went.
struct Handler<K: Resource + 'static, Q: Queue, R, Ctx>
where
    K::DynamicType: Eq + Hash,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    queue: Q,
    gate: Arc<Gate<Q::Item>>,
    policy: Option<Policy<K>>,
    /// Keys whose object had left the store.
    gone: Arc<AtomicU64>,
    /// Turns `true` on a forced stop.
    forced: watch::Receiver<bool>,
    /// The reconcile series.
    instruments: Instruments,
    /// The workers' stop token, once they run: a reconcile dropped unfinished before the
    /// stop was cut off by the workers' timeout.
    stopping: Arc<OnceLock<StopToken>>,
    /// The leader election, if any: a reconcile runs only while this replica leads.
    fence: Option<Fence>,
    reconcile: Arc<R>,
    context: Arc<Ctx>,
}

/// One key's turn in a worker, for the reconcile series: the worker is busy from its start
/// to its drop, and a reconcile that started and is dropped without saying how it ended
/// panicked (the drop runs while unwinding) or was cut off by the workers' timeout (dropped
/// before any stop; after a stop, the shutdown timeout aborted it, which is not counted).
struct Turn {
    instruments: Instruments,
    stopping: Arc<OnceLock<StopToken>>,
    /// When the reconcile started, until its end is recorded.
    reconciling: Option<Instant>,
}

impl Turn {
    fn new(instruments: Instruments, stopping: Arc<OnceLock<StopToken>>) -> Self {
        instruments.worker_busy();
        Self {
            instruments,
            stopping,
            reconciling: None,
        }
    }

    /// The reconcile starts now.
    fn start(&mut self) {
        self.reconciling = Some(Instant::now());
    }

    /// The reconcile ended as `end` (with `terminal` if it is not retried).
    fn end(&mut self, end: ReconcileEnd, terminal: bool) {
        let took = self
            .reconciling
            .take()
            .map_or(Duration::ZERO, |at| at.elapsed());
        self.instruments.reconciled(end, took);
        if terminal {
            self.instruments.terminal_error();
        }
    }

    /// The reconcile was cancelled (a forced stop): not a reconcile that ended.
    fn cancel(&mut self) {
        self.reconciling = None;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(started) = self.reconciling.take() {
            if std::thread::panicking() {
                self.instruments.panicked();
                self.instruments
                    .reconciled(ReconcileEnd::Error, started.elapsed());
            } else if self.stopping.get().is_none_or(|stop| !stop.is_stopped()) {
                self.instruments.timed_out();
                self.instruments
                    .reconciled(ReconcileEnd::Error, started.elapsed());
            }
        }
        self.instruments.worker_idle();
    }
}

/// How a reconcile's outcome counts in the series: its `result` and whether it is terminal
/// (a give-up the reconcile asked for).
fn outcome_end(outcome: &Outcome) -> (ReconcileEnd, bool) {
    match outcome {
        Outcome::Done => (ReconcileEnd::Success, false),
        Outcome::RetryAfter(delay) if !delay.is_zero() => (ReconcileEnd::RequeueAfter, false),
        Outcome::RetryAfter(_) | Outcome::Retry => (ReconcileEnd::Requeue, false),
        Outcome::GiveUp => (ReconcileEnd::Error, true),
        // An outcome added to the workers later: not a failure this crate knows of.
        _ => (ReconcileEnd::Success, false),
    }
}

/// The handler's answer: the reconcile's outcome or failure, passed to the workers as is (so
/// that an error keeps its own type for the give-up report).
struct Reconciled(Result<Outcome, HandlerError>);

impl IntoOutcome for Reconciled {
    fn into_outcome(self) -> Result<Outcome, HandlerError> {
        self.0
    }
}

/// Tells the gate an attempt failed if it ends without saying how (a panic unwinds through
/// it, a timeout drops it).
struct AttemptGuard<T: Eq + Hash + Clone> {
    gate: Arc<Gate<T>>,
    key: Option<T>,
}

impl<T: Eq + Hash + Clone> AttemptGuard<T> {
    fn finish(mut self, attempt: Attempt) {
        if let Some(key) = self.key.take() {
            self.gate.finished(&key, attempt);
        }
    }
}

impl<T: Eq + Hash + Clone> Drop for AttemptGuard<T> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.gate.finished(&key, Attempt::FailedBackoff);
        }
    }
}

impl<K, Q, R, Fut, Ctx> Handler<K, Q, R, Ctx>
where
    K: Resource + Clone + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
    R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: ReconcileResult,
    Ctx: Send + Sync + 'static,
{
    fn call(
        &self,
        key: Q::Item,
    ) -> impl Future<Output = Reconciled> + Send + use<K, Q, R, Fut, Ctx> {
        let object = self.store.get(&key.to_object_ref(&self.dyntype));
        let guard = AttemptGuard {
            gate: self.gate.clone(),
            key: Some(key.clone()),
        };
        let (queue, policy, gone) = (self.queue.clone(), self.policy.clone(), self.gone.clone());
        let (reconcile, context) = (self.reconcile.clone(), self.context.clone());
        let mut forced = self.forced.clone();
        let mut turn = Turn::new(self.instruments.clone(), self.stopping.clone());
        // The term this replica leads in as the key starts (`None`: it does not lead).
        let fence = self.fence.clone();
        let term = fence.as_ref().map(Fence::current);
        async move {
            let Some(object) = object else {
                gone.fetch_add(1, Ordering::Relaxed);
                guard.finish(Attempt::Succeeded);
                turn.end(ReconcileEnd::Success, false);
                return Reconciled(Ok(Outcome::Done));
            };
            guard.gate.saw(&key, Spec::of(&*object));
            let cancelled = async {
                if forced.wait_for(|forced| *forced).await.is_err() {
                    future::pending::<()>().await;
                }
            };
            // Fenced: the leadership this key was handed out under ends.
            let fenced = async {
                match (&fence, term) {
                    (Some(fence), Some(Some(term))) => fence.lost(term).await,
                    (Some(_), _) => {}
                    (None, _) => future::pending::<()>().await,
                }
            };
            turn.start();
            let result = tokio::select! {
                biased;
                () = cancelled => {
                    turn.cancel();
                    guard.finish(Attempt::Cancelled);
                    return Reconciled(Err(HandlerError::new("cancelled by a forced stop")));
                }
                () = fenced => {
                    turn.cancel();
                    guard.finish(Attempt::Cancelled);
                    tracing::debug!(key = ?key, "reconcile cancelled: this replica no longer leads; the key goes back to the queue");
                    return Reconciled(Err(HandlerError::new("cancelled: this replica no longer leads")));
                }
                result = reconcile(object.clone(), context) => result.into_reconcile_outcome(),
            };
            let (end, terminal) = match &result {
                Ok(outcome) => outcome_end(outcome),
                Err(_) => (ReconcileEnd::Error, false),
            };
            let (attempt, result, terminal) = match result {
                Ok(Outcome::Retry) => (Attempt::FailedBackoff, Ok(Outcome::Retry), terminal),
                Ok(Outcome::GiveUp) => (Attempt::GaveUp, Ok(Outcome::GiveUp), terminal),
                Ok(outcome) => (Attempt::Succeeded, Ok(outcome), terminal),
                Err(error) => match policy {
                    None => (Attempt::FailedBackoff, Err(error), false),
                    Some(policy) => {
                        let failures = queue.num_requeues(&key).await.unwrap_or(0) + 1;
                        match policy(object, &error, failures) {
                            ErrorAction::RetryAfter(delay) => {
                                tracing::warn!(key = ?key, %error, ?delay, failures, "reconcile failed; retrying after the policy's delay");
                                (
                                    Attempt::FailedAfter(delay),
                                    Ok(Outcome::RetryAfter(delay)),
                                    false,
                                )
                            }
                            ErrorAction::GiveUp => {
                                tracing::warn!(key = ?key, %error, failures, "reconcile failed; the error policy gives up");
                                (Attempt::GaveUp, Ok(Outcome::GiveUp), true)
                            }
                            ErrorAction::Backoff => (Attempt::FailedBackoff, Err(error), false),
                        }
                    }
                },
            };
            turn.end(end, terminal);
            guard.finish(attempt);
            Reconciled(result)
        }
    }
}

/// The signal handlers of [`Controller::shutdown_on_signal`](crate::Controller::shutdown_on_signal).
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                terminate: signal(SignalKind::terminate()).expect("install a SIGTERM handler"),
                interrupt: signal(SignalKind::interrupt()).expect("install a SIGINT handler"),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next SIGTERM or SIGINT (Ctrl-C).
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!("SIGTERM received"),
            _ = self.interrupt.recv() => tracing::info!("SIGINT received"),
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Stops the controller when a graceful trigger or a signal comes; forces the stop on the
/// next signal.
async fn stop_on(
    graceful: Vec<BoxFuture<'static, ()>>,
    mut signals: Option<Signals>,
    stop: StopToken,
    forced: Arc<watch::Sender<bool>>,
) {
    let graceful = async {
        if graceful.is_empty() {
            future::pending::<()>().await;
        } else {
            future::select_all(graceful).await;
        }
    };
    let signalled = async {
        match &mut signals {
            Some(signals) => signals.next().await,
            None => future::pending().await,
        }
    };
    tokio::select! {
        () = graceful => tracing::info!("stopping gracefully"),
        () = signalled => tracing::info!("stopping gracefully; a second signal forces the stop"),
        () = stop.stopped() => {}
    }
    stop.stop();
    if let Some(signals) = &mut signals {
        signals.next().await;
        tracing::warn!("forced stop: cancelling the reconciles in flight");
        forced.send_replace(true);
    }
}

/// A running controller, from [`Controller::run`](crate::Controller::run).
///
/// Dropping it leaves the controller running until its [`StopToken`] is stopped.
pub struct Running<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    /// The pool reconciling keys.
    workers: AsyncWorkers<Q::Item, ControllerQueue<Q>>,
    /// The queue itself.
    queue: Q,
    /// The task moving keys from the sources to the queue; it ends on the stop.
    feed: JoinHandle<()>,
    /// The readiness watch and the signal handling.
    tasks: Vec<JoinHandle<()>>,
    /// The main watcher's objects.
    store: Store<K>,
    /// Keys whose object had left the store when handed out.
    gone: Arc<AtomicU64>,
    /// The controller's rules over the queue.
    gate: Arc<Gate<Q::Item>>,
    /// What the feed did.
    counters: Arc<Counters>,
    /// Why the controller stopped on its own, if it did.
    failure: Arc<Mutex<Option<ErrorKind>>>,
    /// Turns `true` on a forced stop.
    forced: Arc<watch::Sender<bool>>,
    /// Turns `true` once the main store has completed its first list.
    ready: watch::Receiver<bool>,
    /// The leader election, if the controller runs only on the leader.
    election: Option<ElectionHandle>,
}

impl<K, Q> fmt::Debug for Running<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("workers", &self.workers)
            .field("gone", &self.gone)
            .field("failure", &self.failure.lock())
            .finish_non_exhaustive()
    }
}

impl<K, Q> Running<K, Q>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
    Q: Queue,
    Q::Item: fmt::Debug,
{
    /// The store the reconcile reads. Await [`Store::wait_until_ready`] to know the first
    /// list is in.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The queue of object keys.
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// Waits until the main store has completed its first list (the moment keys start being
    /// handed to workers). Prefer it to the store's own `wait_until_ready`, which can miss a
    /// wake-up when several tasks wait on it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// Whether this replica hands keys to its workers now: it leads its
    /// [leader election](crate::Controller::leader_election) and its renew deadline has not
    /// passed, or it has no leader election.
    pub fn is_leader(&self) -> bool {
        self.election
            .as_ref()
            .is_none_or(|election| election.fence().current().is_some())
    }

    /// With a leader election: the identity of the holder this replica last saw in the
    /// Lease (its own while it leads), `None` before it saw one or once the Lease was
    /// released. Without one: `None`.
    pub fn leader(&self) -> Option<String> {
        self.election
            .as_ref()
            .and_then(|election| election.fence().state().leader)
    }

    /// With a leader election: this replica's identity in the Lease.
    pub fn identity(&self) -> Option<String> {
        self.election
            .as_ref()
            .map(|election| election.fence().state().identity)
    }

    /// The token that stops the controller: the watchers end, the queue shuts down and the
    /// reconciles in flight finish.
    pub fn stop_token(&self) -> &StopToken {
        self.workers.stop_token()
    }

    /// Stops the controller without waiting (see [`stop_token`](Self::stop_token)).
    pub fn stop(&self) {
        self.workers.stop();
    }

    /// What the workers have done so far (a key whose object was gone counts as succeeded).
    pub fn stats(&self) -> Summary<Q::Item> {
        self.workers.stats()
    }

    /// What the feed has done so far: keys added, held back, deferred; watch failures.
    pub fn feed_stats(&self) -> FeedStats {
        self.counters.snapshot(self.gate.backing_off())
    }

    /// How many keys came out of the queue after their object had left the store, and were
    /// done without a reconcile.
    pub fn objects_gone(&self) -> u64 {
        self.gone.load(Ordering::Relaxed)
    }

    /// Waits until the controller stops (its stop token, a signal, a failure of a source, or
    /// its queue shut down by someone else and drained), and returns what the workers did.
    ///
    /// # Errors
    ///
    /// The controller stopped on its own (a source panicked, ended, or did not complete its
    /// first list in time) or was stopped by force: the [`Error`] says why and holds the
    /// workers' summary.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future leaves the controller running unobserved.
    pub async fn wait(self) -> Result<Summary<Q::Item>, Error<Q::Item>> {
        let summary = self.workers.wait().await;
        Self::end(
            summary,
            self.queue,
            self.feed,
            self.tasks,
            self.election,
            &self.failure,
            &self.forced,
        )
        .await
    }

    /// Stops the controller, waits for the reconciles in flight (up to the pool's
    /// `shutdown_timeout`) and returns what the workers did.
    ///
    /// # Errors
    ///
    /// As for [`wait`](Self::wait).
    ///
    /// # Cancel safety
    ///
    /// As for [`wait`](Self::wait).
    pub async fn shut_down(self) -> Result<Summary<Q::Item>, Error<Q::Item>> {
        self.stop();
        self.wait().await
    }

    /// Runs until `signal` completes (or the controller stops), then shuts down as
    /// [`shut_down`](Self::shut_down) does. This is kube's `graceful_shutdown_on`, given
    /// when waiting.
    ///
    /// # Errors
    ///
    /// As for [`wait`](Self::wait).
    ///
    /// # Cancel safety
    ///
    /// As for [`wait`](Self::wait).
    pub async fn run_until<S: Future>(self, signal: S) -> Result<Summary<Q::Item>, Error<Q::Item>> {
        let summary = self.workers.run_until(signal).await;
        Self::end(
            summary,
            self.queue,
            self.feed,
            self.tasks,
            self.election,
            &self.failure,
            &self.forced,
        )
        .await
    }

    /// After the workers: ends the feed and the other tasks, lets the queue take back the
    /// leases still out, steps down from the leader election (releasing the lease), and
    /// says whether the controller stopped on its own.
    async fn end(
        summary: Summary<Q::Item>,
        queue: Q,
        feed: JoinHandle<()>,
        tasks: Vec<JoinHandle<()>>,
        election: Option<ElectionHandle>,
        failure: &Mutex<Option<ErrorKind>>,
        forced: &watch::Sender<bool>,
    ) -> Result<Summary<Q::Item>, Error<Q::Item>> {
        feed.abort();
        if let Err(error) = feed.await
            && error.is_panic()
        {
            tracing::error!(%error, "the controller's feed panicked");
        }
        for task in tasks {
            task.abort();
        }
        // Workers cut off by the shutdown timeout dropped their leases: a shared queue
        // releases those in the background; give the releases a moment to land.
        match tokio::time::timeout(LEASE_RETURN_TIMEOUT, queue.shut_down_with_drain()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "cannot drain the queue's leases"),
            Err(_) => tracing::warn!(
                timeout = ?LEASE_RETURN_TIMEOUT,
                "leases still out after the stop; the queue takes them back when they expire"
            ),
        }
        // Last: no reconcile of this replica runs any more.
        if let Some(election) = election {
            election.stop().await;
        }
        let failure = failure.lock().take();
        match failure.or_else(|| (*forced.borrow()).then_some(ErrorKind::Forced)) {
            Some(kind) => Err(Error::new(kind, summary)),
            None => Ok(summary),
        }
    }
}
