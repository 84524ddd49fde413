//! [`PgQueue`] as a [`workq::Queue`]: the backend [`workq::Workers`] run on.
//!
//! Each trait method is the queue's own method of the same name, with what docs/api-contract.md
//! says of backends beyond one process: a lease dropped without `done` is released; `shut_down`
//! stops this handle only and drops nothing (delayed items stay in the database).

use std::future::Future;
use std::hash::Hash;

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::{AddOptions, DoneMany, Queue, QueueLease};

use crate::error::Error;
use crate::lease::Lease;
use crate::queue::PgQueue;

impl<T> Queue for PgQueue<T>
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
        Some(PgQueue::name(self))
    }

    async fn add_with(&self, item: T, options: AddOptions) -> Result<bool, Error> {
        let added = PgQueue::add_with(self, &item, options).await?;
        Ok(added.accepted())
    }

    /// [`PgQueue::add_all_with`]: one statement (and one commit) per thousand items, with the
    /// rules of adding them one by one, rate-limited ones included.
    async fn add_all_with(&self, items: Vec<T>, options: AddOptions) -> Result<usize, Error> {
        let added = PgQueue::add_all_with(self, items.iter().map(|item| (item, options))).await?;
        Ok(added.iter().filter(|added| added.accepted()).count())
    }

    fn forget(&self, item: &T) -> impl Future<Output = Result<(), Error>> + Send {
        PgQueue::forget(self, item)
    }

    fn num_requeues(&self, item: &T) -> impl Future<Output = Result<usize, Error>> + Send {
        PgQueue::num_requeues(self, item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Error>> + Send {
        PgQueue::len(self)
    }

    fn get(&self) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        PgQueue::get(self)
    }

    /// [`PgQueue::retry_and_done`]: the forget, the re-add and the done in one statement,
    /// fenced by the lease's token, so a stale holder changes nothing.
    fn retry_and_done(
        &self,
        lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        PgQueue::retry_and_done(self, lease, options, forget)
    }

    /// [`PgQueue::done_and_get`]: the done (after the forget) and the next ready item in one
    /// round trip and one commit.
    fn done_and_next(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        PgQueue::done_and_get(self, lease, forget)
    }

    /// [`PgQueue::done_and_get_many`] with a forget per lease: the steps of many workers in
    /// one statement and one commit.
    async fn done_and_next_many(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> Result<DoneMany<Lease<T>, Error>, Error> {
        PgQueue::done_and_get_many(self, leases, max).await
    }

    /// A step of many leases is one statement and one commit, instead of one each.
    fn batch_limit(&self) -> usize {
        64
    }

    /// One step at a time: each ends in a commit that waits for the disk, so a step that
    /// carries the `done`s that came meanwhile costs less than a second step beside it (W7,
    /// 16 workers, 1 ms handler: 6.0 k items/s against 5.0 k with two). A pool of more
    /// than 64 workers keeps more (see [`Queue::steps_in_flight`]).
    fn steps_in_flight(&self) -> usize {
        1
    }

    /// The schedule's row in `workqueue_schedules`, in one call (see `periodic.rs`).
    async fn upsert_schedule(
        &self,
        update: workq::periodic::ScheduleUpdate,
    ) -> Result<workq::periodic::ScheduleInfo, Error> {
        self.upsert_periodic(update).await
    }

    /// The claim of the tick and the add in one transaction (see `periodic.rs`).
    async fn add_on_tick(
        &self,
        claim: workq::periodic::TickClaim,
        item: T,
        options: AddOptions,
    ) -> Result<workq::periodic::TickOutcome, Error> {
        self.add_on_periodic_tick(claim, &item, options).await
    }

    /// Stops this handle; the queue goes on for the other processes, so nothing is dropped.
    fn shut_down(&self) -> Vec<T> {
        PgQueue::shut_down(self);
        Vec::new()
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Error>> + Send {
        PgQueue::shut_down_with_drain(self)
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Error>> + Send {
        PgQueue::is_shutting_down(self)
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

    fn priority(&self) -> i32 {
        Lease::priority(self)
    }

    fn done(self) -> impl Future<Output = Result<(), Error>> + Send {
        Lease::done(self)
    }

    /// The database takes the item back and hands it out again, so the queue still holds it
    /// (`Ok(true)`), also when the lease was lost already (the item was reclaimed).
    async fn release(self) -> Result<bool, Error> {
        match Lease::release(self).await {
            Ok(()) | Err(Error::LeaseLost) => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// [`Lease::links`]: the adds' trace contexts kept in the item's row.
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
