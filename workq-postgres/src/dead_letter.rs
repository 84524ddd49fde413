//! Dead letters: items given up on (their leases kept expiring, or their text no longer
//! deserializes), and the operator's ways to look at them, queue them again or delete them.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::queue::PgQueue;
use crate::units::count;

/// Dead letters moved or deleted per statement: a large list is worked through in steps that
/// each hold their locks briefly.
const STEP: i64 = 1000;

/// One item given up on: what [`PgQueue::dead_letters`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its place in the dead-letter table.
    pub id: i64,
    /// The item as stored (its JSON text).
    pub item: String,
    /// Why: `stalled` (its leases expired [`max_stalls`](crate::Builder::max_stalls) times in
    /// a row), or the error that kept it from deserializing.
    pub reason: String,
    /// Its expired leases in a row when it was given up.
    pub stalls: u32,
    /// Its rate limiter's failure count then.
    pub failures: u32,
    /// When, in milliseconds since the Unix epoch (database clock).
    pub at_unix_ms: i64,
}

/// A dead-letter row.
type Row = (i64, String, String, i32, i32, i64);

impl From<Row> for DeadLetter {
    fn from((id, item, reason, stalls, failures, at_unix_ms): Row) -> Self {
        DeadLetter {
            id,
            item,
            reason,
            stalls: stalls.max(0).unsigned_abs(),
            failures: failures.max(0).unsigned_abs(),
            at_unix_ms,
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// The newest dead letters, at most `limit`.
    ///
    /// # Errors
    ///
    /// A database error that outlasted the retry deadline.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Row> = self
            .inner
            .call("dead_letters", || {
                sqlx::query_as(
                    "SELECT id, item, reason, stalls, failures,
                            (extract(epoch FROM at) * 1000)::bigint
                     FROM workqueue_dead WHERE queue = $1 ORDER BY id DESC LIMIT $2",
                )
                .bind(self.inner.id)
                .bind(limit)
                .fetch_all(&self.inner.pool)
            })
            .await?;
        Ok(rows.into_iter().map(DeadLetter::from).collect())
    }

    /// Queues a dead letter's item again and removes the letter, in one statement;
    /// `Ok(false)` if the letter was gone already.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] while this handle or the queue is shut down (the letter stays);
    /// as for [`dead_letters`](Self::dead_letters).
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        self.requeue_dead_by_id(letter.id).await
    }

    /// [`requeue_dead_letter`](Self::requeue_dead_letter) by the letter's id.
    ///
    /// # Errors
    ///
    /// As for [`requeue_dead_letter`](Self::requeue_dead_letter).
    pub async fn requeue_dead_by_id(&self, id: i64) -> Result<bool, Error> {
        Ok(self.requeue_dead_step(Some(vec![id]), 1).await? == 1)
    }

    /// Queues every dead letter's item again (oldest first, a thousand per statement) and
    /// removes the letters; returns how many. Each item is then queued (or was already, or
    /// is being processed and is queued again after it).
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] while this handle or the queue is shut down (every letter stays).
    /// If the queue is shut down between two steps, the letters of the steps already taken
    /// are queued, the rest stay, and their count is returned. As for
    /// [`dead_letters`](Self::dead_letters).
    pub async fn requeue_dead_letters(&self) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            match self.requeue_dead_step(None, STEP).await {
                Ok(0) => return Ok(total),
                Ok(n) => total += n,
                Err(Error::ShutDown) if total > 0 => return Ok(total),
                Err(error) => return Err(error),
            }
        }
    }

    /// One call of `workqueue_requeue_dead`.
    async fn requeue_dead_step(&self, ids: Option<Vec<i64>>, limit: i64) -> Result<usize, Error> {
        if self.is_closed() {
            return Err(Error::ShutDown);
        }
        let n: i64 = self
            .inner
            .call("requeue_dead_letters", || {
                sqlx::query_scalar("SELECT workqueue_requeue_dead($1, $2, $3)")
                    .bind(self.inner.id)
                    .bind(ids.as_deref())
                    .bind(i32::try_from(limit).unwrap_or(i32::MAX))
                    .fetch_one(&self.inner.pool)
            })
            .await?;
        if n < 0 {
            return Err(Error::ShutDown);
        }
        Ok(count(n))
    }

    /// Deletes one dead letter; `Ok(false)` if it was gone already.
    ///
    /// # Errors
    ///
    /// As for [`dead_letters`](Self::dead_letters).
    pub async fn delete_dead_letter(&self, id: i64) -> Result<bool, Error> {
        let rows = self
            .inner
            .call("delete_dead_letter", || {
                sqlx::query("DELETE FROM workqueue_dead WHERE queue = $1 AND id = $2")
                    .bind(self.inner.id)
                    .bind(id)
                    .execute(&self.inner.pool)
            })
            .await?;
        Ok(rows.rows_affected() == 1)
    }

    /// Deletes every dead letter, a thousand per statement (so a huge list never holds the
    /// table for long); returns how many.
    ///
    /// # Errors
    ///
    /// As for [`dead_letters`](Self::dead_letters); letters deleted before the error stay
    /// deleted.
    pub async fn purge_dead_letters(&self) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            let rows = self
                .inner
                .call("purge_dead_letters", || {
                    sqlx::query(
                        "DELETE FROM workqueue_dead WHERE id IN (
                            SELECT id FROM workqueue_dead WHERE queue = $1 ORDER BY id LIMIT $2)",
                    )
                    .bind(self.inner.id)
                    .bind(STEP)
                    .execute(&self.inner.pool)
                })
                .await?;
            let n = usize::try_from(rows.rows_affected()).unwrap_or(usize::MAX);
            total += n;
            if n == 0 {
                return Ok(total);
            }
        }
    }
}
