//! [`Source`]: where the dashboard reads queues from and acts on them, and the
//! backend-neutral views it answers with. One implementation per backend ([`RedisSource`],
//! [`MemorySource`], ...); nothing in the page, the API, `/metrics` or the audit log depends
//! on which.
//!
//! [`RedisSource`]: crate::RedisSource
//! [`MemorySource`]: crate::MemorySource

use std::future::Future;

use serde::{Deserialize, Serialize};

/// One queue's figures, as `/api/queues` lists them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct QueueView {
    /// The label of the source the queue comes from (`redis`, `postgres`, ...). Set by the
    /// dashboard: a [`Source`] leaves it empty.
    pub source: String,
    /// The queue's name.
    pub name: String,
    /// Why the queue cannot be read, when it cannot (a key of the wrong type, say): it is
    /// listed as broken, with zeros for its figures, and the other queues are not affected.
    pub broken: Option<String>,
    /// Items ready to hand out.
    pub depth: usize,
    /// Items waiting for a delay.
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items with a failure count.
    pub failing: usize,
    /// The sum of the items' failure counts (a source may sum only the first thousand).
    pub failures: u64,
    /// Items whose lease expired and was reclaimed (stalls).
    pub stalled: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by a cap.
    pub dead_dropped: u64,
    /// Whether `get` hands nothing out.
    pub paused: bool,
    /// Whether the queue is shut down.
    pub shut_down: bool,
    /// How long the oldest lease out has been held, in seconds.
    pub longest_running_s: f64,
    /// The sum of how long the leases out have been held, in seconds.
    pub unfinished_work_s: f64,
    /// Adds since the source started counting, where it counts them.
    pub adds_total: Option<u64>,
    /// Completed leases since the source started counting, where it counts them.
    pub completions_total: Option<u64>,
    /// Retries (failures reported with a rate-limited add) since the source started counting,
    /// where it counts them.
    pub retries_total: Option<u64>,
}

impl QueueView {
    /// A queue named `name` with every figure zero.
    pub fn named(name: impl Into<String>) -> Self {
        QueueView {
            name: name.into(),
            ..QueueView::default()
        }
    }

    /// A queue that cannot be read, and why.
    pub fn broken(name: impl Into<String>, why: impl Into<String>) -> Self {
        QueueView {
            broken: Some(why.into()),
            ..QueueView::named(name)
        }
    }
}

/// The states an item can be listed in ([`Source::items`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Ready to hand out, in hand-out order.
    Ready,
    /// Waiting for a delay, soonest due first.
    Delayed,
    /// Under a lease, nearest deadline first.
    InFlight,
    /// With a failure count (an item may be failing and delayed, or failing and in flight).
    Failing,
    /// Dead letters, oldest first.
    Dead,
}

/// Which end of a state's order a page starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// The first in the state's order: the next out, the soonest due, the oldest dead letter.
    #[default]
    First,
    /// The last: the last queued, the latest due, the newest dead letter.
    Last,
}

/// A request for one page of the items in one state of a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageRequest {
    /// Which items.
    pub state: ItemState,
    /// From which end of the state's order.
    pub from: End,
    /// Where to start: `None` for the end itself, else a cursor a previous page of the same
    /// state, end and search gave as its [`next`](ItemPage::next) or
    /// [`prev`](ItemPage::prev). Cursors are the source's own (an offset, a row id, a scan
    /// position); the dashboard never reads them.
    pub cursor: Option<String>,
    /// At most this many items (the dashboard asks for 1 to 500).
    pub limit: usize,
    /// Only items whose text (or, for dead letters, error) contains this, in any case.
    pub search: Option<String>,
}

/// An item's lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseView {
    /// Seconds since it was handed out.
    pub age_s: f64,
    /// Seconds until the lease expires if not renewed (0 when it has).
    pub expires_in_s: f64,
    /// The lease's fencing token: which hand-out holds it.
    pub token: u64,
    /// Who holds it, when the backend knows (a worker's name or address).
    pub holder: Option<String>,
}

/// A dead letter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadLetterView {
    /// The dead letter's identity among the queue's dead letters (the source's own: a stored
    /// entry, a row id), for [`Action::RequeueDeadLetter`] and [`Action::DeleteDeadLetter`].
    pub id: String,
    /// The item (its JSON text).
    pub item: String,
    /// Why it was moved aside.
    pub error: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its leases that expired in a row.
    pub stalls: u64,
    /// Its failure count when it was moved.
    pub failures: u64,
}

/// One item in a page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemView {
    /// The item (its JSON text): what item actions and [`Source::item`] take.
    pub item: String,
    /// The state it was listed in.
    pub state: ItemState,
    /// Ready: the priority it is queued at.
    pub priority: Option<i32>,
    /// Delayed: seconds until it is due.
    pub due_in_s: Option<f64>,
    /// In flight: its lease.
    pub lease: Option<LeaseView>,
    /// Failing: its failure count.
    pub failures: Option<u64>,
    /// Dead: the dead letter.
    pub dead: Option<DeadLetterView>,
}

impl ItemView {
    /// An item listed in `state` with nothing else known.
    pub fn new(item: impl Into<String>, state: ItemState) -> Self {
        ItemView {
            item: item.into(),
            state,
            priority: None,
            due_in_s: None,
            lease: None,
            failures: None,
            dead: None,
        }
    }
}

/// One page of items ([`Source::items`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemPage {
    /// The items, in the state's order from the requested end.
    pub items: Vec<ItemView>,
    /// How many items are in the state, whatever the search.
    pub total: u64,
    /// The cursor of the page further from the end, if anything is left to look at. With a
    /// search a page may hold fewer items than asked (the source bounds the work of one call)
    /// and still have a next one.
    pub next: Option<String>,
    /// The cursor of the page nearer the end, if the source can go back; the page also keeps
    /// the cursors it came through, so a source without it still pages back.
    pub prev: Option<String>,
}

/// Everything a source knows about one item ([`Source::item`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemDetail {
    /// The item (its JSON text).
    pub item: String,
    /// Every state it is in (none: the queue no longer knows it, bar its dead letters).
    pub states: Vec<ItemState>,
    /// The priority it is queued, delayed or re-added at.
    pub priority: Option<i32>,
    /// Its place in the hand-out order when ready (0: next out), if the source knows it.
    pub position: Option<u64>,
    /// Seconds until it is due, when it waits for a delay.
    pub due_in_s: Option<f64>,
    /// Its lease, when it is being processed.
    pub lease: Option<LeaseView>,
    /// Re-added while processing: queued again when its lease ends.
    pub readded: bool,
    /// Its failure count.
    pub failures: u64,
    /// Its leases that expired in a row.
    pub stalls: u64,
    /// Its dead letters (the recent ones), oldest first.
    pub dead_letters: Vec<DeadLetterView>,
}

/// What an operator can do to a queue or one of its items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// Stop handing out items (adds are still taken).
    Pause,
    /// Hand out items again.
    Resume,
    /// Requeue every dead letter.
    RequeueDeadLetters,
    /// Drop every dead letter, without blocking the server.
    PurgeDeadLetters,
    /// Requeue one dead letter, by its [`DeadLetterView::id`].
    RequeueDeadLetter {
        /// The dead letter.
        id: String,
    },
    /// Delete one dead letter, by its [`DeadLetterView::id`].
    DeleteDeadLetter {
        /// The dead letter.
        id: String,
    },
    /// Run a delayed or failing item now (its failure count stays).
    RetryNow {
        /// The item (its JSON text).
        item: String,
    },
    /// Take an item out of the queue (a lease out stays with its holder).
    Remove {
        /// The item (its JSON text).
        item: String,
    },
    /// Clear an item's failure count.
    Forget {
        /// The item (its JSON text).
        item: String,
    },
}

impl Action {
    /// The action's name, as the audit log and `/metrics` label it.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::RequeueDeadLetters => "requeue_dead_letters",
            Action::PurgeDeadLetters => "purge_dead_letters",
            Action::RequeueDeadLetter { .. } => "requeue_dead_letter",
            Action::DeleteDeadLetter { .. } => "delete_dead_letter",
            Action::RetryNow { .. } => "retry_now",
            Action::Remove { .. } => "remove",
            Action::Forget { .. } => "forget",
        }
    }

    /// The item or dead letter it names, if it names one.
    pub fn target(&self) -> Option<&str> {
        match self {
            Action::RequeueDeadLetter { id } | Action::DeleteDeadLetter { id } => Some(id),
            Action::RetryNow { item } | Action::Remove { item } | Action::Forget { item } => {
                Some(item)
            }
            _ => None,
        }
    }
}

/// What an action did: actions are idempotent, and a repeat answers `changed: 0` and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Outcome {
    /// How many things it changed (items moved, letters dropped; 0 or 1 for a switch).
    pub changed: u64,
    /// What it did, in a few words for the operator ("requeued 3 dead letters", "already
    /// paused", "queued now").
    pub message: String,
}

impl Outcome {
    /// An outcome of `changed` things, said as `message`.
    pub fn new(changed: u64, message: impl Into<String>) -> Self {
        Outcome {
            changed,
            message: message.into(),
        }
    }
}

/// A source's health, as the page shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceStatus {
    /// Whether its server answered the last call.
    pub up: bool,
    /// Why not, when it did not (the message holds no secret).
    pub error: Option<String>,
    /// Where its queues live, for the operator (a URL with no password).
    pub server: String,
    /// Warnings for the operator (server settings that can lose acknowledged work).
    pub warnings: Vec<String>,
}

/// An error of a [`Source`], shown to the operator (it must hold no secret).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceError {
    /// No such queue (or item).
    NotFound,
    /// The source cannot do this.
    Unsupported,
    /// The request was wrong (a bad item, say).
    BadRequest(String),
    /// The server cannot be reached: the page says it is down and keeps its charts.
    Unavailable(String),
    /// The backend failed otherwise.
    Backend(String),
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceError::NotFound => f.write_str("not found"),
            SourceError::Unsupported => f.write_str("this source cannot do that"),
            SourceError::BadRequest(m) => write!(f, "bad request: {m}"),
            SourceError::Unavailable(m) => write!(f, "server unavailable: {m}"),
            SourceError::Backend(m) => write!(f, "backend error: {m}"),
        }
    }
}

impl std::error::Error for SourceError {}

/// Where the dashboard reads its queues from, and acts on them: one implementation per
/// backend. The dashboard calls it from many requests at once, so it must be cheap to call
/// concurrently; it should hold a small fixed number of server connections whatever the
/// number of queues, and answer [`SourceError::Unavailable`] quickly (within a second or two)
/// while its server is down, then answer again once the server is back, without a restart.
pub trait Source: Send + Sync + 'static {
    /// The backend's name (`redis`, `postgres`, `memory`): the label of its queues on the
    /// page, in the API (`?source=`) and in `/metrics` (label `source`).
    fn kind(&self) -> &'static str;

    /// Whether [`act`](Self::act) can do anything at all.
    fn has_actions(&self) -> bool;

    /// Whether [`items`](Self::items) and [`item`](Self::item) can list items.
    fn has_items(&self) -> bool;

    /// Whether the server answers, where it is, and warnings for the operator.
    fn status(&self) -> impl Future<Output = SourceStatus> + Send;

    /// Every queue with its figures, sorted by name, in a bounded number of round trips
    /// whatever the number of queues. A queue that cannot be read is listed with
    /// [`QueueView::broken`] set; only a failure of the server itself is an error.
    fn queues(&self) -> impl Future<Output = Result<Vec<QueueView>, SourceError>> + Send;

    /// One queue's figures; [`SourceError::NotFound`] if there is no such queue.
    fn queue(&self, name: &str) -> impl Future<Output = Result<QueueView, SourceError>> + Send;

    /// One page of a queue's items in one state. A call must do bounded work on the server
    /// (a search of a million dead letters takes many calls, each short).
    fn items(
        &self,
        name: &str,
        request: &PageRequest,
    ) -> impl Future<Output = Result<ItemPage, SourceError>> + Send;

    /// Everything known about one item (its JSON text); [`SourceError::NotFound`] if the
    /// queue knows nothing of it.
    fn item(
        &self,
        name: &str,
        item: &str,
    ) -> impl Future<Output = Result<ItemDetail, SourceError>> + Send;

    /// Does `action` to queue `name`. Idempotent: repeating it changes nothing more, and the
    /// [`Outcome`] says so. A bulk action on a huge list must not block the server (batches,
    /// `UNLINK`).
    fn act(
        &self,
        name: &str,
        action: &Action,
    ) -> impl Future<Output = Result<Outcome, SourceError>> + Send;
}
