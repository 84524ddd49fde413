//! client-go's workqueue rules across many processes and machines, on Redis.
//!
//! [`RedisQueue`] has the methods of [`workq::WorkQueue`] with the same names and
//! meanings, made `async` because they talk to a server: [`add`](RedisQueue::add),
//! [`add_after`](RedisQueue::add_after), [`add_rate_limited`](RedisQueue::add_rate_limited),
//! [`add_with`](RedisQueue::add_with) (with a priority),
//! [`forget`](RedisQueue::forget), [`num_requeues`](RedisQueue::num_requeues),
//! [`len`](RedisQueue::len), [`get`](RedisQueue::get) returning a [`Lease`],
//! [`try_get`](RedisQueue::try_get) returning a [`TryGet`](workq::TryGet) (a lease, nothing ready, or shut
//! down), and [`shut_down`](RedisQueue::shut_down). Any number of worker processes on any
//! number of machines share one queue, and the rules hold across all of them:
//!
//! - **Dedup**: an item added many times before it is handed out is processed once.
//! - **Never two workers on one item**: while an item is leased, nobody else gets it.
//! - **Re-add while processing**: the item is handed out once more after its holder is done.
//! - **Earliest-wins delays** and **rate-limited retries** (the failure counts and the token
//!   bucket live on the server, so every process sees the same ones).
//! - **Shutdown**: [`shut_down`](RedisQueue::shut_down) stops one handle (one process's
//!   share), [`shut_down_fleet`](RedisQueue::shut_down_fleet) every process, until
//!   [`resume_fleet`](RedisQueue::resume_fleet).
//!
//! [`RedisQueue`] implements [`workq::Queue`], so [`workq::Workers`] run on it as on
//! the in-memory queue: `Workers::new(queue).count(8).max_retries(5).spawn_async(handler)`
//! gives the same retries, give-ups, panic isolation, timeouts, stop and summary. The pool
//! marks each lease done explicitly (a dropped lease is released here), adds a retry back
//! before its `done`, and rides out a server outage (it logs, backs off and keeps trying; an
//! item is never lost). Stopping the pool shuts down only this handle.
//!
//! **Priorities**: [`add_with`](RedisQueue::add_with) takes every [`workq::AddOptions`]
//! (delay, rate limiting, priority) with the in-memory rules: higher priorities first, FIFO
//! within a priority, a re-add raises a priority and never lowers it, a delayed item keeps its
//! priority, and an item re-added while processing is queued at the highest priority its
//! re-adds gave. [`Lease::priority`] is the priority an item was handed out with. Priority 0
//! lives in the queue's main ready list, so a queue that never uses priorities pays only one
//! extra key check per hand-out.
//!
//! # Flow control
//!
//! The in-memory builder's flow control ([`Builder::group_by`], [`Builder::group_weight`],
//! [`Builder::max_in_flight`], [`Builder::max_in_flight_per_group`],
//! [`Builder::group_max_in_flight`], [`Builder::hand_out_rate`],
//! [`Builder::hand_out_rate_per_group`], [`Builder::group_hand_out_rate`]) holds across the
//! whole fleet, each decision one script run on the server:
//!
//! - **Turns.** Within the highest priority that has ready work, getters take turns between
//!   groups (round robin; deficit round robin by weight), FIFO inside a group by the time an
//!   item became ready. Priorities stay strict. The group function runs in the adding process
//!   at every add and the group's name travels with the add; the server keeps an item's
//!   group while it holds the item (and a dead letter keeps it for a requeue).
//! - **Limits count every process's leases.** The counts live on the server and every
//!   decision reads them there, so `max_in_flight(8)` is eight leases over the fleet. A
//!   ready item of a group at its limit never holds back another group. When a lease ends
//!   (done, release, dead letter), its group takes its turns again and a getter held back
//!   wakes through the queue's wake-up, not a poll. An item re-added while processing still
//!   waits for its own done.
//! - **Lease expiry.** An expired lease frees its slot when it is reclaimed, which is at the
//!   next `get` after its deadline in any process: a getter held back by a limit sleeps no
//!   longer than the earliest lease deadline, so it makes that reclaim itself.
//! - **Hand-out rates** are token buckets (GCRA) on the server's clock, one for the queue and
//!   one per group, shared by the fleet; a getter waiting for a token sleeps until it is due
//!   (the script tells it when), and a group waiting for its own leaves its turns to others.
//!
//! ```no_run
//! use workq_redis::RedisQueue;
//!
//! # async fn run() -> Result<(), workq_redis::Error> {
//! // Namespaces take turns; at most 4 leases per namespace and 50 hand-outs a second over
//! // every process of the fleet.
//! let queue: RedisQueue<String> = RedisQueue::builder("pods")
//!     .url("redis://127.0.0.1:6379")
//!     .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
//!     .max_in_flight_per_group(4)
//!     .hand_out_rate(50.0, 10)
//!     .build()
//!     .await?;
//! queue.add("default/web-0".to_owned()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The settings are kept on the server beside the queue (`prefix:{name}:flow`), where every
//! process and [`RedisAdmin`] read them. **The last handle built with settings wins**: it
//! replaces other settings for every process (logging a warning), and a process built
//! earlier applies the new ones from its next decision and logs a warning once when it sees
//! the change. A handle built **without** any setting changes nothing on the server: on a
//! queue with flow control it follows the queue's settings, and its adds (no group function)
//! join the group `""`, with a warning at build; so an operator's handle or a producer built
//! without `group_by` cannot switch a fleet's flow control off by starting.
//! [`RedisQueue::clear_flow_control`] takes it off on purpose (the ready items then come out
//! in the order they became ready). The items a queue holds when flow control comes on join
//! the group `""`, its leases out counting there. docs/redis.md ("Redis and PostgreSQL: the
//! same rules, and where they differ") lists what flow control does otherwise on PostgreSQL:
//! an item's group while flow control is off (forgotten here), exact counts, the operators'
//! pages, when an expired lease's slot frees.
//!
//! A queue built without any flow setting keeps its structures, and a `get` runs the very
//! commands it ran before (the check for flow control rides on the check for priorities; an
//! add and a done pay one `EXISTS`). With flow control a decision costs O(1) commands in the
//! number of groups (about 30 for a `get` with a per-group limit, against 16; the rings are
//! pruned lazily, each entry once) and O(log n) in its sorted sets. Every key carries the
//! queue's hash tag (docs/redis.md lists them). [`RedisQueue::stats`] and the operator's
//! contract show the groups: how many have ready items, are at their limit and are kept, the
//! top groups by ready items with their leases out, limit and the age of their oldest ready
//! item, and the settings.
//!
//! # Traces across processes
//!
//! With the feature `otel` (which turns on `workq/otel`), an add made inside a span records
//! the span's W3C `traceparent` beside the item on the server, and the lease that hands the
//! item out, in whatever process, carries it: [`Lease::links`] (and
//! [`QueueLease::links`](workq::QueueLease::links)), so the `workqueue.item` span of
//! [`workq::Workers`] links to the span of every add that caused the work. An item keeps the
//! links of its first [`MAX_LINKS`](workq::otel::MAX_LINKS) adds since its last hand-out and
//! counts the rest ([`Lease::links_dropped`]): a hot key costs four links and a counter. Every
//! kind of add records its link (delays, rate limits, batches, with one link for the batch's
//! span, a retry of [`workq::Workers`], made in the worker's span, and a periodic tick), on a
//! plain or a grouped queue. Adds while an item is processed are kept for its next hand-out;
//! a lease released, or lost by a dead worker and reclaimed, gives its links back, so the
//! next holder links to them too; a dead letter keeps them for a requeue.
//!
//! An add outside a recorded span (or a client without the feature) sends nothing more, and
//! a queue that never saw a link runs the very commands it ran before. The server keeps only
//! well-formed `traceparent`s of 55 bytes, at most four per item, in four hashes of the
//! queue's hash tag (`links`, `ldrop`, `llinks`, `lldrop`; the repository's `docs/tracing.md`
//! has the design and the costs).
//!
//! ```no_run
//! # #[cfg(feature = "otel")]
//! # async fn run() -> Result<(), workq_redis::Error> {
//! use tracing::Instrument;
//! use workq::{Outcome, Workers};
//! use workq_redis::RedisQueue;
//!
//! // In the producer (a watch, an HTTP handler): the add records the current span.
//! let queue: RedisQueue<String> = RedisQueue::connect("redis://127.0.0.1:6379", "pods").await?;
//! queue
//!     .add("default/web-0".to_owned())
//!     .instrument(tracing::info_span!("pod changed"))
//!     .await?;
//!
//! // In a worker process: each item's `workqueue.item` span links to its adds.
//! let workers = Workers::new(queue).spawn_async(|key: String| async move {
//!     tracing::info!(%key, "reconciling");
//!     Outcome::Done
//! });
//! # workers.shut_down().await;
//! # Ok(())
//! # }
//! ```
//!
//! Each operation is one Lua script run on the server (`EVALSHA`), so each is atomic; every
//! key of a queue carries the queue's hash tag (`wq:{name}:...`), so a queue lives in one
//! Redis Cluster slot. No script has a switch that turns a rule off (fencing, the re-queue of
//! an item re-added while processing): the fault tests' deliberate bugs live in this crate's
//! client only, behind the feature `fault-injection`, which a deployment never enables.
//!
//! The failure path of [`workq::Workers`] is fenced like its `done`: a retry
//! ([`Queue::retry_and_done`](workq::Queue::retry_and_done): the re-add, rate limited or
//! after a delay, and the `done`) is one script run that changes nothing if the lease was
//! lost. A batched step of the pool (many workers' dones and their next items in one script
//! run) waits out transient server states as a single `done` does, its leases renewed until
//! the dones are through.
//!
//! # Crashes
//!
//! A [`Lease`] lasts a [lease duration](Builder::lease_duration) on the server's clock and is
//! renewed while held. A worker that dies (or stalls, or loses the network) past it loses the
//! item to the next `get`. Its fencing token stops it from marking the item done or clearing
//! the new holder's claim afterwards. An item whose workers keep dying can be moved to the
//! dead letters after [`max_stalls`](Builder::max_stalls) expired leases in a row (default
//! 5). Only [`Lease::done`] marks an item done: a lease dropped without it is released, and the
//! item is handed out again at once. Fencing tokens follow the server's clock, so they keep
//! growing across a restart from an older snapshot or a failover. Transient server states
//! (a restart, `LOADING`, `BUSY`, `READONLY`, ...) are waited out for up to
//! [`retry_deadline`](Builder::retry_deadline), and a full server still renews, finishes and
//! releases leases. The server must be Redis [`MIN_REDIS_VERSION`] (7.0) or newer. With the
//! server's `appendonly yes`,
//! `appendfsync always` and `maxmemory-policy noeviction`, nothing acknowledged is lost when
//! the server crashes either; [`RedisQueue::persistence`] reports the settings, and the queue
//! warns once at start when they cannot keep that promise, and once more when they change on
//! the running server ([`Builder::settings_check_interval`]).
//!
//! # Items
//!
//! Items are any `T: Serialize + DeserializeOwned`, stored as JSON text; the text is the
//! item's identity for dedup. A stored item that no longer deserializes (a changed type, a
//! hand-written entry, bytes that are not UTF-8) is moved to a dead-letter list with its error
//! ([`RedisQueue::dead_letters`], capped by [`Builder::dead_letter_cap`]) instead of being
//! handed out or dropped.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use workq_redis::RedisQueue;
//!
//! # async fn run() -> Result<(), workq_redis::Error> {
//! let queue: RedisQueue<String> = RedisQueue::builder("pods")
//!     .url("redis://127.0.0.1:6379")
//!     .lease_duration(Duration::from_secs(30))
//!     .build()
//!     .await?;
//! queue.add("default/web-0".to_string()).await?;
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

mod add;
mod admin;
mod backend;
mod builder;
mod connection;
mod control;
mod dead_letter;
mod error;
mod faults;
mod flow;
mod get;
mod inner;
mod inspect;
mod lease;
mod listing;
mod periodic;
mod persistence;
mod queue;
mod rate_limit;
mod reply;
mod scripts;
mod stats;
mod trace;
mod units;
mod wait;

pub use builder::Builder;
pub use connection::MIN_REDIS_VERSION;
pub use error::Error;
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub use faults::Mutation;
pub use inspect::SEARCH_BUDGET;
pub use lease::Lease;
pub use listing::RedisAdmin;
pub use persistence::{Persistence, SETTINGS_CHECK_INTERVAL};
pub use queue::RedisQueue;
pub use rate_limit::RateLimit;

// Names this crate had before the operator contract moved to the core, for one release: each
// is now the core's type (or was renamed), and a type alias carries the deprecation that a
// `pub use` cannot. The old names that another of the workq crates exports for something else
// (`Stats`, `Page`, `Summary`, ...) are gone: across the crates a public name means one thing.

/// Was this crate's operator handle; now [`RedisAdmin`].
#[deprecated(since = "0.1.0", note = "renamed `RedisAdmin`")]
pub type Admin = RedisAdmin;
/// Now the core's [`workq::admin::Counters`].
#[deprecated(since = "0.1.0", note = "use `workq::admin::Counters`")]
pub type Counters = workq::admin::Counters;
/// Now the core's [`workq::admin::End`].
#[deprecated(since = "0.1.0", note = "use `workq::admin::End`")]
pub type End = workq::admin::End;
/// Now the core's [`workq::admin::PageEntry`].
#[deprecated(since = "0.1.0", note = "use `workq::admin::PageEntry`")]
pub type PageEntry = workq::admin::PageEntry;
/// Now the core's [`workq::admin::Retried`].
#[deprecated(since = "0.1.0", note = "use `workq::admin::Retried`")]
pub type Retried = workq::admin::Retried;
