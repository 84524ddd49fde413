//! Dead letters: items given up on (their leases kept expiring, or their text no longer
//! deserializes), and the operator's ways to look at them, queue them again or delete them.
//! A letter is `workq`'s [`DeadLetter`], its id the row's id in decimal.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{DeadLetter, End};

use crate::error::Error;
use crate::queue::PgQueue;

/// Dead letters moved or deleted per statement: a large list is worked through in steps that
/// each hold their locks briefly.
pub(crate) const STEP: i64 = 1000;

/// A dead-letter row: id, item, reason, stalls, failures, when (milliseconds since the Unix
/// epoch).
pub(crate) type Row = (i64, String, String, i32, i32, i64);

/// The columns of a [`Row`], from `workqueue_dead` as `d` (or unqualified).
pub(crate) const COLUMNS: &str =
    "id, item, reason, stalls, failures, (extract(epoch FROM at) * 1000)::bigint";

/// A [`DeadLetter`] from its row.
pub(crate) fn letter((id, item, reason, stalls, failures, at_ms): Row) -> DeadLetter {
    let mut letter = DeadLetter::new(id.to_string(), item);
    letter.error = reason;
    letter.stalls = stalls.max(0).unsigned_abs();
    letter.failures = failures.max(0).unsigned_abs();
    letter.at = SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms.max(0).unsigned_abs());
    letter
}

/// The row id a [`DeadLetter::id`] names: its decimal text.
fn id_of(id: &str) -> Result<i64, Error> {
    id.parse()
        .map_err(|_| Error::Config(format!("not a dead-letter id: {id:?}")))
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// At most `limit` dead letters from `from`'s end: [`End::First`] the oldest first,
    /// [`End::Last`] the newest first.
    ///
    /// # Errors
    ///
    /// A database error that outlasted the retry deadline.
    pub async fn dead_letters(&self, from: End, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let order = match from {
            End::First => "ASC",
            End::Last => "DESC",
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM workqueue_dead WHERE queue = $1 ORDER BY id {order} LIMIT $2"
        );
        let rows: Vec<Row> = self
            .inner
            .call("dead_letters", || {
                sqlx::query_as(&sql)
                    .bind(self.inner.id)
                    .bind(limit)
                    .fetch_all(&self.inner.pool)
            })
            .await?;
        Ok(rows.into_iter().map(letter).collect())
    }

    /// Queues a dead letter's item again and removes the letter, in one statement;
    /// `Ok(false)` if the letter was gone already.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] while this handle or the queue is shut down (the letter stays);
    /// [`Error::Config`] for an id this queue's letters cannot have; as for
    /// [`dead_letters`](Self::dead_letters).
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        self.requeue_dead_letter_by_id(&letter.id).await
    }

    /// [`requeue_dead_letter`](Self::requeue_dead_letter) by the letter's
    /// [`id`](DeadLetter::id).
    ///
    /// # Errors
    ///
    /// As for [`requeue_dead_letter`](Self::requeue_dead_letter).
    pub async fn requeue_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        Ok(self.requeue_dead_step(Some(vec![id_of(id)?]), 1).await? == 1)
    }

    /// [`requeue_dead_letter_by_id`](Self::requeue_dead_letter_by_id) by the row id.
    ///
    /// # Errors
    ///
    /// As for [`requeue_dead_letter`](Self::requeue_dead_letter).
    #[deprecated(
        since = "0.1.0",
        note = "use `requeue_dead_letter_by_id(&id.to_string())`: a dead letter's id is text"
    )]
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
    pub async fn requeue_dead_letters(&self) -> Result<u64, Error> {
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

    /// One call of `workqueue_requeue_dead`: the letters `ids`, or (with `None`) the oldest
    /// `limit` ones; how many it requeued.
    pub(crate) async fn requeue_dead_step(
        &self,
        ids: Option<Vec<i64>>,
        limit: i64,
    ) -> Result<u64, Error> {
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
        Ok(n.unsigned_abs())
    }

    /// Deletes one dead letter, by its [`id`](DeadLetter::id); `Ok(false)` if it was gone
    /// already.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an id this queue's letters cannot have; as for
    /// [`dead_letters`](Self::dead_letters).
    pub async fn delete_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        self.delete_dead_row(id_of(id)?).await
    }

    /// [`delete_dead_letter_by_id`](Self::delete_dead_letter_by_id) by the row id.
    ///
    /// # Errors
    ///
    /// As for [`dead_letters`](Self::dead_letters).
    #[deprecated(
        since = "0.1.0",
        note = "use `delete_dead_letter_by_id(&id.to_string())`: a dead letter's id is text"
    )]
    pub async fn delete_dead_letter(&self, id: i64) -> Result<bool, Error> {
        self.delete_dead_row(id).await
    }

    async fn delete_dead_row(&self, id: i64) -> Result<bool, Error> {
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
    pub async fn purge_dead_letters(&self) -> Result<u64, Error> {
        let mut total = 0;
        loop {
            let n = self.purge_dead_step().await?;
            total += n;
            if n == 0 {
                return Ok(total);
            }
        }
    }

    /// Deletes the oldest thousand dead letters; how many.
    pub(crate) async fn purge_dead_step(&self) -> Result<u64, Error> {
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
        Ok(rows.rows_affected())
    }
}
