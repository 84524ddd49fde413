//! The operator's contract: one [`Admin`] trait and one set of types for every backend's
//! queues, what the dashboard and `wq queue` show and do.
//!
//! ```
//! use workq::WorkQueue;
//! use workq::admin::{Admin, AdminError, MemoryAdmin};
//!
//! # futures::executor::block_on(async {
//! // The queues of this process report to a `MemoryAdmin`...
//! let memory = MemoryAdmin::new();
//! let queue: WorkQueue<String> =
//!     WorkQueue::builder().name("pods").metrics(memory.clone()).build();
//! queue.add("default/web-0".to_owned());
//! queue.add("default/web-1".to_owned());
//! let lease = queue.try_get().unwrap();
//!
//! // ...which operators read like any other backend, through `dyn Admin`.
//! let admin: Box<dyn Admin> = Box::new(memory);
//! assert_eq!(admin.kind(), "memory");
//! let pods = &admin.queues().await.unwrap()[0];
//! assert_eq!((pods.name.as_str(), pods.depth, pods.in_flight), ("pods", 1, 1));
//! assert_eq!(admin.summary("nodes").await, Err(AdminError::NotFound));
//! // In-process queues are read-only: pausing is for the shared backends.
//! assert!(!admin.capabilities().actions);
//! assert_eq!(admin.pause("pods").await, Err(AdminError::Unsupported));
//! drop(lease);
//! # });
//! ```
//!
//! # The contract
//!
//! [`Admin`] is implemented by `workq_redis::RedisAdmin` (every queue under a key prefix of
//! a Redis server or cluster), `workq_postgres::PgAdmin` (every queue of a database) and
//! [`MemoryAdmin`] (the queues of this process). It is dyn-compatible: its methods return
//! [`BoxFuture`]s, so a dashboard holds many backends in one list and a command line picks
//! one at run time. Operator calls are not on a hot path; the [`Queue`](crate::Queue) trait,
//! which is, keeps unboxed futures.
//!
//! Queues are named by `&str`, items by their stored JSON text, dead letters by
//! [`DeadLetter::id`]. Every type here has one meaning per field and one integer type per
//! quantity: item counts are `u64`, per-item counters (failures, stalls) `u32`, tokens `u64`,
//! priorities `i32`, positions `u64`, spans [`Duration`](std::time::Duration), instants
//! [`SystemTime`](std::time::SystemTime), limits the caller gives `usize`.
//!
//! The structs are `#[non_exhaustive]`, so fields can be added without breaking anyone: a
//! backend makes one with its constructor (`QueueSummary::named`, `Stats::new`, ...) and
//! sets the public fields.
//!
//! [`act`] does an [`Action`] through any `Admin` and says what it did ([`ActionOutcome`]),
//! with the messages every client shows.
//!
//! # Features
//!
//! - `serde`: `Serialize` and `Deserialize` for every type here (and for
//!   [`Added`](crate::Added)), with the names of the dashboard's JSON API: spans are seconds
//!   in fields named `*_s` (`age_s`, `due_in_s`, `expires_in_s`, `next_delayed_in_s`,
//!   `oldest_ready_s`; [`QueueSummary::longest_lease`] is `longest_running_s` and
//!   [`QueueSummary::lease_age_sum`] `unfinished_work_s`, Kubernetes' names), instants are
//!   milliseconds since the Unix epoch (`at_ms`), enums are `snake_case`, and a
//!   [`QueueSummary`]'s counters are flat (`adds_total`, `completions_total`,
//!   `retries_total`, each `null` without counters); a [`Stats`]' summary is nested under
//!   `summary`.
//! - `redact`: `redact_url` and `redact_urls_in`, which take the passwords out of server
//!   URLs before they are shown or logged (on the `url` crate).

mod action;
mod dead_letter;
mod items;
mod memory;
#[cfg(feature = "redact")]
mod redact;
#[cfg(feature = "serde")]
pub(crate) mod serde_helpers;
mod summary;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::periodic::ScheduleInfo;

pub use action::{Action, ActionOutcome, act};
pub use dead_letter::DeadLetter;
pub use items::{
    End, ItemDetail, ItemState, MAX_PAGE_LIMIT, Page, PageEntry, PageQuery, Removed, Retried,
};
pub use memory::MemoryAdmin;
#[cfg(feature = "redact")]
pub use redact::{redact_url, redact_urls_in};
pub use summary::{Counters, InFlight, LeaseInfo, QueueSummary, Stats};

/// A boxed `Send` future: what [`Admin`]'s methods return, so that `dyn Admin` exists.
///
/// An implementation writes `Box::pin(async move { ... })`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a backend answers besides figures ([`Admin::capabilities`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Capabilities {
    /// [`page`](Admin::page) and [`item_detail`](Admin::item_detail) answer.
    pub items: bool,
    /// The actions answer: [`pause`](Admin::pause) down to
    /// [`purge_dead_letters`](Admin::purge_dead_letters).
    pub actions: bool,
}

impl Capabilities {
    /// Everything: items and actions (the Redis and PostgreSQL backends).
    pub const fn all() -> Self {
        Capabilities {
            items: true,
            actions: true,
        }
    }

    /// Figures only: [`queues`](Admin::queues), [`summary`](Admin::summary) and
    /// [`stats`](Admin::stats) ([`MemoryAdmin`]).
    pub const fn figures_only() -> Self {
        Capabilities {
            items: false,
            actions: false,
        }
    }
}

/// A server's health as the last call found it ([`Admin::status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ServerStatus {
    /// The last call reached the server.
    pub up: bool,
    /// Why not, when it did not (no secret in it).
    pub error: Option<String>,
    /// Where the queues live, for people: a URL with no password.
    pub server: String,
    /// Settings that can lose acknowledged work, one sentence each.
    pub warnings: Vec<String>,
    /// The durability settings as one line (Redis: `appendonly`, `appendfsync`,
    /// `maxmemory-policy`, the version), when read.
    pub details: Option<String>,
}

impl ServerStatus {
    /// A server `up` or not, at `server` (a URL with no password), with no error, warning or
    /// detail.
    pub fn new(up: bool, server: impl Into<String>) -> Self {
        ServerStatus {
            up,
            server: server.into(),
            ..ServerStatus::default()
        }
    }
}

/// Why an operator call failed.
///
/// Messages hold no secret: a backend takes passwords out before it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum AdminError {
    /// No such queue, item or dead letter.
    NotFound,
    /// This backend cannot do that ([`Capabilities`]).
    Unsupported,
    /// The request was wrong: a malformed item text, cursor, id or queue name.
    BadRequest(String),
    /// Refused because the queue is shut down for every process; nothing changed.
    ShutDown,
    /// The server cannot be reached; the backend answers again by itself once it is back.
    Unavailable(String),
    /// Anything else the backend reported.
    Backend(String),
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::NotFound => f.write_str("not found"),
            AdminError::Unsupported => f.write_str("this source cannot do that"),
            AdminError::BadRequest(m) => write!(f, "bad request: {m}"),
            AdminError::ShutDown => f.write_str("the queue is shut down"),
            AdminError::Unavailable(m) => write!(f, "server unavailable: {m}"),
            AdminError::Backend(m) => write!(f, "backend error: {m}"),
        }
    }
}

impl std::error::Error for AdminError {}

/// What a provided method answers: the backend has no such call.
fn unsupported<'a, T: Send + 'a>() -> BoxFuture<'a, Result<T, AdminError>> {
    Box::pin(std::future::ready(Err(AdminError::Unsupported)))
}

/// The operator's contract: every queue of one server (a Redis server or cluster under a
/// key prefix, a PostgreSQL database, the queues of this process), what they hold, and the
/// switches and actions an operator uses.
///
/// Implemented by `workq_redis::RedisAdmin`, `workq_postgres::PgAdmin` and
/// [`MemoryAdmin`]; used as `Box<dyn Admin>` or `Arc<dyn Admin>` by the dashboard and
/// `wq queue`. See the [module documentation](self) for an example.
///
/// # The rules every implementation keeps
///
/// - Queues are named by `&str`, items by their stored JSON text, dead letters by
///   [`DeadLetter::id`]. An item action given a text that is not JSON answers
///   [`AdminError::BadRequest`].
/// - A call on a queue the backend does not know answers [`AdminError::NotFound`] and
///   creates nothing.
/// - Actions are idempotent: repeated, they change nothing more and say so (`false`, `0`,
///   [`Retried::AlreadyQueued`], a [`Removed`] with nothing in it).
/// - Every call does bounded work on the server (a bulk action runs in batches, a search
///   looks at a bounded number of entries per page).
/// - An implementation holds a small fixed number of connections whatever the number of
///   queues, answers [`AdminError::Unavailable`] within a few seconds while its server is
///   down, and answers again without a restart once it is back.
/// - [`capabilities`](Self::capabilities) tells the truth: a backend that promises items or
///   actions implements every method of that group (the provided methods answer
///   [`AdminError::Unsupported`]).
///
/// # Implementing it
///
/// `kind`, `capabilities`, `status`, `queues`, `summary` and `stats` are required; the rest
/// answer [`AdminError::Unsupported`] unless implemented. Methods return
/// `Box::pin(async move { ... })`.
pub trait Admin: Send + Sync + fmt::Debug {
    /// The backend's name: `"redis"`, `"postgres"`, `"memory"` (the dashboard's label and
    /// `/metrics`' `source`).
    fn kind(&self) -> &'static str;

    /// What this backend answers beyond figures.
    fn capabilities(&self) -> Capabilities;

    /// The server's health as the last call found it (no round trip).
    fn status(&self) -> ServerStatus;

    /// Every queue with its figures, sorted by name, in a bounded number of round trips
    /// whatever the number of queues. A queue that cannot be read is listed with
    /// [`QueueSummary::broken`] set; only a failure of the server itself is an error.
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>>;

    /// One queue's figures; [`AdminError::NotFound`] for an unknown queue.
    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>>;

    /// One queue's figures with at most `limit` of its leases (nearest deadline first) and
    /// of its failure counts (largest first).
    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>>;

    /// One page of a queue's items in one state (bounded work per call).
    fn page<'a>(
        &'a self,
        queue: &'a str,
        query: &'a PageQuery,
    ) -> BoxFuture<'a, Result<Page, AdminError>> {
        let _ = (queue, query);
        unsupported()
    }

    /// Everything known of one item; `Ok(None)` if the queue knows nothing of it.
    fn item_detail<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
        let _ = (queue, item);
        unsupported()
    }

    /// Pauses hand-outs for every process (adds go on); `true` if it was running.
    fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// Ends a pause; `true` if it was paused.
    fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// Shuts the queue down for every process (client-go's `ShutDown` of the shared queue);
    /// `true` if it was running.
    fn shut_down_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// Ends a shut down for every process; `true` if it was shut down.
    fn resume_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// "Run it now": a delayed or failing item is added as an `add` would (a leased one when
    /// its lease ends); its failure count stays.
    fn retry_now<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        let _ = (queue, item);
        unsupported()
    }

    /// Takes an item out: ready or delayed, it goes; leased, its pending re-add goes and the
    /// lease stays; unless leased, its failure and stall counts are cleared. Its dead letters
    /// stay.
    fn remove<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Removed, AdminError>> {
        let _ = (queue, item);
        unsupported()
    }

    /// Clears an item's failure count (client-go's `Forget`); answers the count it had.
    fn forget<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<u32, AdminError>> {
        let _ = (queue, item);
        unsupported()
    }

    /// The queue's periodic schedules ([`crate::periodic`]), by name: each one's spec,
    /// last and next tick, and whether it is paused. A read, so not behind
    /// [`capabilities`](Self::capabilities)' `actions`; the provided method answers
    /// [`AdminError::Unsupported`].
    fn schedules<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ScheduleInfo>, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// Pauses (`paused = true`) or resumes one of the queue's periodic schedules for every
    /// process, as a runner's `PeriodicHandle::pause` and `resume` do: its runners go on taking its ticks and add nothing for them while it is
    /// paused, and the ticks skipped are never caught up. Answers whether it changed
    /// anything (`false`: it was paused, or running, already). An action, behind
    /// [`capabilities`](Self::capabilities)' `actions`: [`AdminError::NotFound`] for an
    /// unknown queue or a schedule the queue does not have (none is created).
    fn pause_schedule<'a>(
        &'a self,
        queue: &'a str,
        schedule: &'a str,
        paused: bool,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = (queue, schedule, paused);
        unsupported()
    }

    /// At most `limit` dead letters from `from`'s end ([`End::First`]: oldest first).
    fn dead_letters<'a>(
        &'a self,
        queue: &'a str,
        from: End,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
        let _ = (queue, from, limit);
        unsupported()
    }

    /// Queues a dead letter's item again as a fresh item and removes the letter; `false` if
    /// the letter is gone.
    fn requeue_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = (queue, id);
        unsupported()
    }

    /// Requeues every dead letter, oldest first, in batches; answers how many.
    fn requeue_dead_letters<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<u64, AdminError>> {
        let _ = queue;
        unsupported()
    }

    /// Deletes one dead letter; `false` if it is gone.
    fn delete_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        let _ = (queue, id);
        unsupported()
    }

    /// Deletes every dead letter, in batches that do not block the server; answers how many.
    fn purge_dead_letters<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        let _ = queue;
        unsupported()
    }
}

/// Forwards every method to the `Admin` behind the pointer, so that `Box<dyn Admin>` and
/// `Arc<dyn Admin>` are `Admin`s too.
macro_rules! forward_admin {
    ($($pointer:ident)::+) => {
        impl<A: Admin + ?Sized> Admin for $($pointer)::+<A> {
            fn kind(&self) -> &'static str {
                (**self).kind()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn status(&self) -> ServerStatus {
                (**self).status()
            }
            fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
                (**self).queues()
            }
            fn summary<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
                (**self).summary(queue)
            }
            fn stats<'a>(
                &'a self,
                queue: &'a str,
                limit: usize,
            ) -> BoxFuture<'a, Result<Stats, AdminError>> {
                (**self).stats(queue, limit)
            }
            fn page<'a>(
                &'a self,
                queue: &'a str,
                query: &'a PageQuery,
            ) -> BoxFuture<'a, Result<Page, AdminError>> {
                (**self).page(queue, query)
            }
            fn item_detail<'a>(
                &'a self,
                queue: &'a str,
                item: &'a str,
            ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
                (**self).item_detail(queue, item)
            }
            fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).pause(queue)
            }
            fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).resume(queue)
            }
            fn shut_down_fleet<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).shut_down_fleet(queue)
            }
            fn resume_fleet<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).resume_fleet(queue)
            }
            fn retry_now<'a>(
                &'a self,
                queue: &'a str,
                item: &'a str,
            ) -> BoxFuture<'a, Result<Retried, AdminError>> {
                (**self).retry_now(queue, item)
            }
            fn remove<'a>(
                &'a self,
                queue: &'a str,
                item: &'a str,
            ) -> BoxFuture<'a, Result<Removed, AdminError>> {
                (**self).remove(queue, item)
            }
            fn forget<'a>(
                &'a self,
                queue: &'a str,
                item: &'a str,
            ) -> BoxFuture<'a, Result<u32, AdminError>> {
                (**self).forget(queue, item)
            }
            fn schedules<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<Vec<ScheduleInfo>, AdminError>> {
                (**self).schedules(queue)
            }
            fn pause_schedule<'a>(
                &'a self,
                queue: &'a str,
                schedule: &'a str,
                paused: bool,
            ) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).pause_schedule(queue, schedule, paused)
            }
            fn dead_letters<'a>(
                &'a self,
                queue: &'a str,
                from: End,
                limit: usize,
            ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
                (**self).dead_letters(queue, from, limit)
            }
            fn requeue_dead_letter_by_id<'a>(
                &'a self,
                queue: &'a str,
                id: &'a str,
            ) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).requeue_dead_letter_by_id(queue, id)
            }
            fn requeue_dead_letters<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<u64, AdminError>> {
                (**self).requeue_dead_letters(queue)
            }
            fn delete_dead_letter_by_id<'a>(
                &'a self,
                queue: &'a str,
                id: &'a str,
            ) -> BoxFuture<'a, Result<bool, AdminError>> {
                (**self).delete_dead_letter_by_id(queue, id)
            }
            fn purge_dead_letters<'a>(
                &'a self,
                queue: &'a str,
            ) -> BoxFuture<'a, Result<u64, AdminError>> {
                (**self).purge_dead_letters(queue)
            }
        }
    };
}

forward_admin!(Box);
forward_admin!(Arc);
