//! Leader election on a `coordination.k8s.io/v1` Lease: [`LeaderElection`], and the task
//! that runs it for a controller.
//!
//! The rules are client-go's (`tools/leaderelection/leaderelection.go` and
//! `resourcelock/leaselock.go`), with fencing added on the leader's side:
//!
//! - **One record, optimistic concurrency.** The Lease's spec is the record: holder,
//!   `leaseDurationSeconds`, acquire and renew times, `leaseTransitions`. Every write is a
//!   replace naming the `resourceVersion` last read, so of two replicas writing at once one
//!   gets `409 Conflict` and holds nothing. A Lease that does not exist is created (of two
//!   creates, one gets `409 AlreadyExists`).
//! - **Timestamps are not trusted.** A replica times the holder's lease with its own clock,
//!   from the moment it saw the record *change*; the times written in the record are never
//!   compared with a local clock, so clock offsets between replicas do not matter (clock
//!   *rates* do, within the ratio of the lease duration to the renew deadline, 1.5 by
//!   default). A record unchanged for `leaseDurationSeconds` (of the record) is expired; one
//!   without a holder (released) is free at once.
//! - **Acquire** every retry period, jittered up to 1.2 times more (client-go's
//!   `JitterFactor`), while another replica holds an unexpired lease; taking a lease from
//!   another holder adds one to `leaseTransitions`.
//! - **Renew** every retry period: first optimistically with the Lease last written (one
//!   round trip), else by reading it again (`leader_election_slowpath_total`); failed
//!   renewals are retried every retry period until the renew deadline.
//! - **Fencing.** The leader counts its renew deadline from the moment it *sent* its last
//!   successful renewal: no other replica can have seen that write earlier, so none can
//!   take the lease before that moment plus the lease duration. At the renew deadline (or
//!   as soon as it sees another holder) the leader steps down: the controller hands out no
//!   key from that instant on (the check is made against the clock on every hand-out, not
//!   only when the election task runs), and the reconciles in flight are cancelled (their
//!   futures dropped at their next `.await`, their keys handed back to the queue
//!   unprocessed). The lease duration minus the renew deadline (5 s by default) is the
//!   margin for that cancellation and for clock rate differences. client-go counts the
//!   deadline from the start of the failing renewal round, one retry period later; this is
//!   stricter.
//! - **Release** on a graceful stop, once the reconciles in flight are over: the record is
//!   written without a holder and with `leaseDurationSeconds: 1`, as client-go's
//!   `ReleaseOnCancel` does, so that a standby acquires at its next try.
//!
//! A replica that stepped down goes back to standby and tries to acquire again (client-go's
//! callers usually exit instead); its stores and queue stay warm.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use workq::StopToken;

use crate::instruments;

/// How long a lease lasts without renewal by default: client-go's core components' 15 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// How long a leader keeps trying to renew before it steps down, by default: client-go's
/// core components' 10 s.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// How long the replicas wait between tries by default: client-go's core components' 2 s.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The longest lease duration: `leaseDurationSeconds` is an `int32`. It also bounds the
/// renew deadline and the retry period (both shorter), so that every instant they are added
/// to stays well within what the clock counts.
const MAX_LEASE_DURATION: Duration = Duration::from_secs(i32::MAX as u64);

/// The acquire loop waits between one and `1 + JITTER_FACTOR` retry periods (client-go's
/// `JitterFactor`).
const JITTER_FACTOR: f64 = 1.2;

/// How a controller elects its leader: a `coordination.k8s.io/v1` Lease, client-go's timings
/// by default. Give it to [`Controller::leader_election`](crate::Controller::leader_election),
/// or name the Lease with [`Controller::leader_elected`](crate::Controller::leader_elected).
///
/// See the [module documentation](self) for the rules, and [`Controller::leader_election`]
/// for what a leader-elected controller does.
///
/// [`Controller::leader_election`]: crate::Controller::leader_election
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq_kube::LeaderElection;
///
/// let election = LeaderElection::new("widget-operator")
///     .namespace("operators")
///     .lease_duration(Duration::from_secs(30))
///     .renew_deadline(Duration::from_secs(20))
///     .retry_period(Duration::from_secs(4));
/// assert_eq!(election.lease_name(), "widget-operator");
/// ```
#[derive(Clone)]
#[must_use = "a leader election does nothing until a controller runs with it"]
pub struct LeaderElection {
    lease_name: String,
    namespace: Option<String>,
    identity: Option<String>,
    client: Option<Client>,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    release_on_stop: bool,
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("lease_name", &self.lease_name)
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
            .field("lease_duration", &self.lease_duration)
            .field("renew_deadline", &self.renew_deadline)
            .field("retry_period", &self.retry_period)
            .field("release_on_stop", &self.release_on_stop)
            .finish_non_exhaustive()
    }
}

impl LeaderElection {
    /// An election on the Lease named `lease_name`, with client-go's timings
    /// ([`DEFAULT_LEASE_DURATION`], [`DEFAULT_RENEW_DEADLINE`], [`DEFAULT_RETRY_PERIOD`]),
    /// released on a graceful stop.
    ///
    /// # Defaults
    ///
    /// - the client and namespace: the controller's main `Api` (its client's default
    ///   namespace for an `Api::all`);
    /// - the identity: the host name (the pod's name in a cluster) and a random suffix,
    ///   unique per process, as controller-runtime makes it.
    pub fn new(lease_name: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: None,
            identity: None,
            client: None,
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            release_on_stop: true,
        }
    }

    /// The Lease's name.
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    /// The namespace of the Lease.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The client the Lease is read and written with (needed for the stream constructors,
    /// which have no `Api`).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// This replica's name in the Lease's `holderIdentity`: unique among the replicas.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// How long the other replicas wait, after they last saw the record change, before they
    /// take the lease. It is written in whole seconds (`leaseDurationSeconds`), rounded up.
    /// Default [`DEFAULT_LEASE_DURATION`].
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long after its last successful renewal was sent the leader steps down if it could
    /// not renew since. Default [`DEFAULT_RENEW_DEADLINE`].
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// How long the replicas wait between tries. Default [`DEFAULT_RETRY_PERIOD`].
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// Whether a graceful stop releases the lease once the reconciles in flight are over, so
    /// that a standby takes over at its next try instead of after the lease duration
    /// (client-go's `ReleaseOnCancel`). Default `true`.
    pub fn release_on_stop(mut self, release: bool) -> Self {
        self.release_on_stop = release;
        self
    }

    /// client-go's rules on the timings: the lease duration above the renew deadline, the
    /// renew deadline above 1.2 retry periods, each above zero.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.lease_name.is_empty() {
            return Err("the Lease's name is empty".into());
        }
        if self.identity.as_deref() == Some("") {
            return Err("the identity is empty".into());
        }
        if self.retry_period.is_zero() {
            return Err("the retry period must be above zero".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return Err(format!(
                "the renew deadline ({:?}) must be longer than {JITTER_FACTOR} retry periods ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration > MAX_LEASE_DURATION {
            return Err(format!(
                "the lease duration ({:?}) does not fit leaseDurationSeconds (at most {:?})",
                self.lease_duration, MAX_LEASE_DURATION
            ));
        }
        Ok(())
    }

    /// The election's task, ready to run with `client` and `namespace` unless given here.
    pub(crate) fn resolve(self, main: Option<(Client, String)>) -> Result<Elector, String> {
        self.validate()?;
        let (client, namespace) = match (self.client, self.namespace, main) {
            (Some(client), Some(namespace), _) => (client, namespace),
            (Some(client), None, main) => {
                let namespace = main.map_or_else(
                    || client.default_namespace().to_owned(),
                    |(_, namespace)| namespace,
                );
                (client, namespace)
            }
            (None, namespace, Some((client, main_namespace))) => {
                (client, namespace.unwrap_or(main_namespace))
            }
            (None, _, None) => {
                return Err(
                    "a controller built from a stream has no Api: give the leader election a client (LeaderElection::client)"
                        .into(),
                );
            }
        };
        let identity = self.identity.unwrap_or_else(default_identity);
        let lease_seconds = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let lease_seconds = if self.lease_duration.subsec_nanos() > 0 {
            lease_seconds.saturating_add(1)
        } else {
            lease_seconds
        };
        let (state, _) = watch::channel(LeaderState {
            identity: identity.clone(),
            leading: false,
            term: 0,
            valid_until: None,
            leader: None,
        });
        Ok(Elector {
            api: Api::namespaced(client, &namespace),
            name: self.lease_name,
            namespace,
            identity,
            lease_seconds,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            release_on_stop: self.release_on_stop,
            observed: None,
            lease: None,
            state,
        })
    }
}

/// The host name (a pod's name in a cluster) and 32 random hex digits.
fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}_{:032x}", rand::random::<u128>())
}

/// What the controller knows of the election, shared by the election task.
#[derive(Debug, Clone)]
pub(crate) struct LeaderState {
    /// This replica's identity.
    pub(crate) identity: String,
    /// Whether this replica leads now.
    pub(crate) leading: bool,
    /// How many times this replica became the leader: a step-down and a new acquisition
    /// make a new term, so that work of the old term is told from work of the new.
    pub(crate) term: u64,
    /// Until when the leadership holds without another renewal (the renew deadline from the
    /// last renewal sent); `None` while not leading.
    pub(crate) valid_until: Option<Instant>,
    /// The holder last seen in the Lease, if any.
    pub(crate) leader: Option<String>,
}

/// The controller's side of the election: whether it may hand out work now.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    state: watch::Receiver<LeaderState>,
}

impl Fence {
    /// The term this replica leads in now, if it leads and its renew deadline has not
    /// passed (read against the clock, not only the election task's word).
    pub(crate) fn current(&self) -> Option<u64> {
        let state = self.state.borrow();
        (state.leading
            && state
                .valid_until
                .is_some_and(|until| Instant::now() < until))
        .then_some(state.term)
    }

    /// Whether this replica still leads in `term`.
    pub(crate) fn holds(&self, term: u64) -> bool {
        self.current() == Some(term)
    }

    /// Waits until this replica leads; returns the term.
    pub(crate) async fn leading(&self) -> u64 {
        let mut state = self.state.clone();
        loop {
            if let Some(term) = self.current() {
                return term;
            }
            if state.changed().await.is_err() {
                // The election is over: no term comes.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Completes once this replica no longer leads in `term`: it stepped down, or its renew
    /// deadline passed without a renewal.
    pub(crate) async fn lost(&self, term: u64) {
        let mut state = self.state.clone();
        loop {
            let until = {
                let now = state.borrow_and_update();
                match now.valid_until {
                    Some(until) if now.leading && now.term == term => until,
                    _ => return,
                }
            };
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The state now.
    pub(crate) fn state(&self) -> LeaderState {
        self.state.borrow().clone()
    }
}

/// One election's task and its state: a client-go `LeaderElector` on a `LeaseLock`.
pub(crate) struct Elector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    /// The lease duration written in the record.
    lease_seconds: i32,
    renew_deadline: Duration,
    retry_period: Duration,
    release_on_stop: bool,
    /// The record last seen, and when this process saw it change.
    observed: Option<(LeaseSpec, Instant)>,
    /// The Lease last read or written: the `resourceVersion` of the next write.
    lease: Option<Lease>,
    state: watch::Sender<LeaderState>,
}

/// Why the leader stopped renewing.
enum Ended {
    /// The controller stops.
    Stop,
    /// The lease could not be proven any longer.
    Lost(&'static str),
}

/// The running election, held by [`Running`](crate::Running).
pub(crate) struct ElectionHandle {
    /// Tells the task to stop (and release the lease if it leads).
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    fence: Fence,
    /// The longest a release may take: the renew deadline.
    release_timeout: Duration,
}

impl ElectionHandle {
    /// The controller's view of the election.
    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Stops the election: a leader steps down and releases the lease (if configured so),
    /// once. Called when the reconciles in flight are over.
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The release is bounded by the renew deadline inside; a little more for the task.
        let limit = self.release_timeout.saturating_add(Duration::from_secs(1));
        if tokio::time::timeout(limit, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Elector {
    /// The controller's view of this election, before it runs.
    pub(crate) fn fence(&self) -> Fence {
        Fence {
            state: self.state.subscribe(),
        }
    }

    /// Starts the election task. It runs until [`ElectionHandle::stop`], or, if the handle
    /// is dropped first, until `workers` stop.
    pub(crate) fn spawn(self, workers: StopToken) -> ElectionHandle {
        let (stop, stopped) = oneshot::channel();
        let fence = self.fence();
        let release_timeout = self.renew_deadline;
        let task = tokio::spawn(self.run(async move {
            if stopped.await.is_err() {
                workers.stopped().await;
            }
        }));
        ElectionHandle {
            stop: Some(stop),
            task,
            fence,
            release_timeout,
        }
    }

    /// `namespace/name`, for logs.
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut stop = pin!(stop);
        instruments::leader_status(&self.name, false);
        tracing::info!(lease = %self.describe(), identity = %self.identity, "trying to acquire the leader lease");
        loop {
            // Acquire: until this replica holds the lease, or the controller stops.
            let acquired_at = loop {
                let sent = Instant::now();
                let acquired =
                    tokio::time::timeout(self.renew_deadline, self.try_acquire_or_renew())
                        .await
                        .unwrap_or(false);
                self.report_leader();
                if acquired {
                    break sent;
                }
                tokio::select! {
                    biased;
                    () = &mut stop => return,
                    () = tokio::time::sleep(jittered(self.retry_period)) => {}
                }
            };
            self.lead(acquired_at);
            match self.renew(acquired_at, &mut stop).await {
                Ended::Stop => {
                    if self.release_on_stop {
                        // Step down first: nothing more is handed out, then the lease goes.
                        self.step_down("the controller stops");
                        self.release().await;
                    } else {
                        self.step_down("the controller stops (the lease is left to expire)");
                    }
                    return;
                }
                Ended::Lost(why) => self.step_down(why),
            }
        }
    }

    /// Renews every retry period until the controller stops or the lease is lost.
    async fn renew(
        &mut self,
        acquired_at: Instant,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> Ended {
        let mut last = acquired_at;
        loop {
            tokio::select! {
                biased;
                () = &mut *stop => return Ended::Stop,
                () = tokio::time::sleep(self.retry_period) => {}
            }
            // Retried every retry period until the renew deadline, counted from the last
            // successful renewal's send.
            loop {
                let deadline = last + self.renew_deadline;
                let sent = Instant::now();
                if sent >= deadline {
                    return Ended::Lost("the renew deadline passed");
                }
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(true) => {
                        last = sent;
                        self.state.send_modify(|state| {
                            state.valid_until = Some(sent + self.renew_deadline);
                        });
                        break;
                    }
                    Ok(false) => {
                        self.report_leader();
                        if !self.is_leader() {
                            return Ended::Lost("another replica holds the lease");
                        }
                        tokio::select! {
                            biased;
                            () = &mut *stop => return Ended::Stop,
                            () = tokio::time::sleep_until((sent + self.retry_period).min(deadline)) => {}
                        }
                    }
                    Err(_) => return Ended::Lost("the renew deadline passed"),
                }
            }
        }
    }

    /// This replica leads from now on, until `acquired_at` plus the renew deadline unless
    /// renewed.
    fn lead(&mut self, acquired_at: Instant) {
        let until = acquired_at + self.renew_deadline;
        let mut term = 0;
        self.state.send_modify(|state| {
            state.leading = true;
            state.term += 1;
            state.valid_until = Some(until);
            state.leader = Some(state.identity.clone());
            term = state.term;
        });
        instruments::leader_status(&self.name, true);
        let transitions = self
            .observed
            .as_ref()
            .and_then(|(spec, _)| spec.lease_transitions);
        tracing::info!(lease = %self.describe(), identity = %self.identity, term, transitions, "became the leader");
    }

    /// This replica no longer leads.
    fn step_down(&mut self, why: &'static str) {
        self.state.send_modify(|state| {
            state.leading = false;
            state.valid_until = None;
        });
        instruments::leader_status(&self.name, false);
        tracing::warn!(lease = %self.describe(), identity = %self.identity, reason = why, "stopped leading: no new reconcile starts, and those in flight are cancelled");
    }

    /// Logs a new holder seen in the record (client-go's `OnNewLeader`).
    fn report_leader(&mut self) {
        let holder = self
            .observed
            .as_ref()
            .and_then(|(spec, _)| spec.holder_identity.clone())
            .filter(|holder| !holder.is_empty());
        if self.state.borrow().leader == holder {
            return;
        }
        if let Some(holder) = &holder {
            tracing::info!(lease = %self.describe(), leader = %holder, "new leader observed");
        }
        self.state.send_modify(|state| state.leader = holder);
    }

    /// Whether the record last seen names this replica.
    fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|(spec, _)| spec.holder_identity.as_deref() == Some(&self.identity))
    }

    /// Whether the record last seen is unexpired at `now`, by this process's clock from the
    /// moment it was seen to change.
    fn lease_valid(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|(spec, seen)| {
            let seconds = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
            // A record's duration past what the clock counts never expires.
            seen.checked_add(Duration::from_secs(seconds))
                .is_none_or(|expiry| expiry > now)
        })
    }

    /// Whether the record last seen names another holder, unexpired at `now`.
    fn held_by_another(&self, now: Instant) -> bool {
        self.lease_valid(now)
            && self.observed.as_ref().is_some_and(|(spec, _)| {
                spec.holder_identity
                    .as_deref()
                    .is_some_and(|holder| !holder.is_empty() && holder != self.identity)
            })
    }

    /// Notes a record this replica wrote (as the server stored it).
    fn wrote(&mut self, written: Lease) {
        let spec = written.spec.clone().unwrap_or_default();
        self.observed = Some((spec, Instant::now()));
        self.lease = Some(written);
    }

    /// client-go's `tryAcquireOrRenew`: takes the lease if it is free or expired, renews it
    /// if this replica holds it. Returns whether this replica holds it now.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let now = Instant::now();
        let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut record = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_seconds),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
        let params = PostParams::default();

        // 1. The leader's fast path: write over the Lease it last wrote.
        if self.is_leader()
            && self.lease_valid(now)
            && let (Some((seen, _)), Some(lease)) = (&self.observed, &self.lease)
        {
            let mut next = lease.clone();
            next.spec = Some(LeaseSpec {
                acquire_time: seen.acquire_time.clone(),
                lease_transitions: seen.lease_transitions,
                ..record.clone()
            });
            match self.api.replace(&self.name, &params, &next).await {
                Ok(written) => {
                    self.wrote(written);
                    return true;
                }
                Err(error) => {
                    tracing::debug!(lease = %self.describe(), %error, "the optimistic renewal failed; reading the Lease");
                }
            }
        }

        // 2. Read the Lease, or create it.
        let current = match self.api.get(&self.name).await {
            Ok(lease) => lease,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                // Deleted (by hand) under a holder whose lease this replica saw unexpired:
                // that holder may still be working, so the Lease is taken as held until the
                // lease would have expired. (client-go creates it at once.)
                if !self.is_leader() && self.held_by_another(now) {
                    tracing::warn!(lease = %self.describe(), "the Lease was deleted under an unexpired holder; waiting for its lease to expire");
                    return false;
                }
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record),
                };
                return match self.api.create(&params, &lease).await {
                    Ok(written) => {
                        self.wrote(written);
                        true
                    }
                    Err(error) => {
                        tracing::warn!(lease = %self.describe(), %error, "cannot create the Lease");
                        false
                    }
                };
            }
            Err(error) => {
                tracing::warn!(lease = %self.describe(), %error, "cannot read the Lease");
                return false;
            }
        };

        // 3. A changed record restarts the holder's lease, by this process's clock.
        let spec = current.spec.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec) {
            self.observed = Some((spec.clone(), now));
        }
        self.lease = Some(current.clone());
        if self.held_by_another(now) {
            tracing::trace!(lease = %self.describe(), holder = ?spec.holder_identity, "the lease is held and unexpired");
            return false;
        }

        // 4. Take it (one more transition) or renew it (the same acquire time).
        if self.is_leader() {
            record.acquire_time = spec.acquire_time.clone();
            record.lease_transitions = spec.lease_transitions;
            instruments::leader_slowpath(&self.name);
        } else {
            record.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        let mut next = current;
        next.spec = Some(record);
        match self.api.replace(&self.name, &params, &next).await {
            Ok(written) => {
                self.wrote(written);
                true
            }
            Err(error) => {
                tracing::debug!(lease = %self.describe(), %error, "cannot write the Lease");
                false
            }
        }
    }

    /// client-go's `release`: writes the record without a holder and with
    /// `leaseDurationSeconds: 1`, if this replica still holds the lease; a conflict (a
    /// renewal of ours that landed meanwhile) is retried, within the renew deadline.
    async fn release(&mut self) {
        let limit = self.renew_deadline;
        let attempt = async {
            loop {
                let current = match self.api.get(&self.name).await {
                    Ok(lease) => lease,
                    Err(error) => {
                        tracing::warn!(lease = %self.describe(), %error, "cannot read the Lease to release it; it expires on its own");
                        return;
                    }
                };
                let spec = current.spec.clone().unwrap_or_default();
                if spec.holder_identity.as_deref() != Some(&self.identity) {
                    return;
                }
                let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
                let mut next = current;
                next.spec = Some(LeaseSpec {
                    holder_identity: Some(String::new()),
                    lease_duration_seconds: Some(1),
                    acquire_time: Some(stamp.clone()),
                    renew_time: Some(stamp),
                    lease_transitions: spec.lease_transitions,
                    ..LeaseSpec::default()
                });
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &next)
                    .await
                {
                    Ok(written) => {
                        self.wrote(written);
                        tracing::info!(lease = %self.describe(), identity = %self.identity, "released the lease");
                        return;
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(error) => {
                        tracing::warn!(lease = %self.describe(), %error, "cannot release the Lease; it expires on its own");
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(limit, attempt).await.is_err() {
            tracing::warn!(lease = %self.describe(), "the release timed out; the Lease expires on its own");
        }
        self.report_leader();
    }
}

/// `period` stretched by a random factor in `[1, 1 + JITTER_FACTOR)` (client-go's
/// `wait.Jitter`).
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + rand::random::<f64>() * JITTER_FACTOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_gos_timing_rules_are_checked() {
        assert!(LeaderElection::new("l").validate().is_ok());
        let short = LeaderElection::new("l")
            .lease_duration(Duration::from_secs(10))
            .renew_deadline(Duration::from_secs(10));
        assert!(short.validate().unwrap_err().contains("lease duration"));
        let tight = LeaderElection::new("l")
            .renew_deadline(Duration::from_millis(2400))
            .retry_period(Duration::from_secs(2));
        assert!(tight.validate().unwrap_err().contains("1.2 retry periods"));
        let zero = LeaderElection::new("l").retry_period(Duration::ZERO);
        assert!(zero.validate().is_err());
        assert!(LeaderElection::new("").validate().is_err());
        assert!(LeaderElection::new("l").identity("").validate().is_err());
    }

    /// `Duration::MAX` in any timing is refused with the rule it breaks, never accepted to
    /// overflow an instant later; the longest timings the rules allow are accepted.
    #[test]
    fn duration_max_timings_are_refused_with_the_rule_they_break() {
        let lease = LeaderElection::new("l").lease_duration(Duration::MAX);
        let error = lease.validate().unwrap_err();
        assert!(
            error.contains("does not fit leaseDurationSeconds"),
            "{error}"
        );
        let renew = LeaderElection::new("l").renew_deadline(Duration::MAX);
        let error = renew.validate().unwrap_err();
        assert!(
            error.contains("must be longer than the renew deadline"),
            "{error}"
        );
        let retry = LeaderElection::new("l").retry_period(Duration::MAX);
        let error = retry.validate().unwrap_err();
        assert!(error.contains("1.2 retry periods"), "{error}");
        let all = LeaderElection::new("l")
            .lease_duration(Duration::MAX)
            .renew_deadline(Duration::MAX)
            .retry_period(Duration::MAX);
        assert!(all.validate().is_err());
        let longest = LeaderElection::new("l")
            .lease_duration(MAX_LEASE_DURATION)
            .renew_deadline(MAX_LEASE_DURATION - Duration::from_secs(1))
            .retry_period(MAX_LEASE_DURATION / 2);
        assert_eq!(longest.validate(), Ok(()));
    }

    #[test]
    fn the_jitter_stays_within_client_gos_factor() {
        let period = Duration::from_millis(100);
        for _ in 0..1000 {
            let wait = jittered(period);
            assert!(wait >= period && wait < period.mul_f64(2.2), "{wait:?}");
        }
    }

    #[test]
    fn default_identities_differ_between_processes() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        assert!(a.contains('_'));
    }
}
