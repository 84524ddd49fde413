//! [`Lease`]: an item handed out by a [`PgQueue`](crate::PgQueue), with its fencing token.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use workq::lease_clock::{Held, LeaseBackend, LeaseClock, Renewal};

use crate::error::Error;
use crate::inner::Inner;
use crate::key::Claim;
use crate::trace::LeaseLinks;
use crate::units::deadline_after;

/// The claim on one item while a worker processes it: client-go's item between `Get` and
/// `Done`, made to survive crashes.
///
/// A lease lasts the queue's [lease duration](crate::Builder::lease_duration) on the
/// **database's** clock and is renewed in the background while held. If its holder dies,
/// stalls or loses the database for longer than that, the next `get` in any process reclaims
/// the item and hands it out again.
///
/// Every lease carries a **fencing token** from the queue's sequence: unique, and larger for
/// later hand-outs. `done`, renewals and releases are accepted only while the token is the
/// item's current one, so a holder that lost its lease can neither mark the item done nor
/// clear the claim of the worker that has it now. Pass it downstream for end-to-end fencing.
///
/// # Only `done` marks an item done
///
/// **Dropping a lease without [`done`](Self::done) releases the item**: it is handed out again
/// at once (at the head of the queue), and no stall is counted. So an aborted task, a
/// `select!` or `timeout` around the handler, an early return or a panic never turns
/// unfinished work into finished work. The release is sent in the background on the tokio
/// runtime the lease was handed out on; without one, the lease expires as after a crash.
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
        claim: Claim,
        priority: i32,
        sent: Instant,
        links: LeaseLinks,
    ) -> Self {
        Lease {
            item,
            priority,
            held: Held::new(queue, raw, claim, sent),
            links,
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The lease's fencing token: unique per hand-out, and larger for later hand-outs.
    pub fn token(&self) -> u64 {
        self.held.token().token.unsigned_abs()
    }

    /// The priority the item was handed out with (0 for an item never given one).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The item as stored (its JSON text).
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
    /// [`MAX_LINKS`](workq::otel::MAX_LINKS) already (feature `otel`). Not every such add:
    /// a duplicate add whose item holds its 4 links already writes nothing, to keep that
    /// path free of writes, and is not counted; only the adds beyond the 4 that wrote the
    /// row anyway are (those of one batch, a release's links put in front).
    #[cfg(feature = "otel")]
    pub fn links_dropped(&self) -> u32 {
        self.links.dropped
    }

    /// Whether the lease is (or may be) lost: the database refused a renewal, or renewals
    /// failed for so long that the item may have been reclaimed.
    pub fn is_lost(&self) -> bool {
        self.held.clock().is_lost()
    }

    /// Until when this process is sure the lease is valid (its monotonic clock).
    pub fn valid_until(&self) -> Instant {
        self.held.clock().valid_until()
    }

    /// Completes when the lease is lost (see [`is_lost`](Self::is_lost)).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held.clock().lost()
    }

    /// Renews the lease now: it lasts the lease duration from now on the database's clock.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease is no longer this holder's; a database error.
    pub async fn renew(&self) -> Result<(), Error> {
        let queue = self.held.backend();
        let deadline = deadline_after(queue.lease);
        renew_once(queue, self.held.token(), self.held.clock(), deadline).await
    }

    /// Marks the item done: client-go's `Done`. If it was re-added while processing it is
    /// queued again.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost (nothing changed); [`Error::OutcomeUnknown`]
    /// if the connection failed and a retry found the lease gone.
    pub async fn done(mut self) -> Result<(), Error> {
        // Renewed until the outcome is known: a done that waits for the item's row (another
        // transaction holds it) and is retried (a lock timeout) keeps its lease meanwhile.
        let held = &self.held;
        let outcome = held.backend().finish(held.token(), false, false).await;
        self.held.finish();
        outcome
    }

    /// Lets go of the item without marking it done, and waits for the database to take it
    /// back: what dropping the lease does in the background.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost already; as for [`done`](Self::done).
    pub async fn release(mut self) -> Result<(), Error> {
        let held = &self.held;
        let outcome = held.backend().finish(held.token(), true, false).await;
        self.held.finish();
        outcome
    }

    /// The lease's claim, while it goes on being renewed (for a call whose outcome decides
    /// whether the lease ends).
    pub(crate) fn claim(&self) -> Claim {
        self.held.token()
    }

    /// Stops renewing, for a call that ends the lease itself
    /// ([`PgQueue::done_and_get`](crate::PgQueue::done_and_get)); the lease's claim. The
    /// lease still counts as out (for a drain) until it is dropped.
    pub(crate) fn finish_for_call(&mut self) -> Claim {
        self.held.finish();
        self.held.token()
    }

    /// Lets go of the item without a release, as a crashed worker would: it is handed out
    /// again once the lease expires. For tests and for stopping a worker fast.
    pub fn abandon(mut self) {
        self.held.finish();
    }
}

/// One renewal: the clock learns the answer.
async fn renew_once(
    queue: &Inner,
    claim: Claim,
    clock: &LeaseClock,
    deadline: Instant,
) -> Result<(), Error> {
    let sent = Instant::now();
    if queue.renew(claim, deadline).await? {
        clock.renewed(sent, queue.lease);
        Ok(())
    } else {
        clock.lose();
        Err(Error::LeaseLost)
    }
}

impl LeaseBackend for Inner {
    type Token = Claim;

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

    /// One renewal on its way per lease ([`Inner::renewal`]), awaited for half the time the
    /// caller gives. If it is still waiting then (for the item's row, which another
    /// transaction holds, most likely), the lease counts as renewed when the row, read
    /// without waiting, still carries it: nobody can take the item while the renewal waits in
    /// the row's queue, and the renewal takes the row first once it is free.
    async fn renew(
        &self,
        raw: &str,
        claim: Claim,
        clock: &LeaseClock,
        deadline: Instant,
    ) -> Renewal {
        let Some(mut on_its_way) = self.renewal(claim) else {
            return Renewal::Failed;
        };
        let patience = deadline.saturating_duration_since(Instant::now()) / 2;
        let answer = tokio::time::timeout(patience, on_its_way.wait_for(Option::is_some))
            .await
            .map(|answer| answer.map(|answer| answer.clone()));
        let failed = |error: &dyn std::fmt::Display| {
            tracing::warn!(queue = %self.name, item = %raw, %error, "workq-postgres: lease renewal failed");
            Renewal::Failed
        };
        match answer {
            Ok(Ok(Some((sent, Ok(true))))) => {
                clock.renewed(sent, self.lease);
                Renewal::Renewed
            }
            Ok(Ok(Some((_, Ok(false))))) => {
                clock.lose();
                Renewal::Lost
            }
            Ok(Ok(Some((_, Err(error))))) => failed(&error),
            Ok(Ok(None) | Err(_)) => failed(&"the renewal task stopped"),
            Err(_) => {
                let sent = Instant::now();
                match tokio::time::timeout(patience, self.still_holds(claim)).await {
                    Ok(Ok(true)) => {
                        clock.renewed(sent, self.lease);
                        Renewal::Renewed
                    }
                    Ok(Ok(false)) => {
                        clock.lose();
                        Renewal::Lost
                    }
                    Ok(Err(error)) => failed(&error),
                    Err(_) => failed(&"no answer in time"),
                }
            }
        }
    }

    fn held_too_long(&self, raw: &str) {
        tracing::warn!(queue = %self.name, item = %raw, max_hold = ?self.max_hold,
            "workq-postgres: a lease was held for the maximum hold time; renewal stops and it will expire");
    }

    async fn release_dropped(self: Arc<Self>, raw: String, claim: Claim) {
        if let Err(error) = self.finish(claim, true, false).await
            && !error.is_lease_lost()
        {
            tracing::warn!(queue = %self.name, item = %raw, %error,
                "workq-postgres: releasing a dropped lease failed; it will expire");
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

impl<T> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("item", &self.held.raw())
            .field("token", &self.held.token().token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
