//! [`Stats`] and [`DeadLetter`]: what operators look at.

use std::time::Duration;

use redis::Value;

use crate::error::Error;
use crate::queue::Inner;
use crate::reply::{self, StatsReply};
use crate::scripts::SCRIPTS;

/// One item under a lease, as [`Stats`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlight {
    /// The item as stored (its JSON text).
    pub item: String,
    /// How long ago it was handed out (server clock).
    pub age: Duration,
    /// How long until its lease expires if not renewed; zero if it already has.
    pub expires_in: Duration,
    /// The fencing token of its lease.
    pub token: u64,
}

/// A snapshot of a queue, taken atomically on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Items ready to hand out (client-go's `Len`; due delayed items not yet promoted are in
    /// `delayed`).
    pub depth: usize,
    /// Items waiting for a delay.
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items under a lease that were re-added meanwhile (queued again when their lease ends).
    pub in_flight_dirty: usize,
    /// Items with a failure count (tracked by `add_rate_limited`, reset by `forget`).
    pub failing: usize,
    /// Items whose lease expired at least once and was reclaimed.
    pub stalled: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by the cap ([`Builder::dead_letter_cap`](crate::Builder::dead_letter_cap)),
    /// oldest first, since the queue was created.
    pub dead_dropped: u64,
    /// Whether the queue is shut down.
    pub shut_down: bool,
    /// Time until the next delayed item is due, if any.
    pub next_delayed_in: Option<Duration>,
    /// The in-flight items with the oldest lease deadlines first (at most the requested
    /// number).
    pub leases: Vec<InFlight>,
    /// Failure counts (at most the requested number), largest first.
    pub failures: Vec<(String, u64)>,
}

pub(crate) async fn read(inner: &Inner, limit: usize) -> Result<Stats, Error> {
    let value: Value = inner
        .call("stats", |mut con| async move {
            inner
                .invocation(&SCRIPTS.stats)
                .arg(limit.max(1))
                .invoke_async(&mut con)
                .await
        })
        .await?;
    Ok(reply::parse::<StatsReply>("stats", value)?.0)
}

/// An item moved aside instead of being handed out again: it could not be deserialized (or
/// was not valid UTF-8), or its workers kept dying ([`max_stalls`](crate::Builder::max_stalls)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The item as stored (its JSON text; invalid UTF-8 shown with replacement characters).
    pub item: String,
    /// Why it was moved: the deserialization error, or the expired leases.
    pub error: String,
    /// When it was moved, in milliseconds since the Unix epoch (server clock).
    pub at_ms: u64,
    /// Its leases that had expired in a row when it was moved.
    pub stalls: u64,
    /// Its failure count (`add_rate_limited` since the last `forget`) when it was moved; the
    /// queue's count was cleared.
    pub failures: u64,
    /// The fencing token of its last lease.
    pub token: u64,
    /// The stored entry, byte for byte: what `requeue_dead_letter` finds it by.
    pub(crate) entry: Vec<u8>,
}

/// A number field of a dead letter (numbers or decimal strings).
fn number(value: &serde_json::Value) -> u64 {
    match value {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f as u64)),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or(0)
}

pub(crate) async fn dead_letters(inner: &Inner, limit: usize) -> Result<Vec<DeadLetter>, Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let entries: Vec<Vec<u8>> = inner
        .call("dead_letters", |mut con| async move {
            redis::cmd("LRANGE")
                .arg(inner.keys.dead())
                .arg(0)
                .arg(limit as i64 - 1)
                .query_async(&mut con)
                .await
        })
        .await?;
    Ok(entries
        .into_iter()
        .map(|entry| {
            // Entries are JSON written by the scripts, but an item that was not valid UTF-8
            // makes one invalid too: read it leniently.
            let text = String::from_utf8_lossy(&entry);
            let value: serde_json::Value =
                serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
            DeadLetter {
                item: value["item"].as_str().unwrap_or(&text).to_owned(),
                error: value["error"].as_str().unwrap_or_default().to_owned(),
                at_ms: number(&value["at_ms"]),
                stalls: number(&value["stalls"]),
                failures: number(&value["failures"]),
                token: number(&value["token"]),
                entry,
            }
        })
        .collect())
}
