//! One queue's figures, as operators look at them: the [`Stats`] snapshot (the core's, with
//! the figures a listing shows, read by the same `figures.lua`), the sizes of the queue's
//! parts, and the [`Counters`], running totals a dashboard turns into rates.
//!
//! The scripts count in the queue's `meta` hash (`prefix:{name}:meta`): `adds` when an item
//! becomes dirty (client-go's `adds`: an add that queues it, a re-add while processing, a
//! delayed item coming due), `done` when a holder marks its item done, and `failures` on each
//! `add_rate_limited`.

use std::time::Duration;

use redis::{ParsingError, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{Counters, InFlight, LeaseInfo, QueueSummary, Stats};

use crate::error::Error;
use crate::flow;
use crate::queue::RedisQueue;
use crate::reply::{count, number, parts, parts_ref, span, text};
use crate::scripts::SCRIPTS;
use crate::units::saturated;

/// Index of the `meta` hash in the queue's keys (see `scripts.rs`).
const META: usize = 13;

/// Queue `name`'s figures as `figures()` (`figures.lua`) read them at the server's time
/// `now` (microseconds), and whether any of the queue's keys exists.
pub(crate) fn figures(
    name: &str,
    now: i64,
    f: &[Value],
) -> Result<(QueueSummary, bool), ParsingError> {
    if f.len() < 18 {
        return Err(format!("short figures: {} fields", f.len()).into());
    }
    let oldest = match &f[13] {
        Value::BulkString(b) if b.is_empty() => None,
        other => Some(number(other)?),
    };
    let mut summary = QueueSummary::named(name);
    summary.depth = count(&f[0])?;
    summary.delayed = count(&f[1])?;
    summary.in_flight = count(&f[2])?;
    // `dirty` holds the ready items and the leased ones re-added meanwhile (common.lua's
    // invariant: an item is ready exactly when it is dirty and not leased).
    summary.in_flight_dirty = count(&f[3])?.saturating_sub(summary.depth);
    summary.failing = count(&f[4])?;
    summary.stalled = count(&f[5])?;
    summary.dead = count(&f[6])?;
    summary.shut_down = number(&f[7])? == 1;
    summary.paused = number(&f[8])? == 1;
    summary.dead_dropped = count(&f[9])?;
    summary.counters = Some(Counters::new(
        count(&f[10])?,
        count(&f[11])?,
        count(&f[12])?,
    ));
    summary.longest_lease = oldest.map_or(Duration::ZERO, |t| span(t, now));
    summary.lease_age_sum = Duration::from_micros(count(&f[14])?);
    summary.failures = count(&f[16])?;
    Ok((summary, count(&f[17])? > 0))
}

/// Reads the reply of the `stats` script of queue `name` (see `stats.lua` for its fields):
/// the [`Stats`], and whether any of the queue's keys exists.
fn parse_stats(name: &str, value: Value) -> Result<(Stats, bool), ParsingError> {
    let parts = parts(value)?;
    if parts.len() < 5 {
        return Err(format!("short stats reply: {} fields", parts.len()).into());
    }
    let now = number(&parts[0])?;
    let (summary, exists) = figures(name, now, parts_ref(&parts[1])?)?;
    let leases = parts_ref(&parts[2])?
        .chunks(4)
        .map(|c| match c {
            [item, since, deadline, token] => Ok(InFlight::new(
                text(item)?,
                LeaseInfo::new(
                    span(number(since)?, now),
                    span(now, number(deadline)?),
                    count(token)?,
                ),
            )),
            _ => Err(ParsingError::from("a partial in-flight entry".to_owned())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut failures = parts_ref(&parts[3])?
        .chunks(2)
        .map(|c| match c {
            [item, n] => Ok((text(item)?, saturated(count(n)?))),
            _ => Err(ParsingError::from("a partial failure entry".to_owned())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let next = number(&parts[4])?;
    let mut stats = Stats::new(summary);
    stats.next_delayed_in = (next >= 0).then(|| span(now, next));
    stats.leases = leases;
    stats.failures = failures;
    if let Some(flow) = parts.get(5) {
        flow::fill_stats(&mut stats, now, flow).map_err(|e| ParsingError::from(e.to_string()))?;
    }
    Ok((stats, exists))
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// A snapshot of the queue for operators, taken atomically on the server: its figures
    /// (paused and shut down included, as a listing shows them), the time until the next
    /// delayed item is due, and at most `limit` of its leases (nearest deadline first) and
    /// of its failure counts (largest first). With flow control, also the groups at a glance
    /// ([`Stats::flow`]: groups with ready items, at their limit, and kept, the last being
    /// those with ready items or leases out, or a bucket still refilling), the `limit` groups
    /// with the most ready items ([`Stats::groups`], with their leases out, limit and the age
    /// of their oldest ready item) and the settings ([`Stats::limits`]).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn stats(&self, limit: usize) -> Result<Stats, Error> {
        Ok(self.stats_and_existence(limit).await?.0)
    }

    /// [`stats`](Self::stats), and whether any of the queue's keys exists (a queue with none
    /// holds nothing and has never counted anything).
    pub(crate) async fn stats_and_existence(&self, limit: usize) -> Result<(Stats, bool), Error> {
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
        parse_stats(&self.inner.name, value).map_err(|e| Error::Protocol(format!("stats: {e}")))
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

    /// The queue's running totals since it was created, for every process: adds (items
    /// that became dirty), completions (leases marked done) and retries (calls of
    /// `add_rate_limited`).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn counters(&self) -> Result<Counters, Error> {
        let (adds, completions, retries): (Option<u64>, Option<u64>, Option<u64>) = self
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
        Ok(Counters::new(
            adds.unwrap_or(0),
            completions.unwrap_or(0),
            retries.unwrap_or(0),
        ))
    }
}
