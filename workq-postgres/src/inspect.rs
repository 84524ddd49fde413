//! Looking at single items, for operators and dashboards: pages of the items in one state
//! from either end (keyset cursors, so the millionth page costs what the first does), search,
//! one item's detail, and actions on one item (run it now, remove it).
//!
//! Every call does bounded work: a page reads at most [`SCAN`] rows, so a search through a
//! million dead letters is many short calls, each answering where to go on.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::dead_letter::DeadLetter;
use crate::error::Error;
use crate::queue::PgQueue;
use crate::units::seconds;
use crate::wait::channel;

/// Rows one page reads at most (a search may return fewer matches and a cursor to go on).
pub const SCAN: i64 = 5000;

/// The states an item can be listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ItemState {
    /// Ready to hand out, in hand-out order (highest priority first, then the moment each
    /// became ready).
    Ready,
    /// Waiting for a delay (and not leased), soonest due first.
    Delayed,
    /// Under a lease, nearest deadline first.
    InFlight,
    /// With a failure count, in the order of their keys.
    Failing,
    /// Dead letters, oldest first.
    Dead,
}

/// A request for one page of a queue's items in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageQuery {
    /// Which items.
    pub state: ItemState,
    /// From the last of the state's order backwards, instead of from the first.
    pub from_last: bool,
    /// Where to go on: a [`Page::next`] of the same state, end and search; `None` to start at
    /// the end.
    pub cursor: Option<String>,
    /// At most this many items (1 to 1,000).
    pub limit: usize,
    /// Only items whose text contains this (any case); dead letters also by their reason.
    pub search: Option<String>,
}

impl PageQuery {
    /// The first page of `state`, `limit` items, from its first.
    pub fn new(state: ItemState, limit: usize) -> Self {
        PageQuery {
            state,
            from_last: false,
            cursor: None,
            limit,
            search: None,
        }
    }

    /// From the last of the state's order backwards.
    #[must_use]
    pub fn from_last(mut self, from_last: bool) -> Self {
        self.from_last = from_last;
        self
    }

    /// Going on from `cursor` (a [`Page::next`]).
    #[must_use]
    pub fn cursor(mut self, cursor: Option<String>) -> Self {
        self.cursor = cursor;
        self
    }

    /// Only items whose text contains `search`.
    #[must_use]
    pub fn search(mut self, search: Option<String>) -> Self {
        self.search = search.filter(|s| !s.is_empty());
        self
    }
}

/// An item's lease, as [`ItemInfo`] and [`ItemDetail`] show it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// How long ago it was handed out (database clock).
    pub age: Duration,
    /// How long until it expires if not renewed (zero if it has).
    pub expires_in: Duration,
    /// Its fencing token.
    pub token: u64,
}

/// One item of a [`Page`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ItemInfo {
    /// The item as stored (its JSON text).
    pub item: String,
    /// Ready or delayed: its priority.
    pub priority: Option<i32>,
    /// Delayed: the time until it is due (zero when it is due and no get promoted it yet).
    pub due_in: Option<Duration>,
    /// In flight: its lease.
    pub lease: Option<LeaseInfo>,
    /// Failing: its failure count.
    pub failures: Option<u32>,
    /// Dead: the dead letter.
    pub dead: Option<DeadLetter>,
}

/// One page of items ([`PgQueue::items`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The items, in the state's order from the requested end.
    pub items: Vec<ItemInfo>,
    /// How many items are in the state, whatever the search.
    pub total: u64,
    /// Where the next page starts, if anything is left to read (with a search, a page may
    /// hold fewer items than asked and still have a next one).
    pub next: Option<String>,
}

/// Everything the queue knows about one item ([`PgQueue::item_detail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ItemDetail {
    /// The item as stored.
    pub item: String,
    /// Every state it is in (dead letters aside).
    pub states: Vec<ItemState>,
    /// Its priority: queued or delayed at, or given by the re-adds while leased.
    pub priority: Option<i32>,
    /// When ready: how many items go before it.
    pub position: Option<u64>,
    /// When it waits for a delay: the time until it is due.
    pub due_in: Option<Duration>,
    /// Its lease, when it is being processed.
    pub lease: Option<LeaseInfo>,
    /// Re-added while processing: queued again when its lease ends.
    pub readded: bool,
    /// Its failure count.
    pub failures: u32,
    /// Its leases that expired in a row.
    pub stalls: u32,
    /// Its newest dead letters (at most ten), oldest first.
    pub dead_letters: Vec<DeadLetter>,
}

/// What [`PgQueue::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removed {
    /// The item was queued or delayed: it is gone.
    Removed,
    /// The item is being processed: its lease stays with its holder, and the re-adds it had
    /// pending (queued again after the lease) are dropped.
    PendingDropped,
    /// The queue knew nothing of it (or nothing pending for a leased item).
    Nothing,
}

/// The row of an item page: item, priority, due in (s), lease age (s), lease left (s),
/// token, failures, dead letter id, reason, stalls, failures, at (ms), the cursor, and the
/// row's place in the stretch read.
type Row = (
    String,
    Option<i32>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<String>,
    Option<i32>,
    Option<i32>,
    Option<i64>,
    String,
    i64,
);

/// The SQL of one page of `state`, from the first or the last, and the SQL of the key of the
/// last row such a page reads. `$1` is the queue, `$2` the cursor (text, or NULL), `$3` the
/// rows to read; the page's `$4` is the search pattern (or NULL) and `$5` the items to
/// answer. Each reads through an index in its order, after the cursor; a cursor is a row's
/// place in that order, as text.
fn page_sql(state: ItemState, from_last: bool) -> (String, String) {
    let (dir, cmp) = if from_last {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    let (rdir, rcmp) = if from_last {
        ("ASC", ">")
    } else {
        ("DESC", "<")
    };
    let (cols, from, order, after, key, matches) = match state {
        ItemState::Ready => (
            "i.item, coalesce(i.priority, 0), NULL::float8, NULL::float8, NULL::float8, \
             NULL::bigint, NULL::int, NULL::bigint, NULL::text, NULL::int, NULL::int, \
             NULL::bigint",
            "workqueue_items i WHERE i.queue = $1 AND i.ready",
            // Priority runs the other way from the rest of the order.
            format!("coalesce(i.priority, 0) {rdir}, i.avail_at {dir}, i.seq {dir}"),
            format!(
                "(coalesce(i.priority, 0) {rcmp} split_part($2, '|', 1)::int
                  OR (coalesce(i.priority, 0) = split_part($2, '|', 1)::int
                      AND (i.avail_at, i.seq) {cmp}
                          (split_part($2, '|', 2)::timestamptz, split_part($2, '|', 3)::bigint)))"
            ),
            "coalesce(i.priority, 0) || '|' || i.avail_at::text || '|' || i.seq",
            "s.item ILIKE $4",
        ),
        ItemState::Delayed => (
            "i.item, coalesce(i.priority, 0), \
             greatest(extract(epoch FROM i.due - statement_timestamp()), 0)::float8, \
             NULL::float8, NULL::float8, NULL::bigint, NULL::int, NULL::bigint, NULL::text, \
             NULL::int, NULL::int, NULL::bigint",
            "workqueue_items i WHERE i.queue = $1 AND i.due IS NOT NULL AND i.token IS NULL",
            format!("i.due {dir}, i.key {dir}"),
            format!(
                "(i.due, i.key) {cmp} (split_part($2, '|', 1)::timestamptz,
                                       decode(split_part($2, '|', 2), 'hex'))"
            ),
            "i.due::text || '|' || encode(i.key, 'hex')",
            "s.item ILIKE $4",
        ),
        ItemState::InFlight => (
            "i.item, NULL::int, NULL::float8, \
             extract(epoch FROM statement_timestamp() - i.leased_at)::float8, \
             extract(epoch FROM i.lease_until - statement_timestamp())::float8, i.token, \
             NULL::int, NULL::bigint, NULL::text, NULL::int, NULL::int, NULL::bigint",
            "workqueue_items i WHERE i.queue = $1 AND i.token IS NOT NULL",
            format!("i.lease_until {dir}, i.key {dir}"),
            format!(
                "(i.lease_until, i.key) {cmp} (split_part($2, '|', 1)::timestamptz,
                                               decode(split_part($2, '|', 2), 'hex'))"
            ),
            "i.lease_until::text || '|' || encode(i.key, 'hex')",
            "s.item ILIKE $4",
        ),
        ItemState::Failing => (
            "i.item, NULL::int, NULL::float8, NULL::float8, NULL::float8, NULL::bigint, \
             i.failures, NULL::bigint, NULL::text, NULL::int, NULL::int, NULL::bigint",
            "workqueue_failures i WHERE i.queue = $1",
            format!("i.key {dir}"),
            format!("i.key {cmp} decode($2, 'hex')"),
            "encode(i.key, 'hex')",
            "s.item ILIKE $4",
        ),
        ItemState::Dead => (
            "i.item, NULL::int, NULL::float8, NULL::float8, NULL::float8, NULL::bigint, \
             NULL::int, i.id, i.reason, i.stalls, i.failures, \
             (extract(epoch FROM i.at) * 1000)::bigint",
            "workqueue_dead i WHERE i.queue = $1",
            format!("i.id {dir}"),
            format!("i.id {cmp} $2::bigint"),
            "i.id::text",
            "(s.item ILIKE $4 OR s.reason ILIKE $4)",
        ),
    };
    let scan = format!("FROM {from} AND ($2::text IS NULL OR {after}) ORDER BY {order} LIMIT $3");
    let page = format!(
        "SELECT s.* FROM (
            SELECT {cols}, {key} AS cursor, row_number() OVER (ORDER BY {order}) AS place
            FROM (SELECT i.* {scan}) i
         ) s
         WHERE $4::text IS NULL OR {matches}
         ORDER BY s.place LIMIT $5"
    );
    let last = format!("SELECT {key} {scan} OFFSET $3 - 1", key = key);
    (page, last)
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// One page of the queue's items in one state (see [`PageQuery`]). Reads at most
    /// [`SCAN`] rows: with a search, a page may hold fewer matches than asked and still have
    /// a [`next`](Page::next).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a cursor of another kind of page; a database error.
    pub async fn items(&self, query: &PageQuery) -> Result<Page, Error> {
        let limit = query.limit.clamp(1, 1000);
        let pattern = query.search.as_ref().map(|s| {
            format!(
                "%{}%",
                s.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
            )
        });
        let (page_sql, last_sql) = page_sql(query.state, query.from_last);
        // Without a search the page reads its items; with one, a bounded stretch to filter.
        let limit_i64 = i64::try_from(limit).unwrap_or(1000);
        let read = if pattern.is_some() { SCAN } else { limit_i64 };
        let bad_cursor = |e: sqlx::Error| match &e {
            sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("22")) => {
                Error::Config(format!("a cursor that is not this page's: {db}"))
            }
            _ => Error::from(e),
        };
        let rows: Vec<Row> = sqlx::query_as(&page_sql)
            .bind(self.inner.id)
            .bind(query.cursor.as_deref())
            .bind(read)
            .bind(pattern.as_deref())
            .bind(limit_i64)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(bad_cursor)?;
        let full = rows.len() == limit;
        let mut next = rows.last().map(|r| r.12.clone());
        if !full {
            // A short page: the end, unless a search stopped at the end of its stretch.
            next = if pattern.is_some() {
                sqlx::query_scalar::<_, String>(&last_sql)
                    .bind(self.inner.id)
                    .bind(query.cursor.as_deref())
                    .bind(read)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(bad_cursor)?
            } else {
                None
            };
        }
        let total = self.state_count(query.state).await?;
        Ok(Page {
            items: rows.into_iter().map(info).collect(),
            total,
            next,
        })
    }

    /// How many items are in `state`.
    async fn state_count(&self, state: ItemState) -> Result<u64, Error> {
        let filter = match state {
            ItemState::Ready => "workqueue_items WHERE queue = $1 AND ready",
            ItemState::Delayed => {
                "workqueue_items WHERE queue = $1 AND due IS NOT NULL AND token IS NULL"
            }
            ItemState::InFlight => "workqueue_items WHERE queue = $1 AND token IS NOT NULL",
            ItemState::Failing => "workqueue_failures WHERE queue = $1",
            ItemState::Dead => "workqueue_dead WHERE queue = $1",
        };
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {filter}"))
            .bind(self.inner.id)
            .fetch_one(&self.inner.pool)
            .await?;
        Ok(n.max(0).unsigned_abs())
    }

    /// Everything the queue knows about the item stored as `raw` (its JSON text), or `None`
    /// if it knows nothing of it (no row, no failure count, no dead letter).
    ///
    /// # Errors
    ///
    /// A database error.
    pub async fn item_detail(&self, raw: &str) -> Result<Option<ItemDetail>, Error> {
        type Detail = (
            Option<bool>,
            Option<i32>,
            Option<f64>,
            Option<i64>,
            Option<f64>,
            Option<f64>,
            Option<bool>,
            Option<i32>,
            Option<i32>,
            Option<i64>,
        );
        let (ready, priority, due_in, token, age, left, dirty, stalls, failures, position): Detail =
            sqlx::query_as(
                "SELECT i.ready, i.priority,
                    CASE WHEN i.due IS NOT NULL THEN
                        greatest(extract(epoch FROM i.due - statement_timestamp()), 0)::float8
                    END,
                    i.token,
                    extract(epoch FROM statement_timestamp() - i.leased_at)::float8,
                    extract(epoch FROM i.lease_until - statement_timestamp())::float8,
                    i.dirty OR (i.token IS NOT NULL AND i.due <= statement_timestamp()),
                    i.stalls,
                    (SELECT f.failures FROM workqueue_failures f
                     WHERE f.queue = $1 AND f.key = workqueue_key($2)),
                    CASE WHEN i.ready THEN (
                        SELECT count(*) FROM workqueue_items o
                        WHERE o.queue = $1 AND o.ready
                          AND (coalesce(o.priority, 0) > coalesce(i.priority, 0)
                               OR (coalesce(o.priority, 0) = coalesce(i.priority, 0)
                                   AND (o.avail_at, o.seq) < (i.avail_at, i.seq)))) END
                 FROM (SELECT 1) one
                 LEFT JOIN workqueue_items i ON i.queue = $1 AND i.key = workqueue_key($2)",
            )
            .bind(self.inner.id)
            .bind(raw)
            .fetch_one(&self.inner.pool)
            .await?;
        let dead: Vec<(i64, String, String, i32, i32, i64)> = sqlx::query_as(
            "SELECT * FROM (
                SELECT id, item, reason, stalls, failures, (extract(epoch FROM at) * 1000)::bigint
                FROM workqueue_dead WHERE queue = $1 AND item = $2 ORDER BY id DESC LIMIT 10
             ) d ORDER BY id",
        )
        .bind(self.inner.id)
        .bind(raw)
        .fetch_all(&self.inner.pool)
        .await?;
        if ready.is_none() && failures.is_none() && dead.is_empty() {
            return Ok(None);
        }
        let mut states = Vec::new();
        if ready == Some(true) {
            states.push(ItemState::Ready);
        }
        if token.is_none() && due_in.is_some() {
            states.push(ItemState::Delayed);
        }
        if token.is_some() {
            states.push(ItemState::InFlight);
        }
        if failures.is_some() {
            states.push(ItemState::Failing);
        }
        let leased = token.is_some();
        Ok(Some(ItemDetail {
            item: raw.to_owned(),
            states,
            priority: if leased {
                priority
            } else {
                ready.map(|_| priority.unwrap_or(0))
            },
            position: position.map(|p| p.max(0).unsigned_abs()),
            due_in: due_in.map(seconds),
            lease: token.map(|token| LeaseInfo {
                age: seconds(age.unwrap_or(0.0)),
                expires_in: seconds(left.unwrap_or(0.0)),
                token: token.unsigned_abs(),
            }),
            readded: dirty == Some(true),
            failures: failures.unwrap_or(0).max(0).unsigned_abs(),
            stalls: stalls.unwrap_or(0).max(0).unsigned_abs(),
            dead_letters: dead.into_iter().map(DeadLetter::from).collect(),
        }))
    }

    /// Runs a delayed item now: it is queued at once (at the tail of its priority), its
    /// failure count kept. `Ok(false)` if it was not waiting for a delay (queued already,
    /// leased, or unknown). Refused while the queue is shut down, as an add would be.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`]; a database error.
    pub async fn retry_now(&self, raw: &str) -> Result<bool, Error> {
        if self.is_closed() {
            return Err(Error::ShutDown);
        }
        // The item's row first, then the queue's (the lock order): the queue is kept from
        // shutting down until this commits, and a shut-down queue rolls the move back.
        let n: i64 = self
            .inner
            .call("retry_now", || async move {
                let mut tx = self.inner.pool.begin().await?;
                let moved = sqlx::query(
                    "UPDATE workqueue_items i SET ready = true, due = NULL,
                         avail_at = clock_timestamp(), seq = nextval('workqueue_seq'),
                         last_add = 1
                     WHERE i.queue = $1 AND i.key = workqueue_key($2)
                       AND i.token IS NULL AND i.due IS NOT NULL",
                )
                .bind(self.inner.id)
                .bind(raw)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let shut: bool = sqlx::query_scalar(
                    "SELECT coalesce((SELECT shut_down FROM workqueue_queues
                                      WHERE id = $1 FOR SHARE), false)",
                )
                .bind(self.inner.id)
                .fetch_one(&mut *tx)
                .await?;
                if shut {
                    tx.rollback().await?;
                    return Ok(-1);
                }
                tx.commit().await?;
                Ok(i64::try_from(moved).unwrap_or(i64::MAX))
            })
            .await?;
        if n < 0 {
            return Err(Error::ShutDown);
        }
        if n > 0 {
            self.notify(1).await?;
        }
        Ok(n > 0)
    }

    /// Takes the item stored as `raw` out of the queue: queued or delayed, it is gone (its
    /// failure count stays until [`forget`](Self::forget)); leased, its lease stays with its
    /// holder and its pending re-adds are dropped.
    ///
    /// # Errors
    ///
    /// A database error.
    pub async fn remove(&self, raw: &str) -> Result<Removed, Error> {
        let (deleted, dropped): (i64, i64) = self
            .inner
            .call("remove", || {
                sqlx::query_as(
                    "WITH gone AS (
                        DELETE FROM workqueue_items
                        WHERE queue = $1 AND key = workqueue_key($2) AND token IS NULL
                        RETURNING 1),
                     kept AS (
                        UPDATE workqueue_items SET dirty = false, due = NULL, priority = NULL
                        WHERE queue = $1 AND key = workqueue_key($2) AND token IS NOT NULL
                          AND (dirty OR due IS NOT NULL)
                        RETURNING 1)
                     SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM kept)",
                )
                .bind(self.inner.id)
                .bind(raw)
                .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(match (deleted, dropped) {
            (d, _) if d > 0 => Removed::Removed,
            (_, k) if k > 0 => Removed::PendingDropped,
            _ => Removed::Nothing,
        })
    }

    /// Wakes up to `n` getters of the queue in every process.
    async fn notify(&self, n: u64) -> Result<(), Error> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel(self.inner.id))
            .bind(n.to_string())
            .execute(&self.inner.pool)
            .await?;
        Ok(())
    }
}

/// An [`ItemInfo`] from a page's row.
fn info(row: Row) -> ItemInfo {
    let (
        item,
        priority,
        due_in,
        age,
        left,
        token,
        failures,
        id,
        reason,
        stalls,
        dead_failures,
        at,
        _,
        _,
    ) = row;
    ItemInfo {
        item: item.clone(),
        priority,
        due_in: due_in.map(seconds),
        lease: token.map(|token| LeaseInfo {
            age: seconds(age.unwrap_or(0.0)),
            expires_in: seconds(left.unwrap_or(0.0)),
            token: token.unsigned_abs(),
        }),
        failures: failures.map(|f| f.max(0).unsigned_abs()),
        dead: id.map(|id| {
            DeadLetter::from((
                id,
                item,
                reason.unwrap_or_default(),
                stalls.unwrap_or(0),
                dead_failures.unwrap_or(0),
                at.unwrap_or(0),
            ))
        }),
    }
}
