//! Every queue in a database at a glance ([`queues`]): for operators' tools and dashboards,
//! which must not open a handle per queue.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Error;
use crate::queue::count;

/// One queue's figures, as [`queues`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSummary {
    /// The queue's name.
    pub name: String,
    /// Items ready to hand out (without due delayed items no get has promoted yet).
    pub depth: usize,
    /// Items waiting for a delay (or due and not promoted yet).
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items under a lease that were re-added meanwhile.
    pub in_flight_dirty: usize,
    /// Items with a failure count.
    pub failing: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by the cap.
    pub dead_dropped: u64,
    /// Shut down for every process.
    pub shut_down: bool,
    /// Paused for every process.
    pub paused: bool,
    /// How long the oldest ready item has waited (since it became ready), if any is ready.
    pub oldest_ready: Option<Duration>,
}

/// The row [`queues`] reads per queue.
type Row = (
    String,
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

/// Every queue in the database behind `pool`, by name, with its figures: one statement, one
/// pass over the tables (a cost in proportion to the rows of every queue, for an operator's
/// look, not for a hot path).
///
/// # Errors
///
/// [`Error::Database`], also when the schema is not installed.
pub async fn queues(pool: &PgPool) -> Result<Vec<QueueSummary>, Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT s.name,
                coalesce(i.depth, 0), coalesce(i.delayed, 0), coalesce(i.in_flight, 0),
                coalesce(i.dirty, 0), coalesce(f.failing, 0), coalesce(d.dead, 0),
                s.dead_dropped, s.shut_down, s.paused,
                extract(epoch FROM statement_timestamp() - i.oldest)::float8
         FROM workqueue_queues s
         LEFT JOIN (
             SELECT queue,
                    count(*) FILTER (WHERE ready) AS depth,
                    count(*) FILTER (WHERE due IS NOT NULL AND token IS NULL) AS delayed,
                    count(*) FILTER (WHERE token IS NOT NULL) AS in_flight,
                    count(*) FILTER (WHERE token IS NOT NULL
                                     AND (dirty OR due <= statement_timestamp())) AS dirty,
                    min(avail_at) FILTER (WHERE ready AND avail_at > '-infinity') AS oldest
             FROM workqueue_items GROUP BY queue
         ) i ON i.queue = s.id
         LEFT JOIN (SELECT queue, count(*) AS failing FROM workqueue_failures GROUP BY queue) f
             ON f.queue = s.id
         LEFT JOIN (SELECT queue, count(*) AS dead FROM workqueue_dead GROUP BY queue) d
             ON d.queue = s.id
         ORDER BY s.name",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                name,
                depth,
                delayed,
                in_flight,
                dirty,
                failing,
                dead,
                dropped,
                shut,
                paused,
                oldest,
            )| {
                QueueSummary {
                    name,
                    depth: count(depth),
                    delayed: count(delayed),
                    in_flight: count(in_flight),
                    in_flight_dirty: count(dirty),
                    failing: count(failing),
                    dead: count(dead),
                    dead_dropped: dropped.max(0).unsigned_abs(),
                    shut_down: shut,
                    paused,
                    oldest_ready: oldest
                        .map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)),
                }
            },
        )
        .collect())
}
