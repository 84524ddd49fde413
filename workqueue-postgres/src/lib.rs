//! client-go's workqueue rules across many processes, on PostgreSQL, with **transactional
//! enqueue**: an item is queued if and only if the transaction that added it commits.
//!
//! ```no_run
//! use std::time::Duration;
//! use workqueue_postgres::PgQueue;
//!
//! # async fn run() -> Result<(), workqueue_postgres::Error> {
//! let queue: PgQueue<String> = PgQueue::builder("pods")
//!     .url("postgres://app@127.0.0.1/app")
//!     .lease_duration(Duration::from_secs(30))
//!     .build()
//!     .await?;
//!
//! // Queued with the business write, or not at all.
//! let mut tx = queue.pool().begin().await?;
//! sqlx::query("UPDATE pods SET spec = $1 WHERE name = $2")
//!     .bind("{}")
//!     .bind("web-0")
//!     .execute(&mut *tx)
//!     .await?;
//! queue.add_in(&mut tx, "default/web-0".to_string()).await?;
//! tx.commit().await?; // now a worker is woken
//!
//! while let Some(lease) = queue.get().await? {
//!     match reconcile(&lease).await {
//!         Ok(()) => queue.forget(lease.item()).await?,
//!         Err(()) => {
//!             queue.add_rate_limited(lease.item()).await?;
//!         }
//!     }
//!     lease.done().await?;
//! }
//! # Ok(())
//! # }
//! # async fn reconcile(_: &str) -> Result<(), ()> { Ok(()) }
//! ```
//!
//! [`PgQueue`] has the methods of [`workqueue::WorkQueue`] with the same names and meanings,
//! made `async`, and implements [`workqueue::Queue`], so [`workqueue::Workers`] run on it
//! unchanged. The rules hold across every process sharing the queue:
//!
//! - **Dedup**: an item added many times before it is handed out is processed once.
//! - **Never two workers on one item**: while an item is leased, nobody else gets it.
//! - **Re-add while processing**: the item is handed out once more after its holder is done.
//! - **Earliest-wins delays** and **rate-limited retries** (the failure counts and the token
//!   bucket are rows, so every process sees the same ones).
//! - **Priorities** through [`workqueue::AddOptions`]: higher first, FIFO within one, raised
//!   and never lowered by a re-add, kept through delays.
//! - **Shutdown**: [`shut_down`](PgQueue::shut_down) stops one handle,
//!   [`shut_down_fleet`](PgQueue::shut_down_fleet) every process.
//!
//! # Transactional enqueue
//!
//! [`add_in`](PgQueue::add_in), [`add_after_in`](PgQueue::add_after_in) and
//! [`add_with_in`](PgQueue::add_with_in) take the caller's connection, inside its
//! transaction (`&mut tx`). Every add is one call of a SQL function whose writes, and whose
//! `NOTIFY`, belong to that transaction: rolled back, nothing is queued and nobody is woken;
//! committed, the item is queued and the getters waiting in every process are woken.
//! Until it ends, the transaction holds the row of each item it added: a `done` or a renewal
//! of that item waits for it (and nobody can reclaim it meanwhile), so keep such transactions
//! short, as any transaction that locks rows. Run them at `READ COMMITTED`, the default.
//!
//! # Claims, wake-ups, leases
//!
//! A get is one call of `workqueue_get`: due delays and expired leases take effect, then the
//! first ready row (highest priority, then oldest) is claimed with `FOR UPDATE SKIP LOCKED`,
//! so getters never wait for each other. A worker's step from one item to the next,
//! [`PgQueue::done_and_get`] (what [`workqueue::Workers`] call, through
//! [`workqueue::Queue::done_and_next`]), is one call of `workqueue_done_get`: the `done`, then
//! the get, in one statement and one commit. Getters wait for a `NOTIFY` on the channel
//! `workqueue` (one `LISTEN` connection per handle), and look again at least every
//! [`poll_interval`](Builder::poll_interval) and when a delay or a lease deadline is due.
//!
//! A [`Lease`] lasts a [lease duration](Builder::lease_duration) on the database's clock and
//! is renewed while held. Its fencing token comes from the sequence `workqueue_seq`, so it
//! grows across restarts; a holder whose lease expired and was reclaimed can neither mark the
//! item done nor renew it. Only [`Lease::done`] (or [`PgQueue::done_and_get`]) marks an item
//! done: a dropped lease is released and handed out again at once. An item whose leases expire
//! [`max_stalls`](Builder::max_stalls) times in a row, or whose text no longer deserializes,
//! moves to the dead letters ([`PgQueue::dead_letters`], capped).
//!
//! # Schema
//!
//! Installed by embedded, versioned SQL ([`SCHEMA_VERSION`]), every name prefixed
//! `workqueue_`. Each version records the oldest version whose code still works on its
//! schema: a process runs on a schema newer than its own when that schema still serves it
//! (an additive migration, so that the old processes of a rolling upgrade keep starting) and
//! refuses to build otherwise. Version 2 only adds the function `workqueue_done_get` and
//! serves version 1. (Processes built before the record existed refuse any newer schema.)
//!
//! All queues share one table set with a `queue` column: one migration for any number of
//! queues, and a queue is created by naming it. The cost: every queue's rows share the
//! tables' indexes and vacuum, so one queue with a huge backlog slows scans of another only
//! through index size (every index leads with `queue`), and dropping one queue is a `DELETE`
//! ([`PgQueue::delete`]), not a `DROP TABLE`.
//!
//! # PgBouncer
//!
//! Every call is one statement or one short transaction, so the queue's own SQL suits
//! transaction pooling, with three conditions. `LISTEN` needs a session: build with
//! [`listen(false)`](Builder::listen), and getters poll. sqlx names its prepared statements,
//! which PgBouncer supports in transaction mode only from 1.21 on, with
//! `max_prepared_statements` set; with 1.18 (Debian 12's) the second call on a pooled server
//! connection fails with `prepared statement "sqlx_s_1" already exists`. And sqlx sends the
//! startup parameter `extra_float_digits`, so PgBouncer needs
//! `ignore_startup_parameters = extra_float_digits`. In session mode (that setting aside)
//! the queue works as on a direct connection, `LISTEN` included.

//! # What can still lose work
//!
//! Nothing acknowledged is lost while the database keeps its commits (`fsync` on and
//! `synchronous_commit` on, the defaults). Work is lost with `synchronous_commit = off` (the
//! last commits before a crash), by an asynchronous replica promoted after a failover, by
//! restoring a backup, or by [`PgQueue::delete`] and [`purge_dead_letters`](PgQueue::purge_dead_letters).
//! An item can be processed twice (never by two live holders with accepted `done`s): a
//! holder paused past its lease keeps running its handler while another holder processes the
//! item; its `done` is refused, but its side effects happened. Use the fencing token
//! downstream where that matters.

mod add;
mod admin;
mod backend;
mod builder;
mod dead_letter;
mod error;
mod faults;
mod get;
mod lease;
mod listen;
mod migrate;
mod queue;

pub use admin::{InFlight, Stats};
pub use builder::{Builder, MAX_NAME_BYTES};
pub use dead_letter::DeadLetter;
pub use error::Error;
#[cfg(feature = "fault-injection")]
pub use faults::Mutation;
pub use get::DoneAndGetMany;
pub use lease::Lease;
pub use listen::APPLICATION_NAME;
pub use migrate::SCHEMA_VERSION;
pub use queue::{AddKind, Added, PgQueue};
