//! [`AddKind`] and [`Added`]: what an add did on a backend that says so (the Redis and
//! PostgreSQL queues answer every add with one).

use std::time::Duration;

/// What an add did.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::{AddKind, Added};
///
/// let added = Added::new(AddKind::Delayed, 42, Duration::from_secs(5));
/// assert!(added.accepted());
/// assert!(!Added::IGNORED.accepted());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum AddKind {
    /// The queue (or the handle) is shut down: the add was ignored.
    Ignored,
    /// The item was queued (it was new, or waiting for a delay and is ready now).
    Queued,
    /// The item was already queued (or already due to be queued again when its lease ends):
    /// nothing changed but perhaps its priority.
    Duplicate,
    /// The item is being processed: it is queued again when its lease ends.
    Deferred,
    /// The item waits for its delay (the earliest of its pending delays).
    Delayed,
}

/// The outcome of an add on a backend that reports it (`add`, `add_after`,
/// `add_rate_limited` of the Redis and PostgreSQL queues).
///
/// Not `#[must_use]`: `queue.add(item).await?;` is the common call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Added {
    /// What the add did.
    pub kind: AddKind,
    /// The add's place in the queue's order, from the sequence that also issues lease
    /// tokens: a lease of the item whose token is larger was handed out after the add took
    /// effect, so its handler sees what the add announced. Zero when the add was ignored.
    pub seq: u64,
    /// The delay the item got (for a rate-limited add, the rate limiter's answer).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "delay_s", with = "crate::admin::serde_helpers::secs")
    )]
    pub delay: Duration,
}

impl Added {
    /// The answer to an add the queue ignored because it is shut down.
    pub const IGNORED: Added = Added::new(AddKind::Ignored, 0, Duration::ZERO);

    /// An add that did `kind`, at `seq` in the queue's order, with `delay`.
    pub const fn new(kind: AddKind, seq: u64, delay: Duration) -> Self {
        Added { kind, seq, delay }
    }

    /// Whether the queue took the add (anything but [`AddKind::Ignored`]): what
    /// [`Queue::add_with`](crate::Queue::add_with) answers.
    pub fn accepted(&self) -> bool {
        self.kind != AddKind::Ignored
    }
}
