//! client-go's workqueue rules across many processes, on PostgreSQL, with **transactional
//! enqueue**: an item is queued if and only if the transaction that added it commits.
//!
//! ```no_run
//! use std::time::Duration;
//! use workq_postgres::PgQueue;
//!
//! # async fn run() -> Result<(), workq_postgres::Error> {
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
//! [`PgQueue`] has the methods of [`workq::WorkQueue`] with the same names and meanings,
//! made `async`, and implements [`workq::Queue`], so [`workq::Workers`] run on it
//! unchanged. The rules hold across every process sharing the queue:
//!
//! - **Dedup**: an item added many times before it is handed out is processed once.
//! - **Never two workers on one item**: while an item is leased, nobody else gets it.
//! - **Re-add while processing**: the item is handed out once more after its holder is done.
//! - **Earliest-wins delays** and **rate-limited retries** (the failure counts and the token
//!   bucket are rows, so every process sees the same ones).
//! - **Priorities** through [`workq::AddOptions`]: higher first, FIFO within one, raised
//!   and never lowered by a re-add, kept through delays.
//! - **Shutdown**: [`shut_down`](PgQueue::shut_down) stops one handle,
//!   [`shut_down_fleet`](PgQueue::shut_down_fleet) every process; [`pause`](PgQueue::pause)
//!   stops the hand-outs of every process and keeps the adds.
//! - **Order**: ready items come out in the order they became ready: an add's time, or a
//!   delayed item's due time (whether or not a get ran in between), within a priority.
//! - **Flow control**, as [`workq::flow`] describes it: groups taking turns, in-flight limits
//!   and hand-out rates, held across every process (see [Flow control](#flow-control)).
//!
//! # Transactional enqueue and batches
//!
//! [`add_in`](PgQueue::add_in), [`add_after_in`](PgQueue::add_after_in),
//! [`add_with_in`](PgQueue::add_with_in) and [`add_all_in`](PgQueue::add_all_in) take the
//! caller's connection, inside its transaction (`&mut tx`). Every add is one call of a SQL
//! function whose writes, and whose `NOTIFY`, belong to that transaction: rolled back,
//! nothing is queued and nobody is woken; committed, the items are queued and the getters
//! waiting in every process are woken. Until it ends, the transaction holds the row of each
//! item it changed (a duplicate of a queued item changes nothing and holds nothing), and, for
//! a rate-limited add, the item's failure row and the queue's row (its token bucket). A
//! getter skips such a row; a worker's step leaves such an item's `done` out and settles it on
//! its own, waiting for that row alone, with the lease renewed meanwhile, so the other
//! workers go on; a `done` or a renewal of that item waits for it. Keep such transactions
//! short, as any transaction that locks rows. Run them at `READ COMMITTED`, the default.
//!
//! [`add_all`](PgQueue::add_all), [`add_all_after`](PgQueue::add_all_after) and
//! [`add_all_with`](PgQueue::add_all_with) add a batch in one statement (per thousand
//! items), with one `NOTIFY`, and exactly the rules of adding the items one by one in order,
//! rate-limited ones included: the token bucket is spent in the batch's order, and the n-th
//! rate-limited add of an item in a batch waits its n-th backoff. A plain
//! [`add`](PgQueue::add) is one statement committed on its own.
//!
//! # The lock order
//!
//! Every statement of the queue that waits for locks takes them in one order:
//!
//! 0. the queue's adding lock (a transaction-level advisory lock on the key
//!    `(2003920492, queue id)`): every add holds it shared until its transaction ends; only
//!    turning flow control on takes it exclusive, to wait for the adds in progress;
//! 1. the items' rows (`workqueue_items`), in the order of their keys; a call of a lease's
//!    holder that may wait for its item's row (a renewal, a done or release, a failed item's
//!    retry, a step's short wait) first takes the item's lease lock (a transaction-level
//!    advisory lock on `workqueue_lease_lock(queue id, key)`), just before that row; the
//!    sweep of expired leases, which holds the row already, only tries it, and leaves a lease
//!    whose lock is held to the call that waits (schema 11: no sweep takes back a lease whose
//!    renewal or done waits for a row an application's transaction holds);
//! 2. then their failure rows (`workqueue_failures`), in the order of their keys;
//! 3. then the queue's row (`workqueue_queues`: its token bucket, its counters);
//! 4. then, under flow control, the queue's flow row (`workqueue_flow`: its limits, its count
//!    of leases, its hand-out bucket), which is also the queue's flow lock;
//! 5. then group rows (`workqueue_groups`), only ever locked by the holder of the flow row,
//!    so in any order.
//!
//! A flow hand-out takes the flow row first and item rows only without waiting (as every get
//! does); a worker's step locks all its items before the dones that give slots back (those
//! take the flow row). A row a statement needs out of that order (a sweep that buries an item and goes on to the
//! next, a worker's step, which must not wait at all) it takes without waiting (`SKIP
//! LOCKED`), or leaves for later. So the queue's statements never deadlock with each other,
//! whatever runs beside them: batches and single adds, rate-limited or not, in callers'
//! transactions or not, `done`s, steps, retries, renewals and sweeps. A caller's transaction
//! of several statements holds the locks of each until it ends, so together they can go
//! against that order (an add of an item, then a rate-limited add of another, while someone
//! rate-limits the first): put such adds in one [`add_all_with_in`](PgQueue::add_all_with_in).
//!
//! # Flow control
//!
//! The builder's flow methods ([`Builder::group_by`], [`Builder::group_weight`],
//! [`Builder::max_in_flight`], [`Builder::max_in_flight_per_group`],
//! [`Builder::group_max_in_flight`], [`Builder::hand_out_rate`],
//! [`Builder::hand_out_rate_per_group`], [`Builder::group_hand_out_rate`]) are
//! [`workq::Builder`]'s, with its meanings: within the highest priority that has ready work,
//! getters take turns between groups (deficit round robin by weight), each priority with its
//! own turns, in each group in the order its items became ready; a group at its limit, or
//! waiting for a token of its own, holds back no other group. A queue built without any of them runs the statements it ran
//! before flow control existed (`tests/cost.rs` holds a get to 5 statements).
//!
//! **Across processes.** The group function runs in the adding process at every add (one by
//! one, in batches, in the caller's transaction, rate-limited, on a periodic tick) and the
//! group's name goes with the item, so every process that adds must be built with the same
//! function; an item keeps its group while the queue holds it (a dead letter too). Items added
//! without a group (by a handle built without `group_by`, or anew by an operator through
//! [`PgAdmin`]) are in the group `""`; a typed handle's [`retry_now`](PgQueue::retry_now)
//! gives an item known only by its failure count its group. The settings are kept beside the
//! queue, and every process, and [`PgAdmin`], applies and shows the stored ones: **the last
//! handle built with settings wins**. At build such a handle compares the stored settings
//! with its own and writes its own if they differ (logging a warning naming the ones it
//! replaced); a handle built earlier that later sees them changed (its adds, and its gets that
//! sweep, read their version) logs a warning once per change, and goes on applying the stored
//! ones. A handle built **without** any flow setting changes nothing: on a queue with flow
//! control it follows the stored settings, and its adds join the group `""` (with a warning at
//! build), so a producer built without `group_by` cannot switch a fleet's flow control off by
//! starting; the handles [`PgAdmin`] opens do not even read them.
//! [`PgQueue::clear_flow_control`] takes flow control off on purpose ([`PgQueue::delete`] too,
//! with the rest of the queue), and [`PgQueue::flow_limits`] reads the settings.
//!
//! **Limits count leases, whatever process holds them.** A hand-out counts its lease in its
//! group (and in the queue, with [`max_in_flight`](Builder::max_in_flight)) and records on
//! the item's row what it counted; whatever ends the lease (a done, a release, a sweep that
//! takes an expired lease back, a move to the dead letters) gives exactly that back, so **an
//! expired lease frees its slot when it is taken back**, by the next get that sweeps in any
//! process (at least every [`poll_interval`](Builder::poll_interval), or a quarter of the
//! lease duration). A group or queue that had no free slot and has one now wakes a getter
//! through the queue's `NOTIFY`, as an add does: no polling. Every lease counts, in its group
//! and in the queue: turning flow control on, or changing its settings, counts the leases out
//! that were handed out before (in their groups, `""` for items without one).
//! **Hand-out rates** are GCRA buckets on the database's
//! clock, one per queue and per group for every process; a getter that waits for a token
//! sleeps until it is due.
//!
//! **Tables and indexes.** An item's group is a column of its row, and its group's ready items
//! are an index of their own (`workqueue_items_lanes`). `workqueue_groups` has a row per group
//! that holds something: its ready items, its highest ready priority, its leases, its place in
//! the turns of that priority (and its places in the turns of the lower priorities where it
//! has ready items, which it takes when its highest one runs dry), its weight's turns left,
//! its bucket, the time it waits for a token. The next
//! group to hand out is the first entry of a partial index of the groups that may hand out
//! now, by priority then turn (`workqueue_groups_turns`): a get reads the groups it hands out
//! from, never all of them (`tests/cost.rs`: about 60 to 90 buffers per get with 10 groups or
//! 10,000, behind statistics taken while the tables were empty; 22 without flow control). A
//! group leaves the index when it saturates (it rejoins at the back when a lease of it ends),
//! runs out of tokens (it is parked, and found again through `workqueue_groups_parked` when
//! its token is due) or out of ready items; a group that holds nothing is forgotten (at once,
//! or by a sweep once its bucket has refilled), so a queue that sees millions of groups over
//! its life keeps the live ones only. An add never locks a group's row (it may run in your
//! long transaction): it inserts an arrival per group and priority (`workqueue_arrivals`),
//! which the next get folds into the groups. `workqueue_flow` keeps the queue's settings, its count of leases and its
//! bucket; `workqueue_group_settings` the per-group overrides.
//!
//! **Costs.** Hand-outs of one queue under flow control take turns on its flow row (one at a
//! time, as the decision of who goes next must be), while adds and renewals go on beside them
//! (a done takes it for the moment it gives its lease's slot back). Turning flow control on for
//! a queue that holds items waits for the adds in progress (up to a second per attempt, retried
//! until the [retry deadline](Builder::retry_deadline)), writes the items added without a group
//! once (into the group `""`), counts the leases out and the groups' ready items.
//!
//! A worker's step gives back the slots of all the leases it ends in one write of the flow row
//! and one of each group's row, and a group alone in the turns at its priority (the usual case
//! of one noisy group) takes every hand-out a get may give it in one read of its lane and one
//! write of its row, as one hand-out after another would leave them; groups that share the
//! turns are served one hand-out at a time. (W8 in `wq bench`, 16 workers: about 6 statements
//! and 70 buffers per grouped item, against 19 and 260 before schema version 10, and 3.3 and
//! 45 without groups.)
//!
//! docs/postgres.md ("Redis and PostgreSQL: the same rules, and where they differ") lists what
//! flow control does otherwise on Redis: an item's group while flow control is off (kept in its
//! row here), exact counts, the operators' pages, when an expired lease's slot frees.
//!
//! # Faults
//!
//! A call the server rolled back (a lock or statement timeout set on the pool, a
//! serialization failure, a deadlock: [`Error::is_rolled_back`]) changed nothing, and is sent
//! again, as a call whose connection failed ([`Error::is_connection`]) is, until the
//! [retry deadline](Builder::retry_deadline). A worker's step whose connection failed may
//! have been applied: each of its `done`s is then settled on its own. Leases are renewed
//! until their `done` is known to be committed.
//!
//! # Claims, wake-ups, leases
//!
//! A get is one call of `workqueue_get`: expired leases are taken back (at most once per
//! sweep interval per handle), due delayed items join the ready order at their due time,
//! then the first ready rows (highest priority, then the moment they became ready) are
//! claimed with `FOR UPDATE SKIP LOCKED`, so getters never wait for each other. Every
//! statement takes the time once, so each reads through index bounds: the cost of a get does
//! not grow with a backlog of delayed items. A worker's step from one item to the next,
//! [`PgQueue::done_and_get`] (what [`workq::Workers`] call, through
//! [`workq::Queue::done_and_next`]), is one call of `workqueue_step`: the `done`, then
//! the get, in one statement and one commit; [`PgQueue::done_and_get_many`] does it for a
//! batch. A failed item's step, [`PgQueue::retry_and_done`] (what `Workers` call on a retry),
//! is one call of `workqueue_retry_done`: the re-add and the `done`, fenced by the lease's
//! token.
//!
//! Getters wait for a `NOTIFY` on their queue's channel, and look again when the next delayed
//! item is due and at least every [`poll_interval`](Builder::poll_interval): a getter on an
//! empty queue costs one query per poll interval. The `LISTEN` connection is one per process
//! and database, opened with the pool's connect options but outside the pool (named
//! [`APPLICATION_NAME`] in `pg_stat_activity`): a pool passed with
//! [`Builder::pool`] lends the queue connections for single statements only, so any number
//! of queues share a pool of any size. A notification wakes as many getters as items became
//! ready. The connection is pinged while idle and replaced when it fails or hangs; every
//! getter then looks at its queue once, so no wake-up is lost.
//!
//! A [`Lease`] lasts a [lease duration](Builder::lease_duration) on the database's clock and
//! is renewed while held (a HOT update: the deadline is in no index). Its fencing token comes
//! from the sequence `workqueue_seq`, so it grows across restarts; a holder whose lease
//! expired and was reclaimed can neither mark the item done, nor renew it, nor forget its
//! failures, nor count one, nor re-add the item. Only [`Lease::done`] (or
//! [`PgQueue::done_and_get`]) marks an item done: a dropped lease is released and handed out
//! again at once. An item whose leases expire
//! [`max_stalls`](Builder::max_stalls) times in a row, or whose text no longer deserializes,
//! moves to the dead letters ([`PgQueue::dead_letters`], capped).
//!
//! # Schema
//!
//! Installed by embedded, versioned SQL ([`SCHEMA_VERSION`]), every name prefixed
//! `workqueue_`, in the schema first on the migrating connection's search path. Each version
//! records the oldest version whose code still works on its schema: a process runs on a
//! schema newer than its own when that schema still serves it (an additive migration, so
//! that the old processes of a rolling upgrade keep starting) and refuses to build otherwise.
//! Version 2 only added the function `workqueue_done_get`. Version 3 changed the tables
//! (below) and serves only version 3: stop the processes of version 2 before the first
//! process of version 3 starts (they fail their calls meanwhile, and refuse to start).
//! Version 4 changed functions only (the lock order, `workqueue_step`,
//! `workqueue_retry_done`) and serves version 3 too: a rolling upgrade from version 3 needs
//! no stop. Versions 5, 6, 7 and 8 are additive too; version 7 (flow control) keeps the calls
//! of the older processes (`workqueue_add` without groups: under flow control their items are
//! in the group `""`), whose gets and dones follow the stored flow settings. Version 8 gives
//! each priority its own turns and counts every lease; a process of version 7 still built
//! without flow settings writes empty ones at build, which turns flow control off: upgrade the
//! processes that run without settings first. Version 9 (trace links, the feature `otel`)
//! is additive: its hand-outs answer two more columns, which older processes do not read
//! (their leases carry no links). Version 10 changes two functions only, keeping their calls
//! and answers: grouped hand-outs in bulk (see "Costs" under flow control). Version 11 is
//! additive: the item's lease lock (see "The lock order"), a renewal that reckons its deadline
//! once it has the row, and two new functions (`workqueue_renew`, `workqueue_finish`); older
//! processes' renewals and dones do not take the lock, so their leases keep the race it closes
//! until they are upgraded.
//!
//! All queues share one table set: a queue is a row of `workqueue_queues` with an integer id
//! (a queue is created by naming it), and every other row names its queue by that id. An
//! item's identity is the SHA-256 of its JSON text, so items of any size dedup and queue
//! (PostgreSQL's b-tree entries hold at most 2,704 bytes); queue names hold at most
//! [`MAX_NAME_BYTES`] bytes and no control character. The cost of one table set: every
//! queue's rows share the tables' indexes and vacuum, so one queue with a huge backlog slows
//! another only through index size (every index leads with the queue), and dropping one
//! queue is a `DELETE` ([`PgQueue::delete`]), not a `DROP TABLE`. The items table leaves room
//! in each page for HOT updates and is vacuumed after 1% of its rows changed.
//!
//! The SQL ships in the crate's source, beside the code that runs it: the migrations in
//! `src/sql/migrations/` (run once each, in order, and never edited once released: a unit
//! test holds each to the checksum it was released with, so a change is always a new
//! migration), and `src/sql/functions.sql`, every function as the migrations leave it (its
//! body, `SET` options and comment), in one file to read. That file is generated from a
//! database migrated from empty and checked against one by `tests/schema.rs`; nothing runs
//! it.
//!
//! Every function runs with the search path `pg_catalog, <its schema>, pg_temp`, so objects
//! of the caller's search path (a temporary table, a function in a schema another role may
//! write) cannot change what the queue's SQL refers to. No function has a switch for the
//! fault tests' deliberate bugs: those live in this crate's test client only (feature
//! `fault-injection`).
//!
//! # Least privileges
//!
//! Run the migrations once with the role that owns the schema ([`PgQueue::migrate`], or a
//! build with [`migrate(true)`](Builder::migrate), the default). A worker role then needs:
//!
//! ```sql
//! GRANT USAGE ON SCHEMA app TO worker;
//! GRANT SELECT, INSERT, UPDATE, DELETE
//!     ON workqueue_queues, workqueue_items, workqueue_failures, workqueue_dead TO worker;
//! GRANT SELECT ON workqueue_migrations TO worker;
//! GRANT USAGE ON SEQUENCE workqueue_seq TO worker;
//! ```
//!
//! and `EXECUTE` on the `workqueue_` functions, which every role has unless it was revoked
//! from `PUBLIC`. A process of such a role may keep `migrate(true)`: a current schema is only
//! read. Under [flow control](#flow-control) (a queue without it never touches these tables):
//!
//! ```sql
//! GRANT SELECT, INSERT, UPDATE, DELETE ON workqueue_flow, workqueue_group_settings,
//!     workqueue_groups, workqueue_arrivals TO worker;
//! ```
//!
//! An operator's role, for [`PgAdmin`] (the dashboard, `wq`), needs less: it reads the
//! tables and acts through the operator's calls, and cannot create or delete a queue, count
//! a failure or write a dead letter:
//!
//! ```sql
//! GRANT USAGE ON SCHEMA app TO operator;
//! GRANT SELECT ON workqueue_queues, workqueue_items, workqueue_failures, workqueue_dead,
//!     workqueue_migrations TO operator;
//! GRANT UPDATE (paused, shut_down) ON workqueue_queues TO operator;
//! GRANT INSERT, UPDATE, DELETE ON workqueue_items TO operator;
//! GRANT DELETE ON workqueue_failures, workqueue_dead TO operator;
//! GRANT USAGE ON SEQUENCE workqueue_seq TO operator;
//! -- Under flow control: the groups and the limits, and the items queued again announced.
//! GRANT SELECT ON workqueue_flow, workqueue_group_settings, workqueue_groups TO operator;
//! GRANT SELECT, INSERT ON workqueue_arrivals TO operator;
//! ```
//!
//! A worker's grants include these: no operator action is refused to a worker's role.
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
mod control;
mod dead_letter;
mod error;
mod faults;
mod flow;
mod get;
mod inner;
mod inspect;
mod key;
mod lease;
mod listing;
mod migrate;
mod periodic;
mod queue;
mod stats;
mod trace;
mod units;
mod wait;

pub use builder::{Builder, MAX_NAME_BYTES};
pub use error::Error;
#[cfg(feature = "fault-injection")]
pub use faults::Mutation;
pub use flow::MAX_GROUP_BYTES;
#[expect(deprecated, reason = "the old name stays one release")]
pub use inspect::SCAN;
pub use inspect::SEARCH_BUDGET;
pub use lease::Lease;
pub use listing::PgAdmin;
#[expect(deprecated, reason = "the old free functions stay one release")]
pub use listing::{queue_summary, queues};
pub use migrate::SCHEMA_VERSION;
pub use queue::PgQueue;
pub use wait::APPLICATION_NAME;

// Names this crate had before the operator contract moved to the core, for one release. The
// old names that another of the workq crates exports for something else (`Stats`, `Page`,
// `AddKind`, ...) are gone: across the crates a public name means one thing.

/// A request for one page of items: `workq`'s.
#[deprecated(since = "0.1.0", note = "use `workq::admin::PageQuery`")]
pub type PageQuery = workq::admin::PageQuery;
/// Everything known of one item: `workq`'s.
#[deprecated(since = "0.1.0", note = "use `workq::admin::ItemDetail`")]
pub type ItemDetail = workq::admin::ItemDetail;
/// A lease as operators see it: `workq`'s.
#[deprecated(since = "0.1.0", note = "use `workq::admin::LeaseInfo`")]
pub type LeaseInfo = workq::admin::LeaseInfo;
/// One queue's figures: `workq`'s.
#[deprecated(since = "0.1.0", note = "use `workq::admin::QueueSummary`")]
pub type QueueSummary = workq::admin::QueueSummary;
