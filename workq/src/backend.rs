//! [`Queue`] and [`QueueLease`]: what a work queue backend offers, so that one worker loop
//! ([`Workers`](crate::Workers)) runs on every backend.
//!
//! The trait is named for what it is: a work queue with client-go's rules, seen through the
//! operations a worker loop needs. [`WorkQueue`] (in memory) implements it, and so do the
//! backends that keep the rules across processes (`workq_redis::RedisQueue`). It is
//! async-first because a shared backend talks to a server; the in-memory queue answers every
//! call but [`get`](Queue::get) and [`shut_down_with_drain`](Queue::shut_down_with_drain) at
//! once, with futures that are ready when first polled, and its error type is
//! [`Infallible`].
//!
//! Every future the trait returns is `Send`, so a worker loop generic over a backend can run
//! on a multi-threaded runtime (`tokio::spawn`).

use std::convert::Infallible;
use std::fmt;
use std::future::{self, Future};
use std::hash::Hash;

use crate::periodic::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome, local};
use crate::{AddOptions, Lease, TryGetError, WorkQueue};

/// A work queue with client-go's rules: dedup, never two workers on one item, delays,
/// rate-limited retries, shut down. The interface every backend offers to
/// [`Workers`](crate::Workers).
///
/// The methods mirror [`WorkQueue`]'s, with the differences a backend beyond one process
/// needs: calls are async and may fail ([`Error`](Self::Error)), and the lease is the
/// backend's own ([`QueueLease`]). A type's own methods of the same name (for example
/// [`WorkQueue::add_with`], which returns nothing) take precedence in method calls; call the
/// trait's with `Queue::add_with(&queue, ...)` or through a generic parameter.
///
/// # Implementing it
///
/// A backend keeps every rule of the contract (docs/api-contract.md), and documents where a lease
/// differs: in memory a dropped lease is done (client-go's deferred `Done`); on a shared backend a
/// dropped lease is released and only [`QueueLease::done`] marks the item done. A worker loop
/// written against this trait therefore always ends a lease explicitly, with `done` or `release`.
///
/// # Examples
///
/// A worker loop for any backend:
///
/// ```
/// use workq::{AddOptions, Queue, QueueLease, WorkQueue};
///
/// async fn drain<Q: Queue<Item = String>>(queue: &Q) -> Result<usize, Q::Error> {
///     let mut processed = 0;
///     while let Some(lease) = queue.get().await? {
///         if lease.item().is_empty() {
///             // A failure: retry later, then let go of this hand-out.
///             Queue::add_with(queue, lease.item().clone(), AddOptions::default().rate_limited())
///                 .await?;
///         } else {
///             queue.forget(lease.item()).await?;
///         }
///         lease.done().await?;
///         processed += 1;
///     }
///     Ok(processed)
/// }
///
/// let queue = WorkQueue::new();
/// queue.add("default/web-0".to_owned());
/// queue.shut_down();
/// let processed = futures::executor::block_on(drain(&queue)).unwrap();
/// assert_eq!(processed, 1);
/// ```
pub trait Queue: Clone + Send + Sync + 'static {
    /// What the queue holds.
    type Item: Eq + Hash + Clone + Send + Sync + 'static;
    /// What [`get`](Self::get) hands out.
    type Lease: QueueLease<Item = Self::Item, Error = Self::Error>;
    /// Why a call failed: [`Infallible`] in memory, a connection or server error on a shared
    /// backend.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The queue's name, for logs and spans.
    fn name(&self) -> Option<&str>;

    /// Adds `item` with a delay, rate limiting and a priority as `options` say (see
    /// [`WorkQueue::add_with`]). Returns `Ok(false)` if the queue (or this handle) is shut
    /// down and ignored the add, `Ok(true)` otherwise.
    ///
    /// # Errors
    ///
    /// A backend's failure to apply the add (then whether it applied may be unknown; adding
    /// again is harmless), or options it does not support.
    fn add_with(
        &self,
        item: Self::Item,
        options: AddOptions,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Adds every item of `items`, in order, each as [`add_with`](Self::add_with) would
    /// with the same `options` (one priority, one delay for all). Returns how many adds the
    /// queue accepted: `items.len()` unless the queue (or this handle) is shut down.
    ///
    /// This is the call for many adds at once, such as the keys of a relist. The default
    /// makes one [`add_with`](Self::add_with) per item (a round trip each on a shared
    /// backend) and stops at the first refusal; a backend that can batch overrides it (Redis
    /// runs 200 adds per script call, all of them in one round trip).
    ///
    /// # Errors
    ///
    /// As for [`add_with`](Self::add_with); on an error, any prefix of the adds may have
    /// been applied (adding them again is harmless).
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::{AddOptions, Queue, WorkQueue};
    ///
    /// let queue = WorkQueue::new();
    /// queue.add("default/live".to_owned());
    /// let listed = vec!["default/web-0".to_owned(), "default/web-1".to_owned()];
    /// let added = futures::executor::block_on(queue.add_all_with(
    ///     listed,
    ///     AddOptions::default().priority(-100),
    /// ));
    /// assert_eq!(added, Ok(2));
    /// // The live key (priority 0) comes out before the listed ones (-100).
    /// assert_eq!(*queue.try_get().unwrap(), "default/live");
    ///
    /// queue.shut_down();
    /// let refused = futures::executor::block_on(
    ///     queue.add_all_with(vec!["default/web-2".to_owned()], AddOptions::default()),
    /// );
    /// assert_eq!(refused, Ok(0));
    /// ```
    fn add_all_with(
        &self,
        items: Vec<Self::Item>,
        options: AddOptions,
    ) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        async move {
            let mut accepted = 0;
            for item in items {
                if !self.add_with(item, options).await? {
                    break;
                }
                accepted += 1;
            }
            Ok(accepted)
        }
    }

    /// The rate limiter stops tracking `item`: client-go's `Forget`.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn forget(&self, item: &Self::Item) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// How many times the rate limiter delayed `item` since it was last forgotten: client-go's
    /// `NumRequeues`.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn num_requeues(
        &self,
        item: &Self::Item,
    ) -> impl Future<Output = Result<usize, Self::Error>> + Send;

    /// The number of items ready to hand out now: client-go's `Len`.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn len(&self) -> impl Future<Output = Result<usize, Self::Error>> + Send;

    /// Whether no item is ready to hand out now.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn is_empty(&self) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        async { Ok(self.len().await? == 0) }
    }

    /// Waits for the next item and hands it out under a lease: client-go's `Get`. `Ok(None)`
    /// once the queue (or this handle) is shut down and has nothing left to hand out for it.
    ///
    /// Cancel safe: a dropped future loses no item.
    ///
    /// # Errors
    ///
    /// A backend's failure that outlasted its own retries.
    fn get(&self) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send;

    /// A worker loop's step from one item to the next: marks `lease` done, after forgetting
    /// the item's rate-limiter history if `forget` is set (after a success), and may hand out
    /// the next item that is ready now, without waiting.
    ///
    /// A shared backend does it all in one round trip, and the in-memory queue in one round
    /// of its lock (where a `done` and a `get` take two). The default calls
    /// [`forget`](Self::forget) and [`QueueLease::done`] and hands out nothing, so the loop
    /// calls [`get`](Self::get) next; a failed `forget` does not keep the `done` from running.
    /// A lease it hands out is the caller's, as one from `get` is.
    ///
    /// # Errors
    ///
    /// The `done`'s failure (as for [`QueueLease::done`]), else the `forget`'s; a lease the
    /// call took is then released.
    fn done_and_next(
        &self,
        lease: Self::Lease,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        async move {
            let forgotten = if forget {
                self.forget(lease.item()).await
            } else {
                Ok(())
            };
            lease.done().await?;
            forgotten.map(|()| None)
        }
    }

    /// A failed item's step: re-adds `lease`'s item as `options` say (rate-limited, or after
    /// a delay), after forgetting the item's rate-limiter history if `forget` is set, and
    /// marks the lease done.
    ///
    /// Returns `Ok(None)` once the re-add is kept and the lease is done, and `Ok(Some(lease))`
    /// if the queue (or this handle) is shut down and refused the re-add: then nothing
    /// changed, and the lease is handed back for the caller to end.
    ///
    /// A stale holder changes nothing: if the lease is no longer the caller's (it expired
    /// and the item may be another worker's), no failure is counted, nothing is forgotten or
    /// re-added, and the error says so ([`is_lease_lost`](Self::is_lease_lost)). A backend
    /// whose leases can be lost makes it one step on the server, fenced like the `done`, with
    /// the re-add made while the lease is held (Redis and PostgreSQL do). The in-memory
    /// queue, whose leases cannot be lost, re-adds while it holds the lease, then marks it
    /// done.
    ///
    /// The default is fenced by its order: it hands the lease back if the queue is shut
    /// down, then marks the lease done, which a backend refuses for a lease that is not the
    /// caller's, and only once the `done` is accepted forgets and re-adds the item (the
    /// forget first when the add is rate-limited, which reads the history it clears; after
    /// an accepted add otherwise). Between the `done` and the re-add the item is in no
    /// state: a process that dies there loses the retry, and a shut down that comes there
    /// refuses the re-add (the item then leaves the queue, and `Ok(None)` is returned).
    /// Override it with one fenced call where the backend can.
    ///
    /// # Errors
    ///
    /// The lease was lost ([`is_lease_lost`](Self::is_lease_lost)), or a backend's failure:
    /// then whether the step applied may be unknown, and the item is handed out again when
    /// the lease expires.
    fn retry_and_done(
        &self,
        lease: Self::Lease,
        options: AddOptions,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Self::Lease>, Self::Error>> + Send {
        async move {
            if self.is_shutting_down().await? {
                return Ok(Some(lease));
            }
            let item = lease.item().clone();
            // Fenced: nothing is written for a lease that is no longer the caller's.
            lease.done().await?;
            // A rate-limited add reads the history the forget clears: forget first. Any
            // other add does not: add first, and forget only once the add is kept.
            let forget_first = forget && options.is_rate_limited();
            if forget_first {
                self.forget(&item).await?;
            }
            if self.add_with(item.clone(), options).await? && forget && !forget_first {
                self.forget(&item).await?;
            }
            Ok(None)
        }
    }

    /// Whether `error` says that a lease was lost: it expired (or was taken back) and the
    /// item may be another worker's now, so the call changed nothing. `false` by default
    /// (the in-memory queue's leases cannot be lost).
    fn is_lease_lost(error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// Several worker loops' steps at once: marks each lease done, after forgetting its item's
    /// rate-limiter history where its flag is set, and hands out up to `max` items that are
    /// ready now, without waiting. [`DoneMany::done`] has each `done`'s outcome in the order
    /// of `leases`; [`DoneMany::next`] the leases handed out, in hand-out order.
    ///
    /// [`Workers`](crate::Workers) call it when [`batch_limit`](Self::batch_limit) is above
    /// 1, to complete the items that several of their workers finished while a step was on
    /// its way and take the workers' next items, in one round trip. The default makes one
    /// [`done_and_next`](Self::done_and_next) per lease (a plain done once `max` leases were
    /// handed out).
    ///
    /// # Errors
    ///
    /// A failure that touches every lease (the call did not reach the backend, or its answer
    /// was lost): then whether each `done` applied is unknown, and leases the call may have
    /// taken are released or expire as the backend's rules say. A failure of one `done` is in
    /// its place in [`DoneMany::done`].
    fn done_and_next_many(
        &self,
        leases: Vec<(Self::Lease, bool)>,
        max: usize,
    ) -> impl Future<Output = Result<DoneMany<Self::Lease, Self::Error>, Self::Error>> + Send {
        async move {
            let mut done = Vec::with_capacity(leases.len());
            let mut next = Vec::new();
            for (lease, forget) in leases {
                if next.len() < max {
                    match self.done_and_next(lease, forget).await {
                        Ok(lease) => {
                            next.extend(lease);
                            done.push(Ok(()));
                        }
                        Err(error) => done.push(Err(error)),
                    }
                } else {
                    let forgotten = if forget {
                        self.forget(lease.item()).await
                    } else {
                        Ok(())
                    };
                    done.push(lease.done().await.and(forgotten));
                }
            }
            Ok(DoneMany { done, next })
        }
    }

    /// How many leases [`done_and_next_many`](Self::done_and_next_many) is worth giving at
    /// once: above 1 when one call for many leases costs the backend less than one call per
    /// lease (a round trip to a server), and then [`Workers`](crate::Workers) batch their
    /// steps up to this many. 1 (the default, and the in-memory queue's, whose steps cost a
    /// round of its lock each either way) keeps every worker stepping on its own.
    fn batch_limit(&self) -> usize {
        1
    }

    /// How many batched steps [`Workers`](crate::Workers) keep on their way at once (with a
    /// [`batch_limit`](Self::batch_limit) above 1; at least 1). A `done` that comes while
    /// every one is on its way waits for the next, with the others that come meanwhile.
    /// 2 by default: on Redis a second step halves how long a `done` waits, for a script
    /// run that costs little. A backend whose step ends in a commit that waits for the disk
    /// (PostgreSQL) does better with 1: each step then carries more `done`s for one flush.
    ///
    /// This is what a pool that one step can carry keeps. A pool with more workers than
    /// these steps carry (`batch_limit` `done`s each) keeps one step per `batch_limit`
    /// workers, up to 4: its workers' `done`s would otherwise queue behind one step.
    fn steps_in_flight(&self) -> usize {
        2
    }

    /// Creates periodic schedule `update.name`'s record if it is missing (with
    /// [`since`](ScheduleInfo::since) = `update.now`), sets the fields `update` gives, and
    /// answers the record: what a [`Periodic`](crate::periodic) runner calls when it starts,
    /// and to pause or resume its schedule for every process.
    ///
    /// A backend shared by many processes keeps the records on its server, beside the queue,
    /// so that every process reads and writes one record per schedule (Redis: a hash in the
    /// queue's hash tag; PostgreSQL: a table). The default keeps them in a table of this
    /// process, keyed by the queue's [`name`](Self::name) and the schedule's name: right for
    /// the in-memory queue, whose every handle is in this process.
    ///
    /// A type that wraps another queue forwards this method and
    /// [`add_on_tick`](Self::add_on_tick) to it; otherwise its schedules are kept by this
    /// process only, and a fleet of processes would add an item per tick each.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn upsert_schedule(
        &self,
        update: ScheduleUpdate,
    ) -> impl Future<Output = Result<ScheduleInfo, Self::Error>> + Send {
        future::ready(Ok(local::upsert(self.name().unwrap_or(""), &update)))
    }

    /// Adds `item` (as [`add_with`](Self::add_with) would, with `options`) for one tick of a
    /// periodic schedule, unless the tick is taken already: the fleet-once step of
    /// [`Periodic`](crate::periodic) runners.
    ///
    /// The claim and the add are one step: the schedule's last tick moves to `claim.tick` if
    /// it was earlier (or unset) and the add is accepted, and then only; so runners of one
    /// schedule in any number of processes add one item per tick between them, and a late
    /// runner never adds a tick older than one taken. A paused schedule's tick is taken
    /// without an add ([`TickOutcome::Paused`]); a shut-down queue takes nothing
    /// ([`TickOutcome::ShutDown`]).
    ///
    /// The default keeps the last ticks in this process's table (see
    /// [`upsert_schedule`](Self::upsert_schedule)), taking the tick before the add and giving
    /// it back if the add is refused: right for the in-memory queue, whose adds cannot fail. A
    /// shared backend does it in one script run or one transaction on its server.
    ///
    /// # Errors
    ///
    /// A backend's failure: then whether the step applied may be unknown; claiming the same
    /// tick again is harmless.
    fn add_on_tick(
        &self,
        claim: TickClaim,
        item: Self::Item,
        options: AddOptions,
    ) -> impl Future<Output = Result<TickOutcome, Self::Error>> + Send {
        let queue = self.name().unwrap_or("").to_owned();
        let taken = local::begin(&queue, &claim);
        async move {
            let taken = match taken {
                Ok(taken) => taken,
                Err(outcome) => return Ok(outcome),
            };
            let added = self.add_with(item, options).await;
            local::end(&queue, &claim, taken, matches!(added, Ok(true)));
            Ok(if added? {
                TickOutcome::Added
            } else {
                TickOutcome::ShutDown
            })
        }
    }

    /// Shuts this handle down: client-go's `ShutDown`. Its adds are ignored from now on and
    /// its getters wake; items already queued are still handed out (in memory), or left on the
    /// server for the other processes (on a shared backend, where a handle's shut down stops
    /// only that handle).
    ///
    /// It is synchronous, and takes effect before it returns, because a stop signal (a
    /// [`StopToken`](crate::StopToken) callback, a signal handler) calls it where it cannot
    /// wait: shutting one handle down is local to it on every backend.
    ///
    /// Returns the items the shut down dropped and nobody will process: in memory, the
    /// delayed items (the queue forgets them), so that a caller can keep them; on a shared
    /// backend, where delayed items stay on the server, none.
    fn shut_down(&self) -> Vec<Self::Item>;

    /// Shuts this handle down, then waits until no lease it handed out is held: client-go's
    /// `ShutDownWithDrain`.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether this handle, or the queue for everyone, is shut down: client-go's
    /// `ShuttingDown`.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Self::Error>> + Send;
}

/// What [`Queue::done_and_next_many`] did: the outcome of each lease's `done`, and the leases
/// it handed out.
///
/// The leases in [`next`](Self::next) were handed out for the caller: dropped unprocessed,
/// they complete their items in memory (a dropped in-memory lease is done) and release them
/// on a server; and each `done` in [`done`](Self::done) may have failed.
#[derive(Debug)]
#[must_use = "the leases in `next` were handed out for you: dropped, they complete unprocessed items in memory and release them on a server; each `done` may have failed"]
pub struct DoneMany<L, E> {
    /// Each `done`'s outcome, in the order of the leases given.
    pub done: Vec<Result<(), E>>,
    /// The leases handed out, in hand-out order (at most the `max` asked for).
    pub next: Vec<L>,
}

/// The claim on one item while a worker processes it: what [`Queue::get`] hands out.
///
/// End it with [`done`](Self::done) (processed) or [`release`](Self::release) (not
/// processed: hand it out again). What a lease dropped without either does is the backend's
/// rule: done in memory, released on a shared backend.
pub trait QueueLease: Send + fmt::Debug + 'static {
    /// The item.
    type Item;
    /// Why ending the lease failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The item.
    fn item(&self) -> &Self::Item;

    /// The priority the item was handed out with (0 when priorities are not used).
    fn priority(&self) -> i32;

    /// Marks the item done: client-go's `Done`. An item re-added while processing is queued
    /// again.
    ///
    /// # Errors
    ///
    /// A backend's failure, or a lease the backend took back (it expired).
    fn done(self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Lets go of the item unprocessed, so that it is handed out again. Returns `Ok(true)` if
    /// the queue still holds the item, `Ok(false)` if it does not (in memory, once the queue
    /// is shut down, a released item cannot be queued again and leaves the queue).
    ///
    /// # Errors
    ///
    /// As for [`done`](Self::done).
    fn release(self) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// The trace contexts of the adds that queued the item (feature `otel`): the worker's
    /// span for the item links to each. At most [`MAX_LINKS`](crate::otel::MAX_LINKS).
    /// None by default, for a backend that does not store them.
    #[cfg(feature = "otel")]
    fn links(&self) -> &[crate::otel::TraceLink] {
        &[]
    }

    /// How many adds' trace contexts were dropped beyond [`links`](Self::links) (feature
    /// `otel`); 0 by default.
    #[cfg(feature = "otel")]
    fn links_dropped(&self) -> u32 {
        0
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Queue for WorkQueue<T> {
    type Item = T;
    type Lease = Lease<T>;
    type Error = Infallible;

    fn name(&self) -> Option<&str> {
        WorkQueue::name(self)
    }

    fn add_with(
        &self,
        item: T,
        options: AddOptions,
    ) -> impl Future<Output = Result<bool, Infallible>> + Send {
        future::ready(Ok(self.add_with_accepted(item, options)))
    }

    fn forget(&self, item: &T) -> impl Future<Output = Result<(), Infallible>> + Send {
        WorkQueue::forget(self, item);
        future::ready(Ok(()))
    }

    fn num_requeues(&self, item: &T) -> impl Future<Output = Result<usize, Infallible>> + Send {
        future::ready(Ok(WorkQueue::num_requeues(self, item)))
    }

    fn len(&self) -> impl Future<Output = Result<usize, Infallible>> + Send {
        future::ready(Ok(WorkQueue::len(self)))
    }

    async fn get(&self) -> Result<Option<Lease<T>>, Infallible> {
        Ok(WorkQueue::get(self).await)
    }

    /// In memory: forgets the item if asked, then marks it done and hands out the next ready
    /// item in one round of the queue's lock, where a `done` and a `get` take two.
    fn done_and_next(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Infallible>> + Send {
        if forget {
            WorkQueue::forget(self, lease.item());
        }
        future::ready(Ok(lease.done_and_try_get()))
    }

    /// In memory, whose leases cannot be lost: hands the lease back if the queue is shut
    /// down, else re-adds the item while the lease is held (the forget first when the add is rate-limited, after an accepted add otherwise, so
    /// that a refused add forgets nothing), then marks the lease done; the re-add is kept
    /// and the item queued again as for a re-add while processing.
    fn retry_and_done(
        &self,
        lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> impl Future<Output = Result<Option<Lease<T>>, Infallible>> + Send {
        if WorkQueue::is_shutting_down(self) {
            return future::ready(Ok(Some(lease)));
        }
        let forget_first = forget && options.is_rate_limited();
        if forget_first {
            WorkQueue::forget(self, lease.item());
        }
        if !self.add_with_accepted(lease.item().clone(), options) {
            return future::ready(Ok(Some(lease)));
        }
        if forget && !forget_first {
            WorkQueue::forget(self, lease.item());
        }
        lease.done();
        future::ready(Ok(None))
    }

    fn shut_down(&self) -> Vec<T> {
        self.shut_down_taking_delayed()
    }

    async fn shut_down_with_drain(&self) -> Result<(), Infallible> {
        WorkQueue::shut_down_with_drain(self).await;
        Ok(())
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Infallible>> + Send {
        future::ready(Ok(WorkQueue::is_shutting_down(self)))
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> QueueLease for Lease<T> {
    type Item = T;
    type Error = Infallible;

    fn item(&self) -> &T {
        Lease::item(self)
    }

    fn priority(&self) -> i32 {
        Lease::priority(self)
    }

    fn done(self) -> impl Future<Output = Result<(), Infallible>> + Send {
        Lease::done(self);
        future::ready(Ok(()))
    }

    /// In memory: queues the item again at once (with its priority), at the head of its
    /// priority, where it was taken from, and marks the lease done, so that it is handed out
    /// next, as on the shared backends; `Ok(false)` if the queue is shut down and refused
    /// the re-add.
    fn release(self) -> impl Future<Output = Result<bool, Infallible>> + Send {
        future::ready(Ok(Lease::release(self)))
    }

    #[cfg(feature = "otel")]
    fn links(&self) -> &[crate::otel::TraceLink] {
        Lease::links(self)
    }

    #[cfg(feature = "otel")]
    fn links_dropped(&self) -> u32 {
        Lease::links_dropped(self)
    }
}

/// What a shared backend's `try_get` found, looking once without waiting: a lease `L`,
/// nothing ready, or a queue shut down (`workq_redis::RedisQueue::try_get`,
/// `workq_postgres::PgQueue::try_get`).
///
/// The in-memory queue's [`try_get`](WorkQueue::try_get) gives the same three answers as
/// `Result<Lease<T>, TryGetError>`; [`into_result`](Self::into_result) turns this one into
/// that shape.
#[must_use = "a lease inside is released when dropped"]
#[derive(Debug)]
pub enum TryGet<L> {
    /// An item was ready: it is handed out under this lease.
    Leased(L),
    /// Nothing is ready now: the queue holds nothing, or only items waiting for a delay or
    /// under a lease, or it is paused.
    Empty,
    /// This handle is shut down, or the queue is shut down for every process and has nothing
    /// ready: no item will come.
    ShutDown,
}

impl<L> TryGet<L> {
    /// The lease, if an item was handed out ([`TryGet::Leased`]).
    pub fn into_lease(self) -> Option<L> {
        match self {
            TryGet::Leased(lease) => Some(lease),
            TryGet::Empty | TryGet::ShutDown => None,
        }
    }

    /// Returns `true` for [`TryGet::Leased`].
    pub fn is_leased(&self) -> bool {
        matches!(self, TryGet::Leased(_))
    }

    /// Returns `true` for [`TryGet::Empty`].
    pub fn is_empty(&self) -> bool {
        matches!(self, TryGet::Empty)
    }

    /// Returns `true` for [`TryGet::ShutDown`].
    pub fn is_shut_down(&self) -> bool {
        matches!(self, TryGet::ShutDown)
    }

    /// The in-memory queue's shape: the lease, or [`TryGetError::Empty`] or
    /// [`TryGetError::ShutDown`].
    ///
    /// # Errors
    ///
    /// [`TryGetError::Empty`] for [`TryGet::Empty`], [`TryGetError::ShutDown`] for
    /// [`TryGet::ShutDown`].
    pub fn into_result(self) -> Result<L, TryGetError> {
        match self {
            TryGet::Leased(lease) => Ok(lease),
            TryGet::Empty => Err(TryGetError::Empty),
            TryGet::ShutDown => Err(TryGetError::ShutDown),
        }
    }
}
