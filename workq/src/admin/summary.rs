//! A queue's figures: [`QueueSummary`], [`Counters`], [`Stats`], and the leases
//! ([`LeaseInfo`], [`InFlight`]) a listing shows.

use std::time::Duration;

use crate::flow::FlowLimits;
use crate::stats::{FlowStats, GroupStats};

/// One queue's figures, as a listing shows them ([`Admin::queues`], [`Admin::summary`]).
///
/// Counts of items are `u64` whatever the backend. A backend that cannot tell a figure
/// leaves it at zero (`None` for the optional ones); the in-memory queue, for one, knows no
/// failure counts.
///
/// [`Admin::queues`]: super::Admin::queues
/// [`Admin::summary`]: super::Admin::summary
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSummary {
    /// The queue's name.
    pub name: String,
    /// Why the queue's figures cannot be read (a key of the wrong type, a name no handle can
    /// open); the figures are zero then. `None` for a queue that was read.
    pub broken: Option<String>,
    /// Items ready to hand out, at every priority (client-go's `Len`; due delayed items not
    /// promoted yet are in `delayed`).
    pub depth: u64,
    /// Items waiting for a delay (or due and not promoted yet), not leased.
    pub delayed: u64,
    /// Items under a lease.
    pub in_flight: u64,
    /// Items under a lease that were re-added meanwhile (queued again when the lease ends;
    /// when the counts are capped, among the leases counted).
    pub in_flight_dirty: u64,
    /// Items with a failure count.
    pub failing: u64,
    /// The sum of the items' failure counts (a backend may sum only the first 1,000, or,
    /// when it caps its counts, the items it counted).
    pub failures: u64,
    /// Items whose lease expired at least once in a row and was taken back (when the counts
    /// are capped, among the ready and leased items counted).
    pub stalled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Dead letters dropped by the cap since the queue was created.
    pub dead_dropped: u64,
    /// Shut down for every process ([`Admin::shut_down_fleet`](super::Admin::shut_down_fleet)).
    pub shut_down: bool,
    /// Paused for every process ([`Admin::pause`](super::Admin::pause)).
    pub paused: bool,
    /// How long the oldest ready item has waited since it became ready; `None` when nothing
    /// is ready or the backend does not track it.
    pub oldest_ready: Option<Duration>,
    /// How long the oldest lease out has been held (the server's clock); zero when none is.
    /// Kubernetes' `longest_running_processor_seconds`.
    pub longest_lease: Duration,
    /// The sum of how long the leases out have been held: Kubernetes'
    /// `unfinished_work_seconds`.
    pub lease_age_sum: Duration,
    /// Running totals since the queue was created (or since this process counts them);
    /// `None` where the backend keeps none.
    pub counters: Option<Counters>,
    /// Where the backend stopped counting, if it caps its counts so that a look at a queue of
    /// millions of items stays cheap (PostgreSQL counts at most this many plus one of each
    /// state); `None`: every count is exact.
    ///
    /// With a cap, a count greater than it (`capped_at + 1`) means "more than `capped_at`",
    /// written `{capped_at}+` ([`is_capped`](Self::is_capped)); the counts at or under it are
    /// exact. The figures taken from the items of a state (`in_flight_dirty`, `stalled`,
    /// `failures`, `oldest_ready`, `lease_age_sum`) are then taken from the items counted.
    pub capped_at: Option<u64>,
}

impl QueueSummary {
    /// A queue named `name` with every figure zero.
    pub fn named(name: impl Into<String>) -> Self {
        QueueSummary {
            name: name.into(),
            ..QueueSummary::default()
        }
    }

    /// A queue that cannot be read, and why: listed with zeros for its figures.
    pub fn broken(name: impl Into<String>, why: impl Into<String>) -> Self {
        QueueSummary {
            broken: Some(why.into()),
            ..QueueSummary::named(name)
        }
    }

    /// Whether `count`, one of this summary's counts, stopped at the cap
    /// ([`capped_at`](Self::capped_at)): it means "more than `capped_at`".
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::admin::QueueSummary;
    ///
    /// let mut pods = QueueSummary::named("pods");
    /// pods.capped_at = Some(10_000);
    /// pods.depth = 10_001; // more than 10,000 ready
    /// pods.delayed = 10_000; // exactly 10,000 delayed
    /// assert!(pods.is_capped(pods.depth));
    /// assert!(!pods.is_capped(pods.delayed));
    /// assert!(!QueueSummary::named("exact").is_capped(u64::MAX));
    /// ```
    pub fn is_capped(&self, count: u64) -> bool {
        self.capped_at.is_some_and(|cap| count > cap)
    }
}

/// Running totals of a queue (every process), for rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Counters {
    /// Items that became dirty: client-go's `adds_total`.
    pub adds: u64,
    /// Leases marked done.
    pub completions: u64,
    /// Rate-limited adds: the failures workers reported (client-go's `retries_total`).
    pub retries: u64,
}

impl Counters {
    /// The totals as counted.
    pub fn new(adds: u64, completions: u64, retries: u64) -> Self {
        Counters {
            adds,
            completions,
            retries,
        }
    }
}

/// A queue's figures with its leases nearest their deadline and its largest failure counts
/// ([`Admin::stats`](super::Admin::stats)).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Stats {
    /// The figures, read with the lists below. (Nested in JSON, not flattened: the
    /// summary's `failures`, a sum, would clash with the list below.)
    pub summary: QueueSummary,
    /// Time until the next delayed item is due (zero if one is due already); `None` when
    /// nothing is delayed or the backend cannot tell.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "next_delayed_in_s",
            with = "super::serde_helpers::opt_secs",
            default
        )
    )]
    pub next_delayed_in: Option<Duration>,
    /// Leases out, nearest deadline first, at most the `limit` asked for.
    pub leases: Vec<InFlight>,
    /// Failure counts, largest first (then by item), at most the `limit` asked for.
    pub failures: Vec<(String, u32)>,
    /// Flow control at a glance (groups kept, with ready items, at their limit); `None` on a
    /// queue without flow control, or where the backend cannot tell.
    #[cfg_attr(feature = "serde", serde(default))]
    pub flow: Option<FlowStats>,
    /// The groups with the most ready items (then the most in flight, then by name), at
    /// most the `limit` asked for; empty on a queue without groups.
    #[cfg_attr(feature = "serde", serde(default))]
    pub groups: Vec<GroupStats>,
    /// The queue's flow control limits (in-flight limits, weights, hand-out rates), as every
    /// process of the queue applies them; `None` when it has none.
    #[cfg_attr(feature = "serde", serde(default))]
    pub limits: Option<FlowLimits>,
}

impl Stats {
    /// `summary` with no lease and no failure count listed.
    pub fn new(summary: QueueSummary) -> Self {
        Stats {
            summary,
            next_delayed_in: None,
            leases: Vec::new(),
            failures: Vec::new(),
            flow: None,
            groups: Vec::new(),
            limits: None,
        }
    }
}

/// A lease as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LeaseInfo {
    /// How long ago it was handed out (the server's clock).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "age_s", with = "super::serde_helpers::secs")
    )]
    pub age: Duration,
    /// How long until it expires if not renewed; zero if it has.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "expires_in_s", with = "super::serde_helpers::secs")
    )]
    pub expires_in: Duration,
    /// Its fencing token: which hand-out holds it.
    pub token: u64,
    /// Who holds it, when the backend knows (a worker's name or address).
    pub holder: Option<String>,
}

impl LeaseInfo {
    /// A lease of `age`, expiring in `expires_in`, with fencing token `token`; its holder
    /// unknown.
    pub fn new(age: Duration, expires_in: Duration, token: u64) -> Self {
        LeaseInfo {
            age,
            expires_in,
            token,
            holder: None,
        }
    }
}

/// One item under a lease ([`Stats::leases`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct InFlight {
    /// The item as stored (its JSON text).
    pub item: String,
    /// Its lease.
    pub lease: LeaseInfo,
}

impl InFlight {
    /// `item` under `lease`.
    pub fn new(item: impl Into<String>, lease: LeaseInfo) -> Self {
        InFlight {
            item: item.into(),
            lease,
        }
    }
}
