//! [`DeadLetter`]: an item moved aside instead of being handed out again.

use std::time::SystemTime;

/// An item moved aside instead of being handed out again: its text no longer deserializes,
/// or its leases kept expiring (its workers died holding it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its identity among the queue's dead letters, opaque: PostgreSQL's row id in decimal,
    /// Redis's stored entry (`hex:...` when not UTF-8). What the `*_by_id` calls take.
    pub id: String,
    /// The item as stored (its JSON text).
    pub item: String,
    /// Why it was moved: `stalled`, or the error that kept it from deserializing.
    pub error: String,
    /// When it was moved (the server's clock).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "at_ms", with = "super::serde_helpers::unix_ms")
    )]
    pub at: SystemTime,
    /// Its leases that had expired in a row then.
    pub stalls: u32,
    /// Its failure count then (the queue's count was cleared).
    pub failures: u32,
    /// The fencing token of its last lease, where the backend keeps it.
    pub token: Option<u64>,
}

impl DeadLetter {
    /// The dead letter `id` of `item`, with no error text, moved at the Unix epoch, with no
    /// counts: a backend sets the rest.
    pub fn new(id: impl Into<String>, item: impl Into<String>) -> Self {
        DeadLetter {
            id: id.into(),
            item: item.into(),
            error: String::new(),
            at: SystemTime::UNIX_EPOCH,
            stalls: 0,
            failures: 0,
            token: None,
        }
    }
}
