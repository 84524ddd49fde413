//! [`Stats`] and [`DeadLetter`]: what operators look at.

use std::time::Duration;

use redis::Value;

use crate::error::Error;
use crate::queue::Inner;
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

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(0, |f| f as i64),
        _ => 0,
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

pub(crate) async fn read(inner: &Inner, limit: usize) -> Result<Stats, Error> {
    let value: Value = inner
        .invocation(&SCRIPTS.stats)
        .arg(limit.max(1))
        .invoke_async(&mut inner.con.clone())
        .await?;
    let Value::Array(parts) = value else {
        return Err(Error::Protocol("stats: expected an array".into()));
    };
    if parts.len() < 12 {
        return Err(Error::Protocol("stats: short reply".into()));
    }
    let now = int(&parts[0]);
    let leases = match &parts[9] {
        Value::Array(flat) => flat
            .chunks(4)
            .filter(|c| c.len() == 4)
            .map(|c| InFlight {
                item: text(&c[0]),
                age: micros(now - int(&c[1])),
                expires_in: micros(int(&c[2]) - now),
                token: int(&c[3]).max(0) as u64,
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut failures: Vec<(String, u64)> = match &parts[10] {
        Value::Array(flat) => flat
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (text(&c[0]), int(&c[1]).max(0) as u64))
            .collect(),
        _ => Vec::new(),
    };
    failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let next = int(&parts[11]);
    let in_flight = int(&parts[3]).max(0) as usize;
    let dirty = int(&parts[4]).max(0) as usize;
    let depth = int(&parts[1]).max(0) as usize;
    Ok(Stats {
        depth,
        delayed: int(&parts[2]).max(0) as usize,
        in_flight,
        in_flight_dirty: dirty.saturating_sub(depth),
        failing: int(&parts[5]).max(0) as usize,
        stalled: int(&parts[6]).max(0) as usize,
        dead: int(&parts[7]).max(0) as usize,
        shut_down: int(&parts[8]) == 1,
        next_delayed_in: (next >= 0).then(|| micros(next - now)),
        leases,
        failures,
    })
}

/// An item that could not be deserialized, moved aside with its error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The item as stored (the text that failed to deserialize).
    pub item: String,
    /// The deserialization error.
    pub error: String,
    /// When it was moved, in milliseconds since the Unix epoch (server clock).
    pub at_ms: u64,
}

pub(crate) async fn dead_letters(inner: &Inner, limit: usize) -> Result<Vec<DeadLetter>, Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(inner.keys.dead())
        .arg(0)
        .arg(limit as i64 - 1)
        .query_async(&mut inner.con.clone())
        .await?;
    entries
        .iter()
        .map(|entry| {
            let value: serde_json::Value = serde_json::from_str(entry)
                .map_err(|e| Error::Protocol(format!("dead letter {entry:?}: {e}")))?;
            Ok(DeadLetter {
                item: value["item"].as_str().unwrap_or_default().to_owned(),
                error: value["error"].as_str().unwrap_or_default().to_owned(),
                at_ms: value["at_ms"].as_f64().unwrap_or(0.0) as u64,
            })
        })
        .collect()
}
