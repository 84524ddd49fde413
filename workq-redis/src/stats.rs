//! One queue's figures, as operators look at them: the [`Stats`] snapshot, the sizes of the
//! queue's parts, and the [`Counters`], running totals a dashboard turns into rates.
//!
//! The scripts count in the queue's `meta` hash (`prefix:{name}:meta`): `adds` when an item
//! becomes dirty (client-go's `adds`: an add that queues it, a re-add while processing, a
//! delayed item coming due), `done` when a holder marks its item done, and `failures` on each
//! `add_rate_limited`.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::queue::RedisQueue;
use crate::reply::{self, count, number, parts, parts_ref, span, text};
use crate::scripts::SCRIPTS;

/// Index of the `meta` hash in the queue's keys (see `scripts.rs`).
const META: usize = 13;

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

/// The reply of the `stats` script (see `stats.lua` for its fields).
struct StatsReply(Stats);

impl FromRedisValue for StatsReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let parts = parts(value)?;
        if parts.len() < 12 {
            return Err(format!("short stats reply: {} fields", parts.len()).into());
        }
        let now = number(&parts[0])?;
        let leases = parts_ref(&parts[9])?
            .chunks(4)
            .map(|c| match c {
                [item, since, deadline, token] => Ok(InFlight {
                    item: text(item)?,
                    age: span(number(since)?, now),
                    expires_in: span(now, number(deadline)?),
                    token: count(token)?,
                }),
                _ => Err(ParsingError::from("a partial in-flight entry".to_owned())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut failures = parts_ref(&parts[10])?
            .chunks(2)
            .map(|c| match c {
                [item, n] => Ok((text(item)?, count(n)?)),
                _ => Err(ParsingError::from("a partial failure entry".to_owned())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let next = number(&parts[11])?;
        let depth = count(&parts[1])? as usize;
        let dirty = count(&parts[4])? as usize;
        Ok(StatsReply(Stats {
            depth,
            delayed: count(&parts[2])? as usize,
            in_flight: count(&parts[3])? as usize,
            in_flight_dirty: dirty.saturating_sub(depth),
            failing: count(&parts[5])? as usize,
            stalled: count(&parts[6])? as usize,
            dead: count(&parts[7])? as usize,
            dead_dropped: parts.get(12).map(count).transpose()?.unwrap_or(0),
            shut_down: number(&parts[8])? == 1,
            next_delayed_in: (next >= 0).then(|| span(now, next)),
            leases,
            failures,
        }))
    }
}

/// Running totals of a queue since it was created (for every process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Items that became dirty: client-go's `adds_total`.
    pub adds: u64,
    /// Leases marked done.
    pub completions: u64,
    /// Calls of `add_rate_limited`: the failures workers reported.
    pub failures: u64,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// A snapshot of the queue for operators (see [`Stats`]), listing at most `limit`
    /// in-flight items and failure counts.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn stats(&self, limit: usize) -> Result<Stats, Error> {
        let value: Value = self
            .inner
            .call("stats", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.stats)
                    .arg(limit.max(1))
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(reply::parse::<StatsReply>("stats", value)?.0)
    }

    async fn sizes(&self) -> Result<(usize, usize, usize), Error> {
        self.inner
            .call("len", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.len)
                    .arg(self.inner.max_stalls)
                    .arg(self.inner.dead_letter_cap)
                    .invoke_async(&mut con)
                    .await
            })
            .await
    }

    /// The number of items ready to hand out now (not delayed ones, not the ones being
    /// processed): client-go's `Len`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.0)
    }

    /// Whether no item is ready to hand out now.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The number of items waiting for a delay.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn delayed_len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.1)
    }

    /// The number of items under a lease, in every process.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn processing_len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.2)
    }

    /// The queue's [`Counters`].
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn counters(&self) -> Result<Counters, Error> {
        let (adds, completions, failures): (Option<u64>, Option<u64>, Option<u64>) = self
            .inner
            .call("counters", |mut con| async move {
                redis::cmd("HMGET")
                    .arg(&self.inner.keys.all[META])
                    .arg("adds")
                    .arg("done")
                    .arg("failures")
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(Counters {
            adds: adds.unwrap_or(0),
            completions: completions.unwrap_or(0),
            failures: failures.unwrap_or(0),
        })
    }
}
