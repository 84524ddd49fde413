//! [`RedisQueue`] as a [`workq::Queue`]: the backend [`workq::Workers`] run on.
//!
//! Each trait method is the queue's own method of the same name; what differs from the
//! in-memory queue is what docs/api-contract.md says of backends beyond one process:
//!
//! - a lease dropped without [`done`](QueueLease::done) is released, so the worker loop ends
//!   every lease explicitly;
//! - [`shut_down`](Queue::shut_down) stops this handle only, touches no server, and drops
//!   nothing: delayed items stay on the server for the other processes;
//! - every call may fail with an [`Error`] once the server has been unreachable past the
//!   [retry deadline](crate::Builder::retry_deadline).

use std::future::Future;
use std::hash::Hash;

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::{AddKind, AddOptions, DoneMany, Queue, QueueLease};

use crate::error::Error;
use crate::lease::Lease;
use crate::queue::RedisQueue;

/// The most leases one batched step of [`Workers`](workq::Workers) completes and takes
/// (one script run; its cost per item falls with the batch, and the run blocks the server
/// for about 10 us per item).
const BATCH_LIMIT: usize = 64;

impl<T> Queue for RedisQueue<T>
where
    T: Serialize + DeserializeOwned + Eq + Hash + Clone + Send + Sync + 'static,
{
    type Item = T;
    type Lease = Lease<T>;
    type Error = Error;

    /// [`Error::LeaseLost`]: the server refused the call because the lease expired and was
    /// reclaimed (the item may be another worker's now); it changed nothing.
    fn is_lease_lost(error: &Error) -> bool {
        error.is_lease_lost()
    }

    fn name(&self) -> Option<&str> {
        Some(RedisQueue::name(self))
    }

    /// [`RedisQueue::add_with`]: every option (delay, rate limiting, priority), with the
    /// in-memory queue's rules.
    ///
    /// # Errors
    ///
    /// As for [`RedisQueue::add`].
    async fn add_with(&self, item: T, options: AddOptions) -> Result<bool, Error> {
        let added = RedisQueue::add_with(self, &item, options).await?;
        Ok(added.kind != AddKind::Ignored)
    }

    /// All the adds in one round trip, 200 per run of the `add_many` script (as
    /// [`RedisQueue::add_all`] does), each with the options' delay and priority. Rate-limited
    /// adds go one by one, in the batch's order, since each asks the rate limiter on the
    /// server: the token bucket is spent in that order, and each item gets the delay, failure
    /// count and priority that [`RedisQueue::add_with`] of it alone gives. Each add is one
    /// script run, so none waits on a lock another holds (a concurrent add or step cannot
    /// deadlock with it). A shut-down handle or fleet stops the batch at the first refused add.
    ///
    /// # Errors
    ///
    /// As for [`RedisQueue::add_all`]: on an error, any prefix of the adds may have been
    /// applied.
    async fn add_all_with(&self, items: Vec<T>, options: AddOptions) -> Result<usize, Error> {
        if options.is_rate_limited() {
            let mut accepted = 0;
            for item in items {
                if !Queue::add_with(self, item, options).await? {
                    break;
                }
                accepted += 1;
            }
            return Ok(accepted);
        }
        let (delay, priority) = (options.delay(), options.requested_priority());
        let added = self
            .add_many(items.iter().map(|item| (item, delay, priority)))
            .await?;
        Ok(added
            .iter()
            .filter(|added| added.kind != AddKind::Ignored)
            .count())
    }

    /// The re-add and the `done` in one script run, fenced by the lease's token: a stale
    /// holder changes nothing (no failure counted, nothing forgotten or re-added) and gets
    /// [`Error::LeaseLost`]. The re-add is what [`RedisQueue::add_with`] makes of `options`
    /// (the server-side rate limiter's delay and failure count, a delay, a priority), made
    /// while the item is processed, so it is queued (or waits for its delay) once the lease
    /// ends. `Ok(Some(lease))` when this handle or the whole queue is shut down: nothing
    /// changed. Transient server states are retried as a `done` retries them.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`]; [`Error::OutcomeUnknown`] when a retry after a lost answer found
    /// the lease gone (the first attempt may have applied; it is never applied twice); an
    /// error that is not transient, or a transient state past the retries, after which the
    /// item is handed out again once its lease expires.
    fn retry_and_done(
        &self,
        lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        RedisQueue::retry_and_done(self, lease, options, forget)
    }

    fn forget(&self, item: &T) -> impl Future<Output = Result<(), Error>> + Send {
        RedisQueue::forget(self, item)
    }

    fn num_requeues(&self, item: &T) -> impl Future<Output = Result<usize, Error>> + Send {
        RedisQueue::num_requeues(self, item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Error>> + Send {
        RedisQueue::len(self)
    }

    fn get(&self) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        RedisQueue::get(self)
    }

    /// The forget, the done and the next hand-out in one round trip and one script run
    /// ([`RedisQueue::done_and_get`]).
    ///
    /// # Errors
    ///
    /// As for [`RedisQueue::done_and_get`]; a lease the call took is released.
    fn done_and_next(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        RedisQueue::done_and_get(self, lease, forget)
    }

    /// Every lease's forget and done, and up to `max` hand-outs, in one round trip and one
    /// script run ([`RedisQueue::done_and_get_many`]).
    ///
    /// # Errors
    ///
    /// As for [`RedisQueue::done_and_get_many`].
    fn done_and_next_many(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> impl Future<Output = Result<DoneMany<Lease<T>, Error>, Error>> + Send {
        RedisQueue::done_and_get_many(self, leases, max)
    }

    /// 64: a step costs a round trip and a script run whatever its size, and a run blocks
    /// the server for about 10 us per item.
    fn batch_limit(&self) -> usize {
        BATCH_LIMIT
    }

    /// The schedule's record in the queue's `periodic` hash, in one script run (see
    /// `periodic.rs`).
    fn upsert_schedule(
        &self,
        update: workq::periodic::ScheduleUpdate,
    ) -> impl Future<Output = Result<workq::periodic::ScheduleInfo, Error>> + Send {
        self.upsert_periodic(update)
    }

    /// The claim of the tick and the add in one script run (see `periodic.rs`).
    async fn add_on_tick(
        &self,
        claim: workq::periodic::TickClaim,
        item: T,
        options: AddOptions,
    ) -> Result<workq::periodic::TickOutcome, Error> {
        self.add_on_periodic_tick(claim, &item, options).await
    }

    /// Stops this handle ([`RedisQueue::shut_down`]); the queue on the server goes on for the
    /// other processes, so nothing is dropped.
    fn shut_down(&self) -> Vec<T> {
        RedisQueue::shut_down(self);
        Vec::new()
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Error>> + Send {
        RedisQueue::shut_down_with_drain(self)
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Error>> + Send {
        RedisQueue::is_shutting_down(self)
    }
}

impl<T> QueueLease for Lease<T>
where
    T: Send + Sync + 'static,
{
    type Item = T;
    type Error = Error;

    fn item(&self) -> &T {
        Lease::item(self)
    }

    /// [`Lease::priority`]: the priority the item was handed out with.
    fn priority(&self) -> i32 {
        Lease::priority(self)
    }

    fn done(self) -> impl Future<Output = Result<(), Error>> + Send {
        Lease::done(self)
    }

    /// [`Lease::release`]: the server takes the item back and hands it out again, so the
    /// queue always still holds it (`Ok(true)`), also when the lease was lost already (the
    /// server reclaimed the item).
    async fn release(self) -> Result<bool, Error> {
        match Lease::release(self).await {
            Ok(()) | Err(Error::LeaseLost) => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// [`Lease::links`]: the adds' trace contexts the server kept beside the item.
    #[cfg(feature = "otel")]
    fn links(&self) -> &[workq::otel::TraceLink] {
        Lease::links(self)
    }

    /// [`Lease::links_dropped`].
    #[cfg(feature = "otel")]
    fn links_dropped(&self) -> u32 {
        Lease::links_dropped(self)
    }
}
