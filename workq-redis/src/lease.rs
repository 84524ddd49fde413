//! [`Lease`]: an item handed out by a [`RedisQueue`](crate::RedisQueue), with its fencing token.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use workq::lease_clock::{Held, LeaseBackend, LeaseClock, Renewal};

use crate::error::Error;
use crate::inner::Inner;
use crate::trace::LeaseLinks;

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
    priority: i32,
    held: Held<Inner>,
    /// The trace links the hand-out took (feature `otel`; no room without it).
    #[cfg_attr(
        not(feature = "otel"),
        expect(dead_code, reason = "read by `links` with the feature `otel`")
    )]
    links: LeaseLinks,
}

impl<T> Lease<T> {
    pub(crate) fn new(
        queue: Arc<Inner>,
        item: T,
        raw: String,
        token: u64,
        priority: i32,
        sent: Instant,
        links: LeaseLinks,
    ) -> Self {
        Lease {
            item,
            priority,
            held: Held::new(queue, raw, token, sent),
            links,
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The lease's fencing token: unique per hand-out, and larger for later hand-outs of the
    /// queue.
    pub fn token(&self) -> u64 {
        self.held.token()
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
        self.held.raw()
    }

    /// The trace contexts of the adds that queued the item since it was last handed out, in
    /// the order of the adds, from any process: at most
    /// [`MAX_LINKS`](workq::otel::MAX_LINKS), the first ones (feature `otel`; see
    /// [`workq::otel`]). [`workq::Workers`] link the item's `workqueue.item` span to each.
    /// A lease released or lost gives them back to the item, so its next holder links to
    /// them too.
    #[cfg(feature = "otel")]
    pub fn links(&self) -> &[workq::otel::TraceLink] {
        &self.links.list
    }

    /// How many adds' trace contexts were dropped because the item held
    /// [`MAX_LINKS`](workq::otel::MAX_LINKS) already (feature `otel`).
    #[cfg(feature = "otel")]
    pub fn links_dropped(&self) -> u32 {
        self.links.dropped
    }

    /// Whether the lease is (or may be) lost: the server refused a renewal, or renewals failed
    /// for so long that the server may have reclaimed the item. Work done after this turns
    /// `true` may overlap with another worker's; its `done` will be refused.
    pub fn is_lost(&self) -> bool {
        self.held.clock().is_lost()
    }

    /// Until when this process is sure the lease is valid (its monotonic clock).
    pub fn valid_until(&self) -> Instant {
        self.held.clock().valid_until()
    }

    /// Completes when the lease is lost (see [`is_lost`](Self::is_lost)); never completes
    /// while it is renewed. Race your work against it to stop when it is.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held.clock().lost()
    }

    /// Renews the lease now: it lasts the lease duration from now on the server's clock.
    /// Leases renew themselves unless the queue was built with
    /// [`auto_renew(false)`](crate::Builder::auto_renew).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease is no longer this holder's; a connection error.
    pub async fn renew(&self) -> Result<(), Error> {
        let queue = self.held.backend();
        let deadline = crate::units::from_now(queue.lease);
        renew_once(
            queue,
            self.held.raw(),
            self.held.token(),
            self.held.clock(),
            deadline,
        )
        .await
    }

    /// Marks the item done: client-go's `Done`. If it was re-added while processing it is
    /// queued again. The only way to mark an item done (dropping a lease releases it).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost: the server changed nothing (the item was
    /// reclaimed and is, or will be, processed again). [`Error::OutcomeUnknown`] if the
    /// connection failed and a retry found the lease gone. Transient errors are retried while
    /// the lease may still be valid (and at least the retry deadline); the lease is renewed
    /// until the `done` is through.
    pub async fn done(self) -> Result<(), Error> {
        let held = &self.held;
        let outcome = held.backend().finish(held.raw(), held.token(), false).await;
        self.settled();
        outcome
    }

    /// Lets go of the item without marking it done, and waits for the server to take it back:
    /// what dropping the lease does in the background. The item is handed out again at once
    /// (no stall is counted) and its re-adds while processing fold into that hand-out.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost already; as for [`done`](Self::done).
    pub async fn release(mut self) -> Result<(), Error> {
        self.held.finish();
        let held = &self.held;
        held.backend().finish(held.raw(), held.token(), true).await
    }

    /// Stops renewing: the lease was ended by a call sent elsewhere (a step's `done`, a
    /// retry), or found lost. Dropped, it sends nothing.
    pub(crate) fn settled(mut self) {
        self.held.finish();
    }

    /// Lets go of the item without marking it done, as a crashed worker would: it is handed
    /// out again once the lease expires. For tests and for shutting a worker down fast.
    pub fn abandon(mut self) {
        self.held.finish();
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

impl LeaseBackend for Inner {
    type Token = u64;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn renew_every(&self) -> Duration {
        self.renew_every
    }

    fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    fn max_hold(&self) -> Duration {
        self.max_hold
    }

    async fn renew(&self, raw: &str, token: u64, clock: &LeaseClock, deadline: Instant) -> Renewal {
        match renew_once(self, raw, token, clock, deadline).await {
            Ok(()) => Renewal::Renewed,
            Err(Error::LeaseLost) => Renewal::Lost,
            Err(error) => {
                tracing::warn!(queue = %self.name, item = %raw, %error, "workq-redis: lease renewal failed");
                Renewal::Failed
            }
        }
    }

    fn held_too_long(&self, raw: &str) {
        tracing::warn!(
            queue = %self.name,
            item = %raw,
            max_hold = ?self.max_hold,
            "workq-redis: a lease was held for the maximum hold time; renewal stops and it will expire"
        );
    }

    /// Released, not done: see "Only `done` marks an item done" on [`Lease`].
    async fn release_dropped(self: Arc<Self>, raw: String, token: u64) {
        if let Err(error) = self.finish(&raw, token, true).await
            && !error.is_lease_lost()
        {
            tracing::warn!(queue = %self.name, item = %raw, %error, "workq-redis: releasing a dropped lease failed; it will expire");
        }
    }

    fn lease_started(&self) {
        Inner::lease_started(self);
    }

    fn lease_ended(&self) {
        Inner::lease_ended(self);
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

impl<T> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("item", &self.held.raw())
            .field("token", &self.held.token())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
