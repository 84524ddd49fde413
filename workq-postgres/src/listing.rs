//! Every queue in a database at a glance ([`queues`]), or one ([`queue_summary`]): for
//! operators' tools and dashboards, which must not open a handle per queue.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Error;
use crate::units::{count, seconds};

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
    /// Items whose lease expired at least once in a row and was taken back.
    pub stalled: usize,
    /// Items with a failure count.
    pub failing: usize,
    /// The sum of the items' failure counts.
    pub failures: u64,
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
    /// How long the oldest lease out has been held (database clock); zero when none is.
    pub longest_lease: Duration,
    /// The sum of how long each lease out has been held: the work in progress not finished
    /// yet (client-go's `unfinished_work_seconds`).
    pub lease_age_sum: Duration,
}

/// The row [`queues`] reads per queue: name, depth, delayed, in flight, re-added in flight,
/// stalled, failing, failures, dead, dropped, shut down, paused, oldest ready (s), longest
/// lease (s), lease ages (s).
type Row = (
    String,
    i64,
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
    Option<f64>,
    Option<f64>,
);

/// The listing's SQL: every queue, or (with `one`) the queue named `$1`. Each kind of row is
/// counted in one grouped pass over its table; for one queue, through the queue's indexes.
fn listing_sql(one: bool) -> String {
    let (queues, rows) = if one {
        (
            "WHERE s.name = $1",
            "WHERE queue = (SELECT id FROM workqueue_queues WHERE name = $1)",
        )
    } else {
        ("", "")
    };
    format!(
        "SELECT s.name,
                coalesce(i.depth, 0), coalesce(i.delayed, 0), coalesce(i.in_flight, 0),
                coalesce(i.dirty, 0), coalesce(i.stalled, 0), coalesce(f.failing, 0),
                coalesce(f.failures, 0), coalesce(d.dead, 0),
                s.dead_dropped, s.shut_down, s.paused,
                extract(epoch FROM statement_timestamp() - i.oldest)::float8,
                extract(epoch FROM statement_timestamp() - i.first_lease)::float8,
                extract(epoch FROM i.lease_ages)::float8
         FROM workqueue_queues s
         LEFT JOIN (
             SELECT queue,
                    count(*) FILTER (WHERE ready) AS depth,
                    count(*) FILTER (WHERE due IS NOT NULL AND token IS NULL) AS delayed,
                    count(*) FILTER (WHERE token IS NOT NULL) AS in_flight,
                    count(*) FILTER (WHERE token IS NOT NULL
                                     AND (dirty OR due <= statement_timestamp())) AS dirty,
                    count(*) FILTER (WHERE stalls > 0) AS stalled,
                    min(avail_at) FILTER (WHERE ready AND avail_at > '-infinity') AS oldest,
                    min(leased_at) FILTER (WHERE token IS NOT NULL) AS first_lease,
                    sum(greatest(statement_timestamp() - leased_at, interval '0'))
                        FILTER (WHERE token IS NOT NULL) AS lease_ages
             FROM workqueue_items {rows} GROUP BY queue
         ) i ON i.queue = s.id
         LEFT JOIN (
             SELECT queue, count(*) AS failing, sum(failures)::bigint AS failures
             FROM workqueue_failures {rows} GROUP BY queue
         ) f ON f.queue = s.id
         LEFT JOIN (SELECT queue, count(*) AS dead FROM workqueue_dead {rows} GROUP BY queue) d
             ON d.queue = s.id
         {queues}
         ORDER BY s.name"
    )
}

fn summary(row: Row) -> QueueSummary {
    let (
        name,
        depth,
        delayed,
        in_flight,
        dirty,
        stalled,
        failing,
        failures,
        dead,
        dropped,
        shut,
        paused,
        oldest,
        longest,
        ages,
    ) = row;
    QueueSummary {
        name,
        depth: count(depth),
        delayed: count(delayed),
        in_flight: count(in_flight),
        in_flight_dirty: count(dirty),
        stalled: count(stalled),
        failing: count(failing),
        failures: failures.max(0).unsigned_abs(),
        dead: count(dead),
        dead_dropped: dropped.max(0).unsigned_abs(),
        shut_down: shut,
        paused,
        oldest_ready: oldest.map(seconds),
        longest_lease: seconds(longest.unwrap_or(0.0)),
        lease_age_sum: seconds(ages.unwrap_or(0.0)),
    }
}

/// Every queue in the database behind `pool`, by name, with its figures: one statement, one
/// pass over the tables (a cost in proportion to the rows of every queue, for an operator's
/// look, not for a hot path).
///
/// # Errors
///
/// [`Error::Database`], also when the schema is not installed.
pub async fn queues(pool: &PgPool) -> Result<Vec<QueueSummary>, Error> {
    let rows: Vec<Row> = sqlx::query_as(&listing_sql(false)).fetch_all(pool).await?;
    Ok(rows.into_iter().map(summary).collect())
}

/// The queue named `name`, with the figures [`queues`] gives, or `None` if the database has
/// no queue of that name: one statement, which reads that queue's rows only.
///
/// # Errors
///
/// [`Error::Database`], also when the schema is not installed.
pub async fn queue_summary(pool: &PgPool, name: &str) -> Result<Option<QueueSummary>, Error> {
    let row: Option<Row> = sqlx::query_as(&listing_sql(true))
        .bind(name)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(summary))
}
