//! [`Lease`]: an item handed out by a [`RedisQueue`](crate::RedisQueue), with its fencing token.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use workqueue::lease_clock::{LeaseClock, Renewal, RenewalEnd, renew_while_held};

use crate::error::Error;
use crate::queue::Inner;

/// The claim on one item while a worker processes it: client-go's item between `Get` and
/// `Done`, made to survive crashes.
///
/// A lease lasts the queue's [lease duration](crate::Builder::lease_duration) on the
/// **server's** clock (so the workers' clocks do not matter) and is renewed in the background
/// while it is held. If its holder dies, stalls or loses the server for longer than that, the
/// next `get` in any process reclaims the item and hands it out again.
///
/// Every lease carries a **fencing token**, unique and increasing across the queue. `done`
/// and renewals are accepted only while the token is the item's current one, so a worker that
/// lost its lease (say it was paused past its deadline) can neither mark the item done nor
/// clear the claim of the worker that has it now. Pass the token to downstream systems that
/// can check it for end-to-end fencing.
///
/// Locally, [`is_lost`](Self::is_lost) turns `true` as soon as the server refused a renewal
/// or the lease may have run out on the server (renewals failed until the last deadline this
/// process knows of); [`lost`](Self::lost) is a future for `select!`ing the work against.
///
/// # Only `done` marks an item done
///
/// [`done`](Self::done) is the one way to mark the item done. **Dropping a lease without
/// `done` releases the item**: it is handed out again at once (at the head of the queue), its
/// re-adds while processing fold into that hand-out, and no stall is counted. So an aborted
/// task, a `select!` or `timeout` around the handler, an early `?` return or a panic never
/// turns unfinished work into finished work. (The in-memory queue's lease keeps client-go's
/// deferred `Done` on drop; a shared queue cannot tell a finished handler from a failed one.)
///
/// The release is sent in the background on the tokio runtime the lease was handed out on.
/// If that runtime is gone (the lease outlived it), nothing can be sent, and the item is
/// handed out again when the lease expires on the server, as after a crash.
/// [`abandon`](Self::abandon) lets go without a release, as a crashed worker would.
///
/// Renewal stops after the queue's [`max_hold`](crate::Builder::max_hold), so a lease that is
/// leaked or held by a deadlocked handler expires then.
pub struct Lease<T> {
    item: T,
    raw: String,
    token: u64,
    priority: i32,
    queue: Arc<Inner>,
    state: Arc<LeaseClock>,
    renewer: Option<JoinHandle<()>>,
    /// The runtime the lease was handed out on: a drop sends the release there.
    runtime: Option<tokio::runtime::Handle>,
    finished: bool,
}

impl<T> Lease<T> {
    pub(crate) fn new(
        queue: Arc<Inner>,
        item: T,
        raw: String,
        token: u64,
        priority: i32,
        sent: Instant,
    ) -> Self {
        let state = Arc::new(LeaseClock::new(sent, queue.lease));
        let renewer = queue.auto_renew.then(|| {
            tokio::spawn(renew_loop(
                queue.clone(),
                raw.clone(),
                token,
                state.clone(),
                sent + queue.max_hold,
            ))
        });
        queue.lease_started();
        Lease {
            item,
            raw,
            token,
            priority,
            queue,
            state,
            renewer,
            runtime: tokio::runtime::Handle::try_current().ok(),
            finished: false,
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The lease's fencing token: unique per hand-out, and larger for later hand-outs of the
    /// queue.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The priority the item was handed out with (see [`RedisQueue::add_with`]; 0 for an item
    /// never given one).
    ///
    /// [`RedisQueue::add_with`]: crate::RedisQueue::add_with
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The item as stored on the server (its JSON text).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether the lease is (or may be) lost: the server refused a renewal, or renewals failed
    /// for so long that the server may have reclaimed the item. Work done after this turns
    /// `true` may overlap with another worker's; its `done` will be refused.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Until when this process is sure the lease is valid (its monotonic clock).
    pub fn valid_until(&self) -> Instant {
        self.state.valid_until()
    }

    /// Completes when the lease is lost (see [`is_lost`](Self::is_lost)); never completes
    /// while it is renewed. Race your work against it to stop when it is.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.state.lost()
    }

    /// Renews the lease now: it lasts the lease duration from now on the server's clock.
    /// Leases renew themselves unless the queue was built with
    /// [`auto_renew(false)`](crate::Builder::auto_renew).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease is no longer this holder's; a connection error.
    pub async fn renew(&self) -> Result<(), Error> {
        let deadline = Instant::now() + self.queue.lease;
        renew_once(&self.queue, &self.raw, self.token, &self.state, deadline).await
    }

    /// Marks the item done: client-go's `Done`. If it was re-added while processing it is
    /// queued again. The only way to mark an item done (dropping a lease releases it).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost: the server changed nothing (the item was
    /// reclaimed and is, or will be, processed again). [`Error::OutcomeUnknown`] if the
    /// connection failed and a retry found the lease gone. Transient errors are retried while
    /// the lease may still be valid.
    pub async fn done(mut self) -> Result<(), Error> {
        self.finished = true;
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        self.queue.finish(&self.raw, self.token, false).await
    }

    /// Lets go of the item without marking it done, and waits for the server to take it back:
    /// what dropping the lease does in the background. The item is handed out again at once
    /// (no stall is counted) and its re-adds while processing fold into that hand-out.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost already; as for [`done`](Self::done).
    pub async fn release(mut self) -> Result<(), Error> {
        self.finished = true;
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        self.queue.finish(&self.raw, self.token, true).await
    }

    /// Stops renewing and takes the item's key and token, for a `done` sent elsewhere.
    pub(crate) fn finish(mut self) -> (String, u64) {
        self.finished = true;
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        (std::mem::take(&mut self.raw), self.token)
    }

    /// Lets go of the item without marking it done, as a crashed worker would: it is handed
    /// out again once the lease expires. For tests and for shutting a worker down fast.
    pub fn abandon(mut self) {
        self.finished = true;
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

async fn renew_once(
    queue: &Inner,
    raw: &str,
    token: u64,
    state: &LeaseClock,
    deadline: Instant,
) -> Result<(), Error> {
    let sent = Instant::now();
    if queue.renew(raw, token, deadline).await? {
        state.renewed(sent, queue.lease);
        Ok(())
    } else {
        state.lose();
        Err(Error::LeaseLost)
    }
}

/// Renews the lease while it is held (see [`renew_while_held`]), logging what fails.
async fn renew_loop(
    queue: Arc<Inner>,
    raw: String,
    token: u64,
    state: Arc<LeaseClock>,
    stop: Instant,
) {
    let end = renew_while_held(state.clone(), queue.renew_every, stop, |deadline| {
        let (queue, raw, state) = (&queue, &raw, &state);
        async move {
            match renew_once(queue, raw, token, state, deadline).await {
                Ok(()) => Renewal::Renewed,
                Err(Error::LeaseLost) => Renewal::Lost,
                Err(error) => {
                    tracing::warn!(queue = %queue.name, item = %raw, %error, "workqueue-redis: lease renewal failed");
                    Renewal::Failed
                }
            }
        }
    })
    .await;
    if end == RenewalEnd::MaxHold {
        tracing::warn!(
            queue = %queue.name,
            item = %raw,
            max_hold = ?queue.max_hold,
            "workqueue-redis: a lease was held for the maximum hold time; renewal stops and it will expire"
        );
    }
}

impl<T> Deref for Lease<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> AsRef<T> for Lease<T> {
    fn as_ref(&self) -> &T {
        &self.item
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if self.finished {
            self.queue.lease_ended();
            return;
        }
        // Released, not done: see "Only `done` marks an item done" above. Without a runtime
        // the lease expires on the server instead.
        let runtime = self
            .runtime
            .take()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(runtime) => {
                let queue = self.queue.clone();
                let raw = std::mem::take(&mut self.raw);
                let token = self.token;
                // A runtime that is shutting down drops the task (and so the release): the
                // lease then expires as after a crash.
                runtime.spawn(async move {
                    if let Err(error) = queue.finish(&raw, token, true).await
                        && !error.is_lease_lost()
                    {
                        tracing::warn!(queue = %queue.name, item = %raw, %error, "workqueue-redis: releasing a dropped lease failed; it will expire");
                    }
                    queue.lease_ended();
                });
            }
            None => self.queue.lease_ended(),
        }
    }
}

impl<T> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("item", &self.raw)
            .field("token", &self.token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
