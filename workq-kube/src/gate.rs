//! [`ControllerQueue`]: the queue the workers take keys from, with the controller's rules on
//! top: no key before the store is ready, events for a key held while it is reconciled, and
//! a failed key's retry not brought forward by events it caused itself.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use workq::{AddOptions, DoneMany, Queue, QueueLease};

use crate::instruments::Instruments;
use crate::leader::Fence;

/// What the controller knows of an object's spec from one of its versions: enough to tell
/// a change of the spec (which may fix a failure) from a write of the status or metadata
/// (which the reconcile itself may have made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `metadata.generation`: the API server bumps it on every change of the spec, and not
    /// on writes of the status. `None` for kinds without one (ConfigMaps, Secrets).
    pub(crate) generation: Option<i64>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub(crate) deleting: bool,
}

impl Spec {
    /// The spec marks of `object`.
    pub(crate) fn of<K: kube::Resource>(object: &K) -> Self {
        let meta = object.meta();
        Self {
            generation: meta.generation,
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

/// Why a key is about to be added: what the feed knows of the event behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The main object was listed or changed; its spec marks as seen in the event.
    Object(Spec),
    /// The main object was deleted.
    Deleted,
    /// Anything else: a related object, an outside trigger, a resync.
    Related,
}

/// How a failed attempt's retry was scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// With the queue's rate limiter: the item's failure count is above zero until a
    /// success, a give-up or an explicit forget.
    Backoff,
    /// After a fixed delay (an error policy's `RetryAfter`), due at this instant; `None`
    /// for a delay past what the clock counts (`Duration::MAX`: no limit), never due.
    At(Option<Instant>),
}

/// How the attempt a worker holds a key for ended, as far as the handler knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The handler has not finished (or never ran: the item was handed back unprocessed).
    Pending,
    /// Done, or a requeue after a delay the reconcile asked for: not a failure.
    Succeeded,
    /// A failure retried with the queue's backoff (an error, a panic, a timeout).
    FailedBackoff,
    /// A failure retried after a fixed delay.
    FailedAfter(Duration),
    /// Given up.
    GaveUp,
    /// Cancelled by a forced stop: the item goes back to the queue unprocessed.
    Cancelled,
}

/// A key the controller keeps an eye on.
#[derive(Debug)]
enum KeyState {
    /// A worker of this process holds it.
    Running {
        /// The spec marks of the object the attempt reconciles, once the handler read it.
        seen: Option<Spec>,
        /// The highest priority of the events held back while it runs, if any.
        held: Option<i32>,
        /// How the attempt ended.
        attempt: Attempt,
        /// Whether the workers' retry of it was accepted by the queue.
        retry_added: bool,
    },
    /// Its last attempt here failed and its retry waits in the queue.
    BackingOff {
        /// The spec marks the failed attempt saw.
        seen: Option<Spec>,
        /// How the retry was scheduled.
        retry: Retry,
    },
}

/// What the feed does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Add it to the queue.
    Add,
    /// Held: its reconcile is running; the key is added when the attempt succeeds.
    Hold,
    /// Deferred: it waits for the retry of a failure, which reads the newest object.
    Defer,
    /// Deferred if the queue still counts failures for it (`num_requeues > 0`); added if
    /// not (the retry ran elsewhere, on a queue shared with other processes).
    Verify,
}

/// A retry after a fixed delay that has not come back this long after it was due is taken
/// for one that ran in another process.
const RETRY_GRACE: Duration = Duration::from_secs(5);

/// The state behind [`ControllerQueue`], shared with the feed and the handler.
pub(crate) struct Gate<T> {
    /// The keys being reconciled here or backing off after a failure here.
    keys: Mutex<HashMap<T, KeyState>>,
    /// Turns `true` once the main store has completed its first list.
    ready: watch::Receiver<bool>,
    /// The controller's reconcile series (a give-up after `max_retries` is seen here).
    pub(crate) instruments: Instruments,
    /// The leader election, if the controller runs only on the leader.
    pub(crate) fence: Option<Fence>,
}

impl<T: Eq + Hash + Clone> Gate<T> {
    pub(crate) fn new(
        ready: watch::Receiver<bool>,
        instruments: Instruments,
        fence: Option<Fence>,
    ) -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            ready,
            instruments,
            fence,
        }
    }

    /// Whether this replica may hand out work now: it leads, or there is no election.
    pub(crate) fn leading(&self) -> bool {
        self.fence
            .as_ref()
            .is_none_or(|fence| fence.current().is_some())
    }

    /// Whether the attempt on `key` failed with a retry to come: if its lease ends with a
    /// `done` instead, the workers gave it up (their `max_retries`).
    fn failed(&self, key: &T) -> bool {
        matches!(
            self.keys.lock().get(key),
            Some(KeyState::Running {
                attempt: Attempt::FailedBackoff,
                ..
            })
        )
    }

    /// Counts a give-up of the workers as a terminal error, unless its `done` was refused
    /// for a lost lease (`lost`): then the item is another worker's, and nothing was given up.
    fn count_give_up(&self, gave_up: bool, lost: bool) {
        if gave_up && !lost {
            self.instruments.terminal_error();
        }
    }

    /// Waits until the main store is ready; for ever if it never will be (the feed then
    /// stops the controller with an error).
    async fn wait_ready(&self) {
        let mut ready = self.ready.clone();
        if ready.wait_for(|ready| *ready).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// What the feed does with `key`, added for `cause` at `priority`.
    pub(crate) fn admit(&self, key: &T, cause: Cause, priority: i32) -> Admit {
        let mut keys = self.keys.lock();
        let Some(state) = keys.get_mut(key) else {
            return Admit::Add;
        };
        match state {
            KeyState::Running { seen, held, .. } => {
                if cuts_short(cause, *seen) {
                    // The queue keeps the add until the lease ends, whatever the outcome.
                    Admit::Add
                } else {
                    *held = Some(held.map_or(priority, |held| held.max(priority)));
                    Admit::Hold
                }
            }
            KeyState::BackingOff { seen, retry } => {
                if cuts_short(cause, *seen) {
                    return Admit::Add;
                }
                match *retry {
                    Retry::Backoff => Admit::Verify,
                    Retry::At(Some(due))
                        if Instant::now().saturating_duration_since(due) > RETRY_GRACE =>
                    {
                        keys.remove(key);
                        Admit::Add
                    }
                    Retry::At(_) => Admit::Defer,
                }
            }
        }
    }

    /// Forgets a backoff the queue no longer counts (its retry ran elsewhere).
    pub(crate) fn backoff_over(&self, key: &T) {
        let mut keys = self.keys.lock();
        if matches!(keys.get(key), Some(KeyState::BackingOff { .. })) {
            keys.remove(key);
        }
    }

    /// A worker of this process was handed `key`.
    fn started(&self, key: &T) {
        self.keys.lock().insert(
            key.clone(),
            KeyState::Running {
                seen: None,
                held: None,
                attempt: Attempt::Pending,
                retry_added: false,
            },
        );
    }

    /// The handler read the object it reconciles.
    pub(crate) fn saw(&self, key: &T, spec: Spec) {
        if let Some(KeyState::Running { seen, .. }) = self.keys.lock().get_mut(key) {
            *seen = Some(spec);
        }
    }

    /// The handler's attempt ended as `how`.
    pub(crate) fn finished(&self, key: &T, how: Attempt) {
        if let Some(KeyState::Running { attempt, .. }) = self.keys.lock().get_mut(key) {
            *attempt = how;
        }
    }

    /// Whether the attempt on `key` was cancelled by a forced stop.
    fn cancelled(&self, key: &T) -> bool {
        matches!(
            self.keys.lock().get(key),
            Some(KeyState::Running {
                attempt: Attempt::Cancelled,
                ..
            })
        )
    }

    /// The queue accepted the workers' retry of `key`.
    fn retry_added(&self, key: &T) {
        if let Some(KeyState::Running { retry_added, .. }) = self.keys.lock().get_mut(key) {
            *retry_added = true;
        }
    }

    /// The lease on `key` ended: returns the priority to add it at now (events held during
    /// a successful attempt), and keeps a failed key backing off until its retry.
    fn ended(&self, key: &T) -> Option<i32> {
        let mut keys = self.keys.lock();
        let Some(KeyState::Running {
            seen,
            held,
            attempt,
            retry_added,
        }) = keys.remove(key)
        else {
            return None;
        };
        let retry = match attempt {
            Attempt::Succeeded => return held,
            Attempt::FailedBackoff if retry_added => Retry::Backoff,
            Attempt::FailedAfter(delay) if retry_added => {
                Retry::At(Instant::now().checked_add(delay))
            }
            // Given up (by the policy or after the workers' `max_retries`), cancelled, or
            // handed back unprocessed: events held back are the attempt's own doing, or
            // will be seen by the hand-out that follows.
            _ => return None,
        };
        keys.insert(key.clone(), KeyState::BackingOff { seen, retry });
        None
    }

    /// How many keys are backing off after a failure here.
    pub(crate) fn backing_off(&self) -> usize {
        self.keys
            .lock()
            .values()
            .filter(|state| matches!(state, KeyState::BackingOff { .. }))
            .count()
    }
}

/// Whether an event with `cause` brings a key forward although it is running or backing
/// off: a deletion, or a change of the spec since the version the attempt saw.
fn cuts_short(cause: Cause, seen: Option<Spec>) -> bool {
    match cause {
        Cause::Deleted => true,
        Cause::Object(spec) => seen.is_some_and(|seen| seen != spec),
        Cause::Related => false,
    }
}

/// The queue a controller's workers run on: the queue you gave the controller (or its
/// default), seen through the controller's rules.
///
/// - With a leader election, no key is handed out while this replica does not lead (a key
///   taken as the leadership ends is handed back), and a step's next key only while it
///   leads.
/// - No key is handed out before the main store has completed its first list, so no
///   reconcile and no "gone" verdict comes before the store knows every object.
/// - A key's lease ending tells the controller how the attempt went: after a success, events
///   that came in for the object while it ran are added; after a failure, the object waits
///   for its retry, and events that do not change its spec (a status the reconcile wrote, a
///   child it touched) do not bring the retry forward (kubernetes#132805).
/// - After a forced stop, a cancelled reconcile's key is handed back to the queue
///   unprocessed (released), not marked done.
///
/// Every other call goes to the queue as is. You meet this type in
/// [`Controller::workers`](crate::Controller::workers), whose settings apply to
/// [`Workers`](workq::Workers) over it.
pub struct ControllerQueue<Q: Queue> {
    /// The queue itself.
    inner: Q,
    /// The controller's state, shared with the feed and the handler.
    gate: Arc<Gate<Q::Item>>,
}

impl<Q: Queue> ControllerQueue<Q> {
    pub(crate) fn new(inner: Q, gate: Arc<Gate<Q::Item>>) -> Self {
        Self { inner, gate }
    }

    /// The queue itself.
    pub fn inner(&self) -> &Q {
        &self.inner
    }

    /// A lease a step handed out, unless this replica no longer leads: then it goes back.
    async fn next_if_leading(&self, next: Option<Q::Lease>) -> Option<ControllerLease<Q>> {
        let next = next?;
        if self.gate.leading() {
            Some(self.wrap(next))
        } else {
            hand_back(next).await;
            None
        }
    }

    /// Wraps a lease the queue handed out, noting the key as running.
    fn wrap(&self, lease: Q::Lease) -> ControllerLease<Q> {
        self.gate.started(lease.item());
        ControllerLease {
            lease: Some(lease),
            queue: self.inner.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<Q: Queue> Clone for ControllerQueue<Q> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<Q: Queue> fmt::Debug for ControllerQueue<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerQueue")
            .field("name", &self.inner.name())
            .field("ready", &*self.gate.ready.borrow())
            .finish_non_exhaustive()
    }
}

impl<Q: Queue> Queue for ControllerQueue<Q> {
    type Item = Q::Item;
    type Lease = ControllerLease<Q>;
    type Error = Q::Error;

    fn name(&self) -> Option<&str> {
        self.inner.name()
    }

    /// The workers' retry: added as asked, and noted, unless the attempt was cancelled by a
    /// forced stop (its lease is released instead, which hands the item out again).
    async fn add_with(&self, item: Q::Item, options: AddOptions) -> Result<bool, Q::Error> {
        if self.gate.cancelled(&item) {
            return Ok(true);
        }
        let added = self.inner.add_with(item.clone(), options).await?;
        if added {
            self.gate.retry_added(&item);
        }
        Ok(added)
    }

    fn forget(&self, item: &Q::Item) -> impl Future<Output = Result<(), Q::Error>> + Send {
        self.inner.forget(item)
    }

    /// The workers' failure path: the queue's own step (fenced on a shared backend: a stale
    /// holder's retry changes nothing and comes back as a lost lease), noted by the gate; a
    /// cancelled attempt's lease is released instead (the item is handed out again,
    /// unprocessed, and no failure is counted).
    async fn retry_and_done(
        &self,
        mut lease: ControllerLease<Q>,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<ControllerLease<Q>>, Q::Error> {
        let inner = lease.lease.take().expect("a lease is ended once");
        let item = inner.item().clone();
        if self.gate.cancelled(&item) {
            let released = inner.release().await;
            lease.end(&item).await;
            return released.map(|_| None);
        }
        match self.inner.retry_and_done(inner, options, forget).await {
            Ok(None) => {
                self.gate.retry_added(&item);
                lease.end(&item).await;
                Ok(None)
            }
            // Refused (this handle is shut down): nothing changed, and the lease is the
            // caller's again, still under the controller's watch.
            Ok(Some(inner)) => {
                lease.lease = Some(inner);
                Ok(Some(lease))
            }
            Err(error) => {
                lease.end(&item).await;
                Err(error)
            }
        }
    }

    fn is_lease_lost(error: &Q::Error) -> bool {
        Q::is_lease_lost(error)
    }

    fn num_requeues(&self, item: &Q::Item) -> impl Future<Output = Result<usize, Q::Error>> + Send {
        self.inner.num_requeues(item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Q::Error>> + Send {
        self.inner.len()
    }

    /// Waits for the main store's first list, then (with a leader election) until this
    /// replica leads, then for the queue's next item. An item that comes out as the
    /// leadership ends is handed back to the queue.
    async fn get(&self) -> Result<Option<ControllerLease<Q>>, Q::Error> {
        self.gate.wait_ready().await;
        let Some(fence) = &self.gate.fence else {
            return Ok(self.inner.get().await?.map(|lease| self.wrap(lease)));
        };
        loop {
            let term = fence.leading().await;
            // `get` is cancel safe: dropped when the leadership ends, it loses nothing.
            let got = tokio::select! {
                biased;
                () = fence.lost(term) => continue,
                got = self.inner.get() => got?,
            };
            match got {
                None => return Ok(None),
                Some(lease) if fence.holds(term) => return Ok(Some(self.wrap(lease))),
                Some(lease) => hand_back(lease).await,
            }
        }
    }

    /// The queue's own step (one round trip on a shared backend); a cancelled attempt's
    /// lease is released instead of done.
    async fn done_and_next(
        &self,
        mut lease: ControllerLease<Q>,
        forget: bool,
    ) -> Result<Option<ControllerLease<Q>>, Q::Error> {
        let inner = lease.lease.take().expect("a lease is ended once");
        let item = inner.item().clone();
        let step = if self.gate.cancelled(&item) {
            inner.release().await.map(|_| None)
        } else {
            let gave_up = self.gate.failed(&item);
            let step = self.inner.done_and_next(inner, forget).await;
            let lost = step.as_ref().err().is_some_and(Q::is_lease_lost);
            self.gate.count_give_up(gave_up, lost);
            step
        };
        lease.end(&item).await;
        Ok(self.next_if_leading(step?).await)
    }

    /// The queue's batched step (one round trip for many leases on a shared backend), as
    /// `done_and_next` for each lease: a cancelled attempt's lease is released instead, before
    /// the step, and each lease's end is noted once the step is over.
    async fn done_and_next_many(
        &self,
        leases: Vec<(ControllerLease<Q>, bool)>,
        max: usize,
    ) -> Result<DoneMany<ControllerLease<Q>, Q::Error>, Q::Error> {
        let mut ended = Vec::with_capacity(leases.len());
        let mut batch = Vec::with_capacity(leases.len());
        // Per lease: the outcome of its release, or `None` if it goes in the step.
        let mut released = Vec::with_capacity(leases.len());
        // Per lease: whether it ends a failed attempt the workers gave up.
        let mut gave_up = Vec::with_capacity(leases.len());
        for (mut lease, forget) in leases {
            let inner = lease.lease.take().expect("a lease is ended once");
            let item = inner.item().clone();
            if self.gate.cancelled(&item) {
                released.push(Some(inner.release().await.map(drop)));
                gave_up.push(false);
            } else {
                gave_up.push(self.gate.failed(&item));
                batch.push((inner, forget));
                released.push(None);
            }
            ended.push((lease, item));
        }
        let step = self.inner.done_and_next_many(batch, max).await;
        for (lease, item) in ended {
            lease.end(&item).await;
        }
        let DoneMany { done, next } = step?;
        let mut stepped = done.into_iter();
        let mut done = Vec::with_capacity(released.len());
        for (outcome, gave_up) in released.into_iter().zip(gave_up) {
            match outcome.or_else(|| stepped.next()) {
                Some(outcome) => {
                    let lost = outcome.as_ref().err().is_some_and(Q::is_lease_lost);
                    self.gate.count_give_up(gave_up, lost);
                    done.push(outcome);
                }
                // The backend gave fewer outcomes than leases: the workers report the rest.
                None => break,
            }
        }
        let mut handed = Vec::with_capacity(next.len());
        for lease in next {
            handed.extend(self.next_if_leading(Some(lease)).await);
        }
        Ok(DoneMany { done, next: handed })
    }

    /// The queue's: the controller's workers batch their steps as the queue's own would.
    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    /// The queue's.
    fn steps_in_flight(&self) -> usize {
        self.inner.steps_in_flight()
    }

    /// The queue's: a periodic schedule on a controller's queue keeps its record where the
    /// queue keeps it (on a shared backend, for every process).
    fn upsert_schedule(
        &self,
        update: workq::periodic::ScheduleUpdate,
    ) -> impl Future<Output = Result<workq::periodic::ScheduleInfo, Q::Error>> + Send {
        self.inner.upsert_schedule(update)
    }

    /// The queue's: one item per tick across the fleet.
    fn add_on_tick(
        &self,
        claim: workq::periodic::TickClaim,
        item: Q::Item,
        options: AddOptions,
    ) -> impl Future<Output = Result<workq::periodic::TickOutcome, Q::Error>> + Send {
        self.inner.add_on_tick(claim, item, options)
    }

    fn shut_down(&self) -> Vec<Q::Item> {
        self.inner.shut_down()
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Q::Error>> + Send {
        self.inner.shut_down_with_drain()
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Q::Error>> + Send {
        self.inner.is_shutting_down()
    }
}

/// Hands a lease taken as the leadership ended back to the queue, unprocessed.
async fn hand_back<L: QueueLease>(lease: L) {
    if let Err(error) = lease.release().await {
        tracing::warn!(%error, "cannot hand back a key taken as the leadership ended; the queue takes it back when its lease expires");
    }
}

/// A lease from a [`ControllerQueue`]: the queue's own lease, which tells the controller
/// when it ends.
pub struct ControllerLease<Q: Queue> {
    /// The queue's lease, until it ends.
    lease: Option<Q::Lease>,
    /// The queue, to add the events held during a successful attempt.
    queue: Q,
    /// The controller's state.
    gate: Arc<Gate<Q::Item>>,
}

impl<Q: Queue> ControllerLease<Q> {
    /// Tells the gate the lease on `item` ended, and adds the key again if events came in
    /// while a successful attempt ran.
    fn end(&self, item: &Q::Item) -> impl Future<Output = ()> + Send + use<Q> {
        let held = self.gate.ended(item);
        let (queue, item) = (self.queue.clone(), item.clone());
        async move {
            if let Some(priority) = held
                && let Err(error) = queue
                    .add_with(item, AddOptions::default().priority(priority))
                    .await
            {
                tracing::warn!(%error, "cannot add a key whose object changed while it was reconciled");
            }
        }
    }

    fn inner(&self) -> &Q::Lease {
        self.lease.as_ref().expect("a lease is ended once")
    }
}

impl<Q: Queue> fmt::Debug for ControllerLease<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ControllerLease").field(&self.lease).finish()
    }
}

impl<Q: Queue> QueueLease for ControllerLease<Q> {
    type Item = Q::Item;
    type Error = Q::Error;

    fn item(&self) -> &Q::Item {
        self.inner().item()
    }

    fn priority(&self) -> i32 {
        self.inner().priority()
    }

    /// The queue's lease's: the workers' `workqueue.item` span, which the reconcile runs in,
    /// links to the adds (the events) that queued the key.
    #[cfg(feature = "otel")]
    fn links(&self) -> &[workq::otel::TraceLink] {
        self.inner().links()
    }

    /// The queue's lease's.
    #[cfg(feature = "otel")]
    fn links_dropped(&self) -> u32 {
        self.inner().links_dropped()
    }

    async fn done(mut self) -> Result<(), Q::Error> {
        let inner = self.lease.take().expect("a lease is ended once");
        let item = inner.item().clone();
        let result = if self.gate.cancelled(&item) {
            inner.release().await.map(|_| ())
        } else {
            let gave_up = self.gate.failed(&item);
            let result = inner.done().await;
            let lost = result.as_ref().err().is_some_and(Q::is_lease_lost);
            self.gate.count_give_up(gave_up, lost);
            result
        };
        self.end(&item).await;
        result
    }

    async fn release(mut self) -> Result<bool, Q::Error> {
        let inner = self.lease.take().expect("a lease is ended once");
        let item = inner.item().clone();
        let result = inner.release().await;
        self.end(&item).await;
        result
    }
}

impl<Q: Queue> Drop for ControllerLease<Q> {
    fn drop(&mut self) {
        // Dropped without `done` or `release` (an aborted worker task): the queue's lease
        // does what its backend does on drop; the controller only stops watching the key.
        if let Some(lease) = self.lease.take() {
            let item = lease.item().clone();
            drop(lease);
            self.gate.ended(&item);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use workq::WorkQueue;

    use super::*;

    fn gate() -> Gate<&'static str> {
        Gate::new(watch::channel(true).1, Instruments::new("gate-tests"), None)
    }

    /// The in-memory queue as a backend whose steps `Workers` batch (as on a server), with
    /// the trait's default `done_and_next_many`.
    #[derive(Clone)]
    struct Batched(WorkQueue<&'static str>);

    impl Queue for Batched {
        type Item = &'static str;
        type Lease = workq::Lease<&'static str>;
        type Error = Infallible;

        fn name(&self) -> Option<&str> {
            None
        }

        fn add_with(
            &self,
            item: &'static str,
            options: AddOptions,
        ) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::add_with(&self.0, item, options)
        }

        fn forget(
            &self,
            item: &&'static str,
        ) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::forget(&self.0, item)
        }

        fn num_requeues(
            &self,
            item: &&'static str,
        ) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::num_requeues(&self.0, item)
        }

        fn len(&self) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::len(&self.0)
        }

        fn get(&self) -> impl Future<Output = Result<Option<Self::Lease>, Infallible>> + Send {
            Queue::get(&self.0)
        }

        fn done_and_next(
            &self,
            lease: Self::Lease,
            forget: bool,
        ) -> impl Future<Output = Result<Option<Self::Lease>, Infallible>> + Send {
            Queue::done_and_next(&self.0, lease, forget)
        }

        fn batch_limit(&self) -> usize {
            8
        }

        fn steps_in_flight(&self) -> usize {
            1
        }

        /// A backend's own record (the default would answer from the process's table), so
        /// that a test sees a `ControllerQueue` forward to it.
        fn upsert_schedule(
            &self,
            update: workq::periodic::ScheduleUpdate,
        ) -> impl Future<Output = Result<workq::periodic::ScheduleInfo, Infallible>> + Send
        {
            let mut info = workq::periodic::ScheduleInfo::new(update.name, update.now);
            info.spec = "batched".to_owned();
            std::future::ready(Ok(info))
        }

        /// A backend's own claim: every tick is paused here.
        fn add_on_tick(
            &self,
            _claim: workq::periodic::TickClaim,
            _item: &'static str,
            _options: AddOptions,
        ) -> impl Future<Output = Result<workq::periodic::TickOutcome, Infallible>> + Send {
            std::future::ready(Ok(workq::periodic::TickOutcome::Paused))
        }

        fn shut_down(&self) -> Vec<&'static str> {
            Queue::shut_down(&self.0)
        }

        fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::shut_down_with_drain(&self.0)
        }

        fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::is_shutting_down(&self.0)
        }
    }

    #[tokio::test]
    async fn periodic_schedules_go_to_the_queue_behind_the_controller() {
        use std::time::SystemTime;
        use workq::periodic::{ScheduleUpdate, TickClaim, TickOutcome};
        let queue = ControllerQueue::new(Batched(WorkQueue::new()), Arc::new(gate()));
        let now = SystemTime::UNIX_EPOCH;
        let info = queue
            .upsert_schedule(ScheduleUpdate::read("nightly", now))
            .await
            .unwrap();
        assert_eq!(info.spec, "batched");
        let claim = TickClaim::new("nightly", "every 1h", now, None, now);
        let outcome = queue
            .add_on_tick(claim, "a", AddOptions::default())
            .await
            .unwrap();
        assert_eq!(outcome, TickOutcome::Paused);
    }

    #[tokio::test]
    async fn a_batched_step_releases_a_cancelled_attempt_and_adds_what_was_held() {
        let inner = Batched(WorkQueue::new());
        let queue = ControllerQueue::new(inner.clone(), Arc::new(gate()));
        assert_eq!(Queue::batch_limit(&queue), 8);
        assert_eq!(Queue::steps_in_flight(&queue), 1);
        for key in ["a", "b", "c"] {
            inner.0.add(key);
        }
        let a = Queue::get(&queue).await.unwrap().unwrap();
        let b = Queue::get(&queue).await.unwrap().unwrap();
        // a's attempt was cancelled by a forced stop; b's succeeded, and its object changed
        // while it ran.
        queue.gate.finished(&"a", Attempt::Cancelled);
        queue.gate.saw(&"b", SPEC);
        assert_eq!(queue.gate.admit(&"b", Cause::Related, 0), Admit::Hold);
        queue.gate.finished(&"b", Attempt::Succeeded);
        let DoneMany { done, next } =
            Queue::done_and_next_many(&queue, vec![(a, false), (b, false)], 2)
                .await
                .unwrap();
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(Result::is_ok));
        // a was handed back before the step and b done in it, which took one item (one per
        // lease it completed, with the trait's default step); b's held event added it again
        // once its lease ended, behind the rest. Every key is handed out again once.
        assert_eq!(next.len(), 1);
        let mut handed: Vec<&str> = next.iter().map(|lease| *lease.item()).collect();
        // The step's lease runs under the controller's watch.
        assert_eq!(queue.gate.admit(&handed[0], Cause::Related, 0), Admit::Hold);
        assert_eq!(inner.0.len() + inner.0.processing_len(), 3);
        while !inner.0.is_empty() {
            handed.push(*Queue::get(&queue).await.unwrap().unwrap().item());
        }
        assert_eq!(handed.last(), Some(&"b"));
        handed.sort_unstable();
        assert_eq!(handed, ["a", "b", "c"]);
    }

    /// The in-memory queue as a shared backend whose leases can be lost: a lease on an item
    /// in `lost` was taken back (it expired and the item is another holder's), and the
    /// queue's steps refuse it whole, as Redis and PostgreSQL fence a stale holder.
    #[derive(Clone)]
    struct Fenced {
        queue: WorkQueue<&'static str>,
        lost: Arc<Mutex<Vec<&'static str>>>,
    }

    /// A fenced step's refusal.
    #[derive(Debug)]
    struct LeaseLost;

    impl fmt::Display for LeaseLost {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the lease was lost")
        }
    }

    impl std::error::Error for LeaseLost {}

    #[derive(Debug)]
    struct FencedLease(workq::Lease<&'static str>);

    impl QueueLease for FencedLease {
        type Item = &'static str;
        type Error = LeaseLost;

        fn item(&self) -> &&'static str {
            self.0.item()
        }

        fn priority(&self) -> i32 {
            self.0.priority()
        }

        async fn done(self) -> Result<(), LeaseLost> {
            self.0.done();
            Ok(())
        }

        async fn release(self) -> Result<bool, LeaseLost> {
            Ok(QueueLease::release(self.0)
                .await
                .unwrap_or_else(|never| match never {}))
        }
    }

    impl Fenced {
        fn is_lost(&self, item: &&'static str) -> bool {
            self.lost.lock().contains(item)
        }
    }

    impl Queue for Fenced {
        type Item = &'static str;
        type Lease = FencedLease;
        type Error = LeaseLost;

        fn name(&self) -> Option<&str> {
            None
        }

        async fn add_with(
            &self,
            item: &'static str,
            options: AddOptions,
        ) -> Result<bool, LeaseLost> {
            Ok(Queue::add_with(&self.queue, item, options)
                .await
                .unwrap_or_else(|never| match never {}))
        }

        async fn forget(&self, item: &&'static str) -> Result<(), LeaseLost> {
            self.queue.forget(item);
            Ok(())
        }

        async fn num_requeues(&self, item: &&'static str) -> Result<usize, LeaseLost> {
            Ok(self.queue.num_requeues(item))
        }

        async fn len(&self) -> Result<usize, LeaseLost> {
            Ok(self.queue.len())
        }

        async fn get(&self) -> Result<Option<FencedLease>, LeaseLost> {
            Ok(self.queue.get().await.map(FencedLease))
        }

        /// Fenced: a lost lease changes nothing.
        async fn retry_and_done(
            &self,
            lease: FencedLease,
            options: AddOptions,
            forget: bool,
        ) -> Result<Option<FencedLease>, LeaseLost> {
            if self.is_lost(lease.item()) {
                // The holder's claim is gone; the test stands in for the new holder.
                std::mem::forget(lease);
                return Err(LeaseLost);
            }
            let back = Queue::retry_and_done(&self.queue, lease.0, options, forget)
                .await
                .unwrap_or_else(|never| match never {});
            Ok(back.map(FencedLease))
        }

        fn is_lease_lost(_: &LeaseLost) -> bool {
            true
        }

        fn shut_down(&self) -> Vec<&'static str> {
            Queue::shut_down(&self.queue)
        }

        async fn shut_down_with_drain(&self) -> Result<(), LeaseLost> {
            self.queue.shut_down_with_drain().await;
            Ok(())
        }

        async fn is_shutting_down(&self) -> Result<bool, LeaseLost> {
            Ok(self.queue.is_shutting_down())
        }
    }

    #[tokio::test]
    async fn a_stale_holders_retry_goes_to_the_fenced_step_and_changes_nothing() {
        let inner = Fenced {
            queue: WorkQueue::new(),
            lost: Arc::default(),
        };
        let queue = ControllerQueue::new(inner.clone(), Arc::new(gate()));
        inner.queue.add("web");
        let stale = Queue::get(&queue).await.unwrap().unwrap();
        queue.gate.finished(&"web", Attempt::FailedBackoff);
        // Its lease expired meanwhile: the item is another holder's.
        inner.lost.lock().push("web");
        let error =
            Queue::retry_and_done(&queue, stale, AddOptions::default().rate_limited(), false)
                .await
                .expect_err("the fenced step refuses a lost lease");
        assert!(<ControllerQueue<Fenced> as Queue>::is_lease_lost(&error));
        // No failure counted, nothing queued, and the controller does not take the key for
        // one backing off here.
        assert_eq!(inner.queue.num_requeues(&"web"), 0);
        assert_eq!(inner.queue.len() + inner.queue.delayed_len(), 0);
        assert_eq!(queue.gate.backing_off(), 0);
        assert_eq!(queue.gate.admit(&"web", Cause::Related, 0), Admit::Add);

        // The holder's own retry goes through the same step, and is noted as backing off.
        inner.queue.add("db");
        let held = Queue::get(&queue).await.unwrap().unwrap();
        queue.gate.finished(&"db", Attempt::FailedBackoff);
        let back = Queue::retry_and_done(&queue, held, AddOptions::default().rate_limited(), false)
            .await
            .unwrap();
        assert!(back.is_none());
        assert_eq!(inner.queue.num_requeues(&"db"), 1);
        assert_eq!(queue.gate.backing_off(), 1);
    }

    const SPEC: Spec = Spec {
        generation: Some(1),
        deleting: false,
    };

    #[test]
    fn events_during_a_successful_attempt_are_added_when_it_ends() {
        let gate = gate();
        assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Add);
        gate.started(&"web");
        gate.saw(&"web", SPEC);
        assert_eq!(gate.admit(&"web", Cause::Object(SPEC), -100), Admit::Hold);
        assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Hold);
        gate.finished(&"web", Attempt::Succeeded);
        assert_eq!(gate.ended(&"web"), Some(0), "the highest held priority");
        assert_eq!(gate.admit(&"web", Cause::Object(SPEC), 0), Admit::Add);
    }

    #[test]
    fn a_failed_key_defers_its_own_writes_until_the_retry_starts() {
        let gate = gate();
        gate.started(&"web");
        gate.saw(&"web", SPEC);
        // The status write of the failing attempt arrives while it runs: held, then dropped.
        assert_eq!(gate.admit(&"web", Cause::Object(SPEC), 0), Admit::Hold);
        gate.finished(&"web", Attempt::FailedBackoff);
        gate.retry_added(&"web");
        assert_eq!(gate.ended(&"web"), None);
        assert_eq!(gate.backing_off(), 1);
        // ... or after it ended: checked against the queue's failure count.
        assert_eq!(gate.admit(&"web", Cause::Object(SPEC), 0), Admit::Verify);
        assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Verify);
        // A new generation (a spec change, maybe the fix) and a deletion cut it short.
        let fixed = Spec {
            generation: Some(2),
            ..SPEC
        };
        assert_eq!(gate.admit(&"web", Cause::Object(fixed), 0), Admit::Add);
        assert_eq!(gate.admit(&"web", Cause::Deleted, 0), Admit::Add);
        let deleting = Spec {
            deleting: true,
            ..SPEC
        };
        assert_eq!(gate.admit(&"web", Cause::Object(deleting), 0), Admit::Add);
        // The retry starts: running again.
        gate.started(&"web");
        assert_eq!(gate.backing_off(), 0);
    }

    #[test]
    fn a_spec_change_during_an_attempt_is_added_at_once() {
        let gate = gate();
        gate.started(&"web");
        gate.saw(&"web", SPEC);
        let changed = Spec {
            generation: Some(2),
            ..SPEC
        };
        assert_eq!(gate.admit(&"web", Cause::Object(changed), 0), Admit::Add);
    }

    #[test]
    fn a_give_up_or_a_refused_retry_leaves_nothing_behind() {
        let gate = gate();
        for attempt in [
            Attempt::GaveUp,
            Attempt::FailedBackoff,
            Attempt::Cancelled,
            Attempt::Pending,
        ] {
            gate.started(&"web");
            assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Hold);
            gate.finished(&"web", attempt);
            assert_eq!(gate.ended(&"web"), None, "{attempt:?}");
            assert_eq!(
                gate.admit(&"web", Cause::Related, 0),
                Admit::Add,
                "{attempt:?}"
            );
        }
    }

    #[test]
    fn a_fixed_delay_retry_defers_until_it_is_long_overdue() {
        let gate = gate();
        gate.started(&"web");
        gate.finished(&"web", Attempt::FailedAfter(Duration::from_secs(60)));
        gate.retry_added(&"web");
        gate.ended(&"web");
        assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Defer);

        gate.started(&"web");
        gate.finished(&"web", Attempt::FailedAfter(Duration::ZERO));
        gate.retry_added(&"web");
        gate.ended(&"web");
        // Due long ago in this process's eyes: the retry ran elsewhere.
        if let Some(KeyState::BackingOff { retry, .. }) = gate.keys.lock().get_mut(&"web") {
            *retry = Retry::At(Some(Instant::now() - 2 * RETRY_GRACE));
        }
        assert_eq!(gate.admit(&"web", Cause::Related, 0), Admit::Add);
        assert_eq!(gate.backing_off(), 0);
    }
}
