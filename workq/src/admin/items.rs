//! A queue's items as operators see them: pages of one state ([`PageQuery`], [`Page`],
//! [`PageEntry`]), one item ([`ItemDetail`]), and what the item actions did ([`Retried`],
//! [`Removed`]).

use std::time::Duration;

use super::{DeadLetter, LeaseInfo};

/// The states an item can be listed in; a [`Page`] lists one.
///
/// An item may be in several at once: failing and delayed (a rate-limited retry), failing
/// and in flight, in flight and dead (an earlier hand-out of it was moved aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ItemState {
    /// Ready to hand out: highest priority first, then the moment each became ready.
    Ready,
    /// Waiting for a delay (not leased), soonest due first.
    Delayed,
    /// Under a lease, nearest deadline first.
    InFlight,
    /// With a failure count, in the backend's key order (an [`End`] applies; cursors are
    /// opaque).
    Failing,
    /// Dead letters, oldest first.
    Dead,
}

impl ItemState {
    /// Every state, in the order above.
    pub const ALL: [ItemState; 5] = [
        ItemState::Ready,
        ItemState::Delayed,
        ItemState::InFlight,
        ItemState::Failing,
        ItemState::Dead,
    ];

    /// The state's name as the JSON API and the command line write it: `ready`, `delayed`,
    /// `in_flight`, `failing`, `dead`.
    pub fn name(self) -> &'static str {
        match self {
            ItemState::Ready => "ready",
            ItemState::Delayed => "delayed",
            ItemState::InFlight => "in_flight",
            ItemState::Failing => "failing",
            ItemState::Dead => "dead",
        }
    }
}

/// Which end of a state's order a page starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum End {
    /// The first in the state's order: the next out, the soonest due, the oldest dead letter.
    #[default]
    First,
    /// The last: the last out, the latest due, the newest dead letter.
    Last,
}

/// The most entries one page holds; a larger [`PageQuery::limit`] is clamped to it.
pub const MAX_PAGE_LIMIT: usize = 1000;

/// A request for one page of a queue's items in one state ([`Admin::page`]).
///
/// [`Admin::page`]: super::Admin::page
///
/// # Examples
///
/// ```
/// use workq::admin::{End, ItemState, MAX_PAGE_LIMIT, PageQuery};
///
/// let query = PageQuery::new(ItemState::Dead, 50)
///     .from(End::Last)
///     .search(Some("timeout".to_owned()));
/// assert_eq!((query.state, query.from, query.limit), (ItemState::Dead, End::Last, 50));
/// assert_eq!(PageQuery::new(ItemState::Ready, 0).effective_limit(), 1);
/// assert_eq!(PageQuery::new(ItemState::Ready, 1 << 20).effective_limit(), MAX_PAGE_LIMIT);
/// assert_eq!(PageQuery::new(ItemState::Ready, 10).search(Some(String::new())).search, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PageQuery {
    /// Which items.
    pub state: ItemState,
    /// From which end of the state's order.
    #[cfg_attr(feature = "serde", serde(default))]
    pub from: End,
    /// Where to start: `None` for the end itself, else a [`Page::next`] (or
    /// [`prev`](Page::prev)) of a page of the same state, end and search. Cursors are the
    /// backend's own (an offset, a key, a scan position): pass them back as they are.
    #[cfg_attr(feature = "serde", serde(default))]
    pub cursor: Option<String>,
    /// At most this many entries (clamped to 1..=[`MAX_PAGE_LIMIT`]: see
    /// [`effective_limit`](Self::effective_limit)).
    pub limit: usize,
    /// Only items whose text (dead letters: or error) contains this, in any case.
    #[cfg_attr(feature = "serde", serde(default))]
    pub search: Option<String>,
}

impl PageQuery {
    /// The first page of at most `limit` items in `state`, from the [`End::First`], with no
    /// search.
    pub fn new(state: ItemState, limit: usize) -> Self {
        PageQuery {
            state,
            from: End::First,
            cursor: None,
            limit,
            search: None,
        }
    }

    /// Starts from `end` of the state's order.
    #[must_use]
    pub fn from(mut self, end: End) -> Self {
        self.from = end;
        self
    }

    /// Starts at `cursor` (a [`Page::next`] or [`Page::prev`]); `None`: at the end itself.
    #[must_use]
    pub fn cursor(mut self, cursor: Option<String>) -> Self {
        self.cursor = cursor;
        self
    }

    /// Lists only the items whose text (dead letters: or error) contains `search`, in any
    /// case; an empty search is none.
    #[must_use]
    pub fn search(mut self, search: Option<String>) -> Self {
        self.search = search.filter(|s| !s.is_empty());
        self
    }

    /// Starts from the last item of the state's order when `from_last`, else from the first.
    #[deprecated(since = "0.1.0", note = "use `from(End::Last)`")]
    #[must_use]
    pub fn from_last(self, from_last: bool) -> Self {
        self.from(if from_last { End::Last } else { End::First })
    }

    /// The number of entries a backend lists at most: [`limit`](Self::limit) clamped to
    /// 1..=[`MAX_PAGE_LIMIT`].
    pub fn effective_limit(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE_LIMIT)
    }
}

/// One page of items ([`Admin::page`](super::Admin::page)).
///
/// Every call does bounded work on the server: with a search, a page may hold fewer entries
/// than asked (none, even) and still have a [`next`](Self::next).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Page {
    /// The entries, in the state's order from the requested end.
    pub items: Vec<PageEntry>,
    /// How many items are in the state, whatever the search (see
    /// [`capped_at`](Self::capped_at)).
    pub total: u64,
    /// The cursor of the page further from the end, if anything is left to look at.
    pub next: Option<String>,
    /// The cursor of the page nearer the end, when the backend can go back (Redis's
    /// offsets); a client keeps the cursors it came through otherwise.
    pub prev: Option<String>,
    /// Where the backend stopped counting `total`, if it caps the count so that a page of a
    /// state of millions of items stays cheap; `None`: `total` is exact. With a cap, a total
    /// greater than it (`capped_at + 1`) means "more than `capped_at`"
    /// ([`total_is_capped`](Self::total_is_capped)), as in
    /// [`QueueSummary::capped_at`](super::QueueSummary::capped_at).
    #[cfg_attr(feature = "serde", serde(default))]
    pub capped_at: Option<u64>,
}

impl Page {
    /// A last page (no `next`, no `prev`) holding `items`, of `total` in the state.
    pub fn new(items: Vec<PageEntry>, total: u64) -> Self {
        Page {
            items,
            total,
            next: None,
            prev: None,
            capped_at: None,
        }
    }

    /// Whether [`total`](Self::total) stopped at the cap: it means "more than
    /// [`capped_at`](Self::capped_at)".
    pub fn total_is_capped(&self) -> bool {
        self.capped_at.is_some_and(|cap| self.total > cap)
    }
}

/// One item of a page, with what its state says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PageEntry {
    /// The item as stored (its JSON text): what the item actions take.
    pub item: String,
    /// The state it was listed in.
    pub state: ItemState,
    /// Ready or delayed: its priority.
    pub priority: Option<i32>,
    /// Delayed: time until due (zero when due and not promoted yet).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "due_in_s", with = "super::serde_helpers::opt_secs", default)
    )]
    pub due_in: Option<Duration>,
    /// In flight: its lease.
    pub lease: Option<LeaseInfo>,
    /// Failing: its failure count.
    pub failures: Option<u32>,
    /// Dead: the dead letter.
    pub dead: Option<DeadLetter>,
}

impl PageEntry {
    /// `item`, listed in `state`, with nothing else known.
    pub fn new(item: impl Into<String>, state: ItemState) -> Self {
        PageEntry {
            item: item.into(),
            state,
            priority: None,
            due_in: None,
            lease: None,
            failures: None,
            dead: None,
        }
    }
}

/// Everything a backend knows about one item ([`Admin::item_detail`]).
///
/// [`Admin::item_detail`]: super::Admin::item_detail
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ItemDetail {
    /// The item as stored (its JSON text).
    pub item: String,
    /// Every state it is in, [`ItemState::Dead`] included when it has dead letters; in the
    /// order of [`ItemState::ALL`].
    pub states: Vec<ItemState>,
    /// The priority it is queued or delayed at, or the highest its re-adds gave while
    /// leased; `None` when no add of it is pending.
    pub priority: Option<i32>,
    /// When ready: how many items go before it (0: next out); `None` if it is not ready or
    /// the backend did not find it within its search bound.
    pub position: Option<u64>,
    /// When delayed: time until due (zero when due and not promoted yet).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "due_in_s", with = "super::serde_helpers::opt_secs", default)
    )]
    pub due_in: Option<Duration>,
    /// When in flight: its lease.
    pub lease: Option<LeaseInfo>,
    /// The priority its current lease was handed out with, where the backend keeps it.
    pub lease_priority: Option<i32>,
    /// Re-added while processing: queued again when its lease ends.
    pub readded: bool,
    /// Its failure count.
    pub failures: u32,
    /// Its leases that expired in a row.
    pub stalls: u32,
    /// Its recent dead letters, oldest first (a backend keeps a bounded look: Redis among
    /// the newest 1,000 of the queue, PostgreSQL the item's newest ten).
    pub dead_letters: Vec<DeadLetter>,
}

impl ItemDetail {
    /// `item`, in no state, with nothing known.
    pub fn new(item: impl Into<String>) -> Self {
        ItemDetail {
            item: item.into(),
            states: Vec::new(),
            priority: None,
            position: None,
            due_in: None,
            lease: None,
            lease_priority: None,
            readded: false,
            failures: 0,
            stalls: 0,
            dead_letters: Vec::new(),
        }
    }
}

/// What "retry now" did ([`Admin::retry_now`](super::Admin::retry_now)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Retried {
    /// It was delayed or failing: it is ready now (its delay, if any, is gone).
    Queued,
    /// It is being processed and was waiting for a delay or failing: it is queued again when
    /// its lease ends.
    Deferred,
    /// It was queued already (or queued again already for when its lease ends): nothing
    /// changed.
    AlreadyQueued,
    /// It is being processed with no add pending: nothing to bring forward.
    InFlight,
    /// The queue is shut down for every process: nothing changed.
    ShutDown,
    /// The queue does not know the item (not delayed, not failing): nothing changed.
    Unknown,
}

/// What [`Admin::remove`](super::Admin::remove) took out of the queue.
///
/// Idempotent: a second call finds nothing ([`any`](Self::any) is `false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Removed {
    /// It was ready, and left the ready order.
    pub queued: bool,
    /// It waited for a delay, which is gone.
    pub delayed: bool,
    /// It was leased and re-added meanwhile: the pending re-add is dropped.
    pub readd: bool,
    /// Its failure (and stall) counts were cleared (never while it is leased).
    pub counts: bool,
    /// It is being processed: its lease stays with its holder.
    pub leased: bool,
}

impl Removed {
    /// Whether anything changed (`leased` alone is no change).
    pub fn any(&self) -> bool {
        self.queued || self.delayed || self.readd || self.counts
    }
}
