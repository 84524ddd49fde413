//! One queue's figures: the sizes of its parts (client-go's `Len`; `workq`'s [`Stats`] for
//! operators) and the dead letters its cap dropped.

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{InFlight, LeaseInfo, Stats};

use crate::error::Error;
use crate::listing::{SummaryRow, Which, summary, summary_sql};
use crate::queue::PgQueue;
use crate::units::{count, count_limit, seconds};

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

    /// The queue's figures for operators, with at most `limit` of its leases (nearest
    /// deadline first) and of its failure counts (largest first). Every count is exact: it
    /// reads the queue's rows of each kind (through its indexes), so it costs in proportion to
    /// the backlog, for operators, not for a hot path. [`PgAdmin`](crate::PgAdmin) caps them.
    ///
    /// Under flow control it has the groups' figures too ([`Stats::flow`]), the `limit`
    /// groups with the most ready items ([`Stats::groups`]: ready, in flight, limit, the
    /// oldest ready item's wait) and the limits every process applies ([`Stats::limits`]).
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn stats(&self, limit: usize) -> Result<Stats, Error> {
        self.stats_capped(limit, None).await
    }

    /// [`stats`](Self::stats) with its counts capped at `cap` (see
    /// [`QueueSummary::capped_at`]): the failure counts listed are the largest among the
    /// ones counted.
    pub(crate) async fn stats_capped(
        &self,
        limit: usize,
        cap: Option<u64>,
    ) -> Result<Stats, Error> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let rows = count_limit(cap);
        let id = self.inner.id;
        let pool = &self.inner.pool;
        let sql = summary_sql(Which::Id);
        let row: Option<SummaryRow> = self
            .inner
            .call("stats", || {
                sqlx::query_as(&sql)
                    .bind(rows)
                    .bind(id)
                    .fetch_optional(pool)
            })
            .await?;
        let row = row.ok_or_else(|| {
            Error::Config(format!("the database has no queue named {:?}", self.name()))
        })?;
        let next: Option<f64> = self
            .inner
            .call("stats", || {
                sqlx::query_scalar(
                    "SELECT extract(epoch FROM min(due) - statement_timestamp())::float8
                     FROM workqueue_items WHERE queue = $1 AND due IS NOT NULL AND token IS NULL",
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
                     FROM (SELECT * FROM workqueue_items WHERE queue = $1 AND token IS NOT NULL
                           ORDER BY token LIMIT $3) i
                     ORDER BY lease_until LIMIT $2",
                )
                .bind(id)
                .bind(limit)
                .bind(rows)
                .fetch_all(pool)
            })
            .await?;
        let failures: Vec<(String, i32)> = self
            .inner
            .call("stats", || {
                sqlx::query_as(
                    "SELECT item, failures
                     FROM (SELECT item, failures FROM workqueue_failures WHERE queue = $1
                           ORDER BY key LIMIT $3) f
                     ORDER BY failures DESC, item LIMIT $2",
                )
                .bind(id)
                .bind(limit)
                .bind(rows)
                .fetch_all(pool)
            })
            .await?;
        let mut stats = Stats::new(summary(row, cap));
        stats.next_delayed_in = next.map(seconds);
        stats.leases = leases
            .into_iter()
            .map(|(item, age, left, token)| {
                InFlight::new(
                    item,
                    LeaseInfo::new(seconds(age), seconds(left), token.unsigned_abs()),
                )
            })
            .collect();
        stats.failures = failures
            .into_iter()
            .map(|(item, n)| (item, n.max(0).unsigned_abs()))
            .collect();
        let flow = self
            .inner
            .call("stats", || crate::flow::figures(pool, id, limit, rows))
            .await?;
        if let Some((figures, groups, limits)) = flow {
            stats.flow = Some(figures);
            stats.groups = groups;
            stats.limits = Some(limits);
        }
        Ok(stats)
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
