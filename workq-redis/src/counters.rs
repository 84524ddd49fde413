//! [`Counters`]: running totals a dashboard turns into rates.
//!
//! The scripts count in the queue's `meta` hash (`prefix:{name}:meta`): `adds` when an item
//! becomes dirty (client-go's `adds`: an add that queues it, a re-add while processing, a
//! delayed item coming due), `done` when a holder marks its item done, and `failures` on each
//! `add_rate_limited`.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::queue::RedisQueue;

/// Index of the `meta` hash in the queue's keys (see `scripts.rs`).
const META: usize = 13;

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
