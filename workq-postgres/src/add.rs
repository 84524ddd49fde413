//! Adds: one by one, in batches, on the queue's pool or inside the caller's transaction, and
//! what each did (`workq`'s [`AddKind`] and [`Added`]); a failed item's re-add and done in
//! one step (`retry_and_done`); and the rate limiter's `forget` and `num_requeues`.
//!
//! Every add is one call of `workqueue_enqueue`, which takes a batch: one statement (so one
//! commit outside a transaction), rows locked in key order (concurrent batches cannot
//! deadlock), one `NOTIFY` per statement, and exactly the rules of adding the items one by one
//! in order. With a group function (flow control), each item's group is computed here, in the
//! adding process, and sent with it.

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgExecutor};
use workq::flow::GroupFn;
use workq::{AddKind, AddOptions, Added};

use crate::error::Error;
use crate::flow::check_group;
use crate::inner::pause_after;
use crate::lease::Lease;
use crate::queue::PgQueue;
use crate::units::{count, deadline_after, micros};

/// The kind of add `workqueue_add` answers with a number.
fn kind_of(code: i16) -> AddKind {
    match code {
        1 => AddKind::Queued,
        2 => AddKind::Duplicate,
        3 => AddKind::Deferred,
        4 => AddKind::Delayed,
        _ => AddKind::Ignored,
    }
}

/// Items per statement in a batched add: large enough that a batch pays one round trip and
/// one commit for many items, small enough that one statement does not hold its row locks
/// long.
const CHUNK: usize = 1000;

/// Bytes of item text per statement in a batched add (a chunk ends early at this size).
const CHUNK_BYTES: usize = 8 << 20;

/// The row `workqueue_enqueue` returns: per item its kind, delay (microseconds) and place,
/// and the version of the queue's flow settings.
type AddRow = (Vec<i16>, Vec<i64>, Vec<i64>, Option<i64>);

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Adds `item`: client-go's `Add`. An item already queued is not queued twice; an item
    /// being processed is queued again once its lease is done. One statement, committed on
    /// its own.
    ///
    /// # Errors
    ///
    /// [`Error::Serialize`], or a database error that outlasted the retry deadline (then the
    /// add may or may not have been applied; adding again is harmless).
    pub async fn add(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_with(item, AddOptions::default()).await
    }

    /// Adds `item` once `delay` has passed: client-go's `AddAfter`. Of several pending
    /// delays the earliest wins.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_after(&self, item: impl Borrow<T>, delay: Duration) -> Result<Added, Error> {
        self.add_with(item, AddOptions::default().after(delay))
            .await
    }

    /// Adds `item` after the rate limiter's delay and counts a failure of it: client-go's
    /// `AddRateLimited`. The count and the add are one statement.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_rate_limited(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_with(item, AddOptions::default().rate_limited())
            .await
    }

    /// Adds `item` with a delay, rate limiting and a priority as `options` say, with the
    /// in-memory queue's rules: higher priorities first, FIFO within one, a re-add raises a
    /// priority and never lowers it, a delayed item keeps its priority.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_with(
        &self,
        item: impl Borrow<T>,
        options: AddOptions,
    ) -> Result<Added, Error> {
        let added = self.add_all_with([(item, options)]).await?;
        Ok(added.into_iter().next().unwrap_or(Added::IGNORED))
    }

    /// Adds every item, as [`add`](Self::add) does one by one, in one statement and one
    /// commit (per thousand items): the same dedup, the same order, the same re-add rules.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add); after an error, a prefix of whole thousands of the adds
    /// may have been applied.
    pub async fn add_all<I>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator,
        I::Item: Borrow<T>,
    {
        self.add_all_with(items.into_iter().map(|item| (item, AddOptions::default())))
            .await
    }

    /// Adds every item after its delay, as [`add_after`](Self::add_after) does one by one,
    /// in one statement (per thousand items).
    ///
    /// # Errors
    ///
    /// As for [`add_all`](Self::add_all).
    pub async fn add_all_after<I, B>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, Duration)>,
        B: Borrow<T>,
    {
        self.add_all_with(
            items
                .into_iter()
                .map(|(item, delay)| (item, AddOptions::default().after(delay))),
        )
        .await
    }

    /// Adds every item with its options, as [`add_with`](Self::add_with) does one by one,
    /// in one statement (per thousand items).
    ///
    /// # Errors
    ///
    /// As for [`add_all`](Self::add_all).
    pub async fn add_all_with<I, B>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, AddOptions)>,
        B: Borrow<T>,
    {
        let batch = Batch::encode(items, self.group.as_ref())?;
        if self.is_closed() {
            return Ok(vec![Added::IGNORED; batch.len()]);
        }
        let mut added = Vec::with_capacity(batch.len());
        for chunk in batch.chunks() {
            let applied = self
                .inner
                .call("add", || self.add_chunk(&self.inner.pool, &chunk))
                .await?;
            added.extend(applied);
        }
        Ok(added)
    }

    /// [`add`](Self::add) inside the caller's transaction (pass `&mut tx`): committed, the
    /// item is queued and a worker woken; rolled back, nothing happened.
    ///
    /// Run it at `READ COMMITTED` (PostgreSQL's default). Nothing is retried: an error
    /// leaves the transaction for the caller to roll back.
    ///
    /// # Errors
    ///
    /// [`Error::Serialize`], or the database's error.
    pub async fn add_in(
        &self,
        conn: &mut PgConnection,
        item: impl Borrow<T>,
    ) -> Result<Added, Error> {
        self.add_with_in(conn, item, AddOptions::default()).await
    }

    /// [`add_after`](Self::add_after) inside the caller's transaction (see
    /// [`add_in`](Self::add_in)). The delay counts from the add, not from the commit.
    ///
    /// # Errors
    ///
    /// As for [`add_in`](Self::add_in).
    pub async fn add_after_in(
        &self,
        conn: &mut PgConnection,
        item: impl Borrow<T>,
        delay: Duration,
    ) -> Result<Added, Error> {
        self.add_with_in(conn, item, AddOptions::default().after(delay))
            .await
    }

    /// [`add_with`](Self::add_with) inside the caller's transaction (see
    /// [`add_in`](Self::add_in)). A rate-limited add counts its failure in the transaction
    /// too.
    ///
    /// # Errors
    ///
    /// As for [`add_in`](Self::add_in).
    pub async fn add_with_in(
        &self,
        conn: &mut PgConnection,
        item: impl Borrow<T>,
        options: AddOptions,
    ) -> Result<Added, Error> {
        let added = self.add_all_with_in(conn, [(item, options)]).await?;
        Ok(added.into_iter().next().unwrap_or(Added::IGNORED))
    }

    /// [`add_all`](Self::add_all) inside the caller's transaction (see
    /// [`add_in`](Self::add_in)): one statement per thousand items, one `NOTIFY` each, all
    /// delivered at the commit.
    ///
    /// # Errors
    ///
    /// As for [`add_in`](Self::add_in).
    pub async fn add_all_in<I>(
        &self,
        conn: &mut PgConnection,
        items: I,
    ) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator,
        I::Item: Borrow<T>,
    {
        self.add_all_with_in(
            conn,
            items.into_iter().map(|item| (item, AddOptions::default())),
        )
        .await
    }

    /// [`add_all_after`](Self::add_all_after) inside the caller's transaction (see
    /// [`add_in`](Self::add_in)).
    ///
    /// # Errors
    ///
    /// As for [`add_in`](Self::add_in).
    pub async fn add_all_after_in<I, B>(
        &self,
        conn: &mut PgConnection,
        items: I,
    ) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, Duration)>,
        B: Borrow<T>,
    {
        self.add_all_with_in(
            conn,
            items
                .into_iter()
                .map(|(item, delay)| (item, AddOptions::default().after(delay))),
        )
        .await
    }

    /// [`add_all_with`](Self::add_all_with) inside the caller's transaction (see
    /// [`add_in`](Self::add_in)).
    ///
    /// # Errors
    ///
    /// As for [`add_in`](Self::add_in).
    pub async fn add_all_with_in<I, B>(
        &self,
        conn: &mut PgConnection,
        items: I,
    ) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, AddOptions)>,
        B: Borrow<T>,
    {
        let batch = Batch::encode(items, self.group.as_ref())?;
        if self.is_closed() {
            return Ok(vec![Added::IGNORED; batch.len()]);
        }
        let mut added = Vec::with_capacity(batch.len());
        for chunk in batch.chunks() {
            added.extend(self.add_chunk(&mut *conn, &chunk).await?);
        }
        Ok(added)
    }

    /// One call of `workqueue_enqueue` on `conn` for items already stored as text (`raws`),
    /// each with `options`, in the groups `groups` (`None`: none given, as for an operator's
    /// add; under flow control they go to the group `""`).
    pub(crate) async fn add_texts<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        raws: &[String],
        groups: Option<&[String]>,
        options: &AddOptions,
    ) -> Result<Vec<Added>, sqlx::Error> {
        let n = raws.len();
        let priorities = vec![options.requested_priority(); n];
        let delays = vec![micros(options.delay()); n];
        let limited = vec![options.is_rate_limited(); n];
        let chunk = Chunk {
            raws,
            groups,
            priorities: &priorities,
            delays: &delays,
            limited: &limited,
        };
        self.add_chunk(conn, &chunk).await
    }

    /// One call of `workqueue_enqueue` for `chunk` on `conn`.
    async fn add_chunk<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        chunk: &Chunk<'_>,
    ) -> Result<Vec<Added>, sqlx::Error> {
        let (interval, burst) = self.inner.bucket();
        let (kinds, delays, seqs, flow_version): AddRow = sqlx::query_as(
            "SELECT kinds, delays, seqs, flow_version
             FROM workqueue_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(self.inner.id)
        .bind(chunk.raws)
        .bind(chunk.groups)
        .bind(chunk.priorities)
        .bind(chunk.delays)
        .bind(chunk.limited)
        .bind(micros(self.inner.base_delay))
        .bind(micros(self.inner.max_delay))
        .bind(interval)
        .bind(burst)
        .fetch_one(conn)
        .await?;
        self.inner.saw_flow_version(flow_version);
        Ok(kinds
            .iter()
            .zip(&delays)
            .zip(&seqs)
            .map(|((&kind, &delay), &seq)| match kind_of(kind) {
                AddKind::Ignored => Added::IGNORED,
                kind => Added::new(
                    kind,
                    seq.unsigned_abs(),
                    Duration::from_micros(delay.max(0).unsigned_abs()),
                ),
            })
            .collect())
    }

    /// A failed item's step: re-adds `lease`'s item as `options` say (rate-limited: the
    /// limiter's delay, counting a failure; or after a delay; with a priority), after
    /// forgetting its failures if `forget`, then marks the lease done, in one call of
    /// `workqueue_retry_done`. The re-add is exactly [`add_with`](Self::add_with)'s, made while
    /// the lease is held: the item is queued again once the lease is done, or when its delay
    /// is due.
    ///
    /// Fenced like [`Lease::done`]: if the lease is no longer this holder's (it expired and
    /// was taken back), nothing changes, no failure is counted, nothing is forgotten or
    /// re-added, and the answer is [`Error::LeaseLost`]. `Ok(None)`: re-added and done.
    /// `Ok(Some(lease))`: this handle, or the queue, is shut down and refused the re-add;
    /// nothing changed, and the lease is handed back (still held) for the caller to end.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`]; [`Error::OutcomeUnknown`] if the connection failed and a retry
    /// found the lease gone; a database error that outlasted the retries. After an error
    /// other than [`Error::LeaseLost`] the item is handed out again once its lease expires.
    pub async fn retry_and_done(
        &self,
        lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        if self.is_closed() {
            return Ok(Some(lease));
        }
        // In a task of its own: a caller that stops waiting leaves the step to finish.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let queue = self.clone();
        tokio::spawn(async move {
            let _ = tx.send(queue.retry_and_done_owned(lease, options, forget).await);
        });
        rx.await
            .map_err(|_| Error::Protocol("the retry task stopped".into()))?
    }

    async fn retry_and_done_owned(
        &self,
        mut lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        let inner = &self.inner;
        // The lease is renewed until the outcome is known (the call may wait for the row).
        let claim = lease.claim();
        let token = inner.faults.token_for(&inner.pool, inner.id, claim).await;
        let (interval, burst) = inner.bucket();
        let give_up = deadline_after(inner.lease.max(inner.retry_deadline));
        let mut backoff = Duration::from_millis(20);
        let mut unsure = false;
        let outcome = loop {
            let reply: Result<(i32, i64), sqlx::Error> = sqlx::query_as(
                "SELECT outcome, delay
                 FROM workqueue_retry_done($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(inner.id)
            .bind(claim.key.as_slice())
            .bind(token)
            .bind(forget)
            .bind(options.requested_priority())
            .bind(micros(options.delay()))
            .bind(options.is_rate_limited())
            .bind(micros(inner.base_delay))
            .bind(micros(inner.max_delay))
            .bind(interval)
            .bind(burst)
            .fetch_one(&inner.pool)
            .await;
            match reply {
                Ok((outcome, _)) => break Ok(outcome),
                Err(e) => {
                    let e = Error::from(e);
                    let pause = pause_after(&e, backoff);
                    if !e.is_transient()
                        || give_up.saturating_duration_since(Instant::now()) <= pause
                    {
                        break Err(if unsure { Error::OutcomeUnknown } else { e });
                    }
                    if !e.is_rolled_back() {
                        unsure = true;
                    }
                    tokio::time::sleep(pause).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        };
        match outcome {
            // Shut down: nothing changed, the lease is the caller's still.
            Ok(3) => Ok(Some(lease)),
            Ok(1 | 2) => {
                lease.finish_for_call();
                Ok(None)
            }
            Ok(_) if unsure => {
                lease.finish_for_call();
                Err(Error::OutcomeUnknown)
            }
            Ok(_) => {
                lease.finish_for_call();
                Err(Error::LeaseLost)
            }
            Err(error) => {
                lease.finish_for_call();
                Err(error)
            }
        }
    }

    /// The rate limiter stops tracking `item`: client-go's `Forget`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn forget(&self, item: impl Borrow<T>) -> Result<(), Error> {
        let raw = Self::encode(item.borrow())?;
        self.inner
            .call("forget", || {
                sqlx::query(
                    "DELETE FROM workqueue_failures WHERE queue = $1 AND key = workqueue_key($2)",
                )
                .bind(self.inner.id)
                .bind(&raw)
                .execute(&self.inner.pool)
            })
            .await?;
        Ok(())
    }

    /// How many times the rate limiter delayed `item` since it was last forgotten:
    /// client-go's `NumRequeues`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn num_requeues(&self, item: impl Borrow<T>) -> Result<usize, Error> {
        let raw = Self::encode(item.borrow())?;
        let n: Option<i32> = self
            .inner
            .call("num_requeues", || {
                sqlx::query_scalar(
                    "SELECT failures FROM workqueue_failures
                     WHERE queue = $1 AND key = workqueue_key($2)",
                )
                .bind(self.inner.id)
                .bind(&raw)
                .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(count(n.unwrap_or(0).into()))
    }
}

/// A batch of adds, encoded for `workqueue_enqueue`.
struct Batch {
    raws: Vec<String>,
    /// Each item's group, when the queue has a group function.
    groups: Option<Vec<String>>,
    priorities: Vec<Option<i32>>,
    delays: Vec<i64>,
    limited: Vec<bool>,
}

/// A slice of a [`Batch`] that goes in one statement.
struct Chunk<'a> {
    raws: &'a [String],
    groups: Option<&'a [String]>,
    priorities: &'a [Option<i32>],
    delays: &'a [i64],
    limited: &'a [bool],
}

impl Batch {
    /// The items as text, each with its group (`group`'s name for it, checked) and options.
    fn encode<T: Serialize, I, B>(items: I, group: Option<&GroupFn<T>>) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (B, AddOptions)>,
        B: Borrow<T>,
    {
        let items = items.into_iter();
        let n = items.size_hint().0;
        let mut batch = Batch {
            raws: Vec::with_capacity(n),
            groups: group.map(|_| Vec::with_capacity(n)),
            priorities: Vec::with_capacity(n),
            delays: Vec::with_capacity(n),
            limited: Vec::with_capacity(n),
        };
        for (item, options) in items {
            let item = item.borrow();
            batch
                .raws
                .push(serde_json::to_string(item).map_err(Error::Serialize)?);
            if let (Some(group), Some(groups)) = (group, batch.groups.as_mut()) {
                let name = group(item);
                check_group(&name)?;
                groups.push(name);
            }
            batch.priorities.push(options.requested_priority());
            batch.delays.push(micros(options.delay()));
            batch.limited.push(options.is_rate_limited());
        }
        Ok(batch)
    }

    fn len(&self) -> usize {
        self.raws.len()
    }

    /// The statements' shares: at most [`CHUNK`] items and about [`CHUNK_BYTES`] of text
    /// each (one large item is a chunk of its own).
    fn chunks(&self) -> Vec<Chunk<'_>> {
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < self.raws.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < self.raws.len()
                && end - start < CHUNK
                && (end == start || bytes + self.raws[end].len() <= CHUNK_BYTES)
            {
                bytes += self.raws[end].len();
                end += 1;
            }
            chunks.push(Chunk {
                raws: &self.raws[start..end],
                groups: self.groups.as_deref().map(|groups| &groups[start..end]),
                priorities: &self.priorities[start..end],
                delays: &self.delays[start..end],
                limited: &self.limited[start..end],
            });
            start = end;
        }
        chunks
    }
}
