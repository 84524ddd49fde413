//! One queue's figures: the sizes of its parts (client-go's `Len`, [`Stats`] for operators)
//! and the dead letters its cap dropped.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::queue::PgQueue;
use crate::units::{count, seconds};

/// One item under a lease, as [`Stats`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlight {
    /// The item as stored (its JSON text).
    pub item: String,
    /// How long ago it was handed out (database clock).
    pub age: Duration,
    /// How long until its lease expires if not renewed; zero if it already has.
    pub expires_in: Duration,
    /// The fencing token of its lease.
    pub token: u64,
}

/// A snapshot of a queue for operators, as [`PgQueue::stats`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Items ready to hand out (client-go's `Len`, without due delayed items a get has not
    /// promoted yet, which are in `delayed`).
    pub depth: usize,
    /// Items waiting for a delay (or due, and not promoted yet).
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items under a lease that were re-added meanwhile (queued again when their lease ends).
    pub in_flight_dirty: usize,
    /// Items with a failure count (tracked by `add_rate_limited`, reset by `forget`).
    pub failing: usize,
    /// Items whose lease expired at least once in a row and was taken back.
    pub stalled: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by the cap ([`Builder::dead_letter_cap`](crate::Builder::dead_letter_cap)).
    pub dead_dropped: u64,
    /// Whether the queue is shut down for every process.
    pub shut_down: bool,
    /// Whether the queue is paused ([`PgQueue::pause`]).
    pub paused: bool,
    /// Time until the next delayed item is due, if any (zero if one is due already).
    pub next_delayed_in: Option<Duration>,
    /// The in-flight items with the oldest lease deadlines first (at most the requested
    /// number).
    pub leases: Vec<InFlight>,
    /// Failure counts (at most the requested number), largest first.
    pub failures: Vec<(String, u64)>,
}

/// The counts [`PgQueue::stats`] reads in one statement.
type Counts = (
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    bool,
    bool,
    Option<f64>,
);

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// The number of items ready to hand out now (delays that are due count, unless the
    /// queue is shut down): client-go's `Len`.
    ///
    /// # Errors
    ///
    /// A database error that outlasted the retry deadline.
    pub async fn len(&self) -> Result<usize, Error> {
        let n: i64 = self
            .inner
            .call("len", || {
                sqlx::query_scalar(
                    "SELECT (SELECT count(*) FROM workqueue_items WHERE queue = $1 AND ready)
                          + (SELECT count(*) FROM workqueue_items
                             WHERE queue = $1 AND due <= statement_timestamp()
                               AND token IS NULL
                               AND NOT EXISTS (SELECT 1 FROM workqueue_queues s
                                               WHERE s.id = $1 AND s.shut_down))",
                )
                .bind(self.inner.id)
                .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(count(n))
    }

    /// Whether no item is ready to hand out now.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The number of items waiting for a delay (and not queued or leased).
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn delayed_len(&self) -> Result<usize, Error> {
        self.count("WHERE queue = $1 AND due > statement_timestamp() AND token IS NULL")
            .await
    }

    /// The number of items under a lease.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn processing_len(&self) -> Result<usize, Error> {
        self.count("WHERE queue = $1 AND token IS NOT NULL").await
    }

    async fn count(&self, filter: &'static str) -> Result<usize, Error> {
        let sql = format!("SELECT count(*) FROM workqueue_items {filter}");
        let n: i64 = self
            .inner
            .call("count", || {
                sqlx::query_scalar(&sql)
                    .bind(self.inner.id)
                    .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(count(n))
    }

    /// A snapshot of the queue for operators (see [`Stats`]), listing at most `limit`
    /// in-flight items and failure counts. The counts read the queue's rows of each kind
    /// (through its indexes), so it costs in proportion to the backlog: for operators, not
    /// for a hot path.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn stats(&self, limit: usize) -> Result<Stats, Error> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let id = self.inner.id;
        let pool = &self.inner.pool;
        let (depth, delayed, in_flight, dirty, failing, stalled, dead, dropped, shut, paused, next): Counts =
            self.inner
                .call("stats", || {
                    sqlx::query_as(
                        "SELECT
                            (SELECT count(*) FROM workqueue_items WHERE queue = $1 AND ready),
                            (SELECT count(*) FROM workqueue_items
                             WHERE queue = $1 AND due IS NOT NULL AND token IS NULL),
                            (SELECT count(*) FROM workqueue_items
                             WHERE queue = $1 AND token IS NOT NULL),
                            (SELECT count(*) FROM workqueue_items
                             WHERE queue = $1 AND token IS NOT NULL
                               AND (dirty OR due <= statement_timestamp())),
                            (SELECT count(*) FROM workqueue_failures WHERE queue = $1),
                            (SELECT count(*) FROM workqueue_items WHERE queue = $1 AND stalls > 0),
                            (SELECT count(*) FROM workqueue_dead WHERE queue = $1),
                            s.dead_dropped, s.shut_down, s.paused,
                            extract(epoch FROM (SELECT min(due) FROM workqueue_items
                                WHERE queue = $1 AND due IS NOT NULL AND token IS NULL)
                                - statement_timestamp())::float8
                         FROM workqueue_queues s WHERE s.id = $1",
                    )
                    .bind(id)
                    .fetch_one(pool)
                })
                .await?;
        let leases: Vec<(String, f64, f64, i64)> = self
            .inner
            .call("stats", || {
                sqlx::query_as(
                    "SELECT item,
                        extract(epoch FROM statement_timestamp() - leased_at)::float8,
                        extract(epoch FROM lease_until - statement_timestamp())::float8,
                        token
                     FROM workqueue_items WHERE queue = $1 AND token IS NOT NULL
                     ORDER BY lease_until LIMIT $2",
                )
                .bind(id)
                .bind(limit)
                .fetch_all(pool)
            })
            .await?;
        let failures: Vec<(String, i32)> = self
            .inner
            .call("stats", || {
                sqlx::query_as(
                    "SELECT item, failures FROM workqueue_failures WHERE queue = $1
                     ORDER BY failures DESC, item LIMIT $2",
                )
                .bind(id)
                .bind(limit)
                .fetch_all(pool)
            })
            .await?;
        Ok(Stats {
            depth: count(depth),
            delayed: count(delayed),
            in_flight: count(in_flight),
            in_flight_dirty: count(dirty),
            failing: count(failing),
            stalled: count(stalled),
            dead: count(dead),
            dead_dropped: dropped.max(0).unsigned_abs(),
            shut_down: shut,
            paused,
            next_delayed_in: next.map(seconds),
            leases: leases
                .into_iter()
                .map(|(item, age, left, token)| InFlight {
                    item,
                    age: seconds(age),
                    expires_in: seconds(left),
                    token: token.unsigned_abs(),
                })
                .collect(),
            failures: failures
                .into_iter()
                .map(|(item, n)| (item, u64::from(n.max(0).unsigned_abs())))
                .collect(),
        })
    }

    /// How many dead letters the cap dropped so far.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn dead_dropped(&self) -> Result<u64, Error> {
        let n: Option<i64> = self
            .inner
            .call("dead_dropped", || {
                sqlx::query_scalar("SELECT dead_dropped FROM workqueue_queues WHERE id = $1")
                    .bind(self.inner.id)
                    .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(n.unwrap_or(0).max(0).unsigned_abs())
    }
}
