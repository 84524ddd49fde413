//! Looking at single items, for operators and dashboards: pages of the items in one state
//! from either end (keyset cursors, so the millionth page costs what the first does), search,
//! one item's detail, and actions on one item (run it now, remove it), with `workq`'s
//! operator types ([`Page`], [`ItemDetail`], [`Retried`], [`Removed`]).
//!
//! Every call does bounded work: a page reads at most [`SEARCH_BUDGET`] rows, so a search
//! through a million dead letters is many short calls, each answering where to go on.

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{
    End, ItemDetail, ItemState, LeaseInfo, MAX_PAGE_LIMIT, Page, PageEntry, PageQuery, Removed,
    Retried,
};
use workq::{AddKind, AddOptions};

use crate::dead_letter::{COLUMNS, Row as DeadRow, letter};
use crate::error::Error;
use crate::queue::PgQueue;
use crate::units::{count_limit, seconds};
use crate::wait::channel;

/// Rows one page reads at most (a search may return fewer matches and a cursor to go on).
pub const SEARCH_BUDGET: usize = 5000;

/// Rows one page reads at most.
#[deprecated(since = "0.1.0", note = "use `SEARCH_BUDGET`")]
pub const SCAN: i64 = 5000;

/// [`SEARCH_BUDGET`] as the statements bind it.
const BUDGET: i64 = 5000;

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
fn page_sql(state: ItemState, from_last: bool) -> Result<(String, String), Error> {
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
        other => return Err(unknown_state(other)),
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
    let last = format!("SELECT {key} {scan} OFFSET $3 - 1");
    Ok((page, last))
}

/// The error for a state this version does not know (the core's `ItemState` may grow).
fn unknown_state(state: ItemState) -> Error {
    Error::Config(format!("items in the state {state:?} cannot be listed"))
}

/// The table and filter of the rows of `state`, for counting.
fn state_rows(state: ItemState) -> Result<(&'static str, &'static str), Error> {
    Ok(match state {
        ItemState::Ready => (
            "workqueue_items WHERE queue = $1 AND ready",
            "coalesce(priority, 0) DESC, avail_at, seq",
        ),
        ItemState::Delayed => (
            "workqueue_items WHERE queue = $1 AND due IS NOT NULL AND token IS NULL",
            "due",
        ),
        ItemState::InFlight => (
            "workqueue_items WHERE queue = $1 AND token IS NOT NULL",
            "token",
        ),
        ItemState::Failing => ("workqueue_failures WHERE queue = $1", "key"),
        ItemState::Dead => ("workqueue_dead WHERE queue = $1", "id"),
        other => return Err(unknown_state(other)),
    })
}

/// Checks that `raw` is JSON: an item's text as the queue stores it.
pub(crate) fn json(raw: &str) -> Result<(), Error> {
    serde_json::from_str::<serde::de::IgnoredAny>(raw)
        .map(drop)
        .map_err(|e| Error::Config(format!("item: not JSON ({e})")))
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// One page of the queue's items in one state (see [`PageQuery`]), its total exact.
    /// Reads at most [`SEARCH_BUDGET`] rows: with a search, a page may hold fewer matches
    /// than asked and still have a [`next`](Page::next). Keyset cursors go one way:
    /// [`Page::prev`] is `None` (a client keeps the cursors it came through).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a cursor of another kind of page; a database error.
    pub async fn page(&self, query: &PageQuery) -> Result<Page, Error> {
        self.page_capped(query, None).await
    }

    /// One page of the queue's items in one state.
    ///
    /// # Errors
    ///
    /// As for [`page`](Self::page).
    #[deprecated(since = "0.1.0", note = "use `page`")]
    pub async fn items(&self, query: &PageQuery) -> Result<Page, Error> {
        self.page(query).await
    }

    /// [`page`](Self::page) with its total counted up to `cap` (see [`Page::capped_at`]).
    pub(crate) async fn page_capped(
        &self,
        query: &PageQuery,
        cap: Option<u64>,
    ) -> Result<Page, Error> {
        let limit = query.limit.clamp(1, MAX_PAGE_LIMIT);
        let pattern = query.search.as_ref().map(|s| {
            format!(
                "%{}%",
                s.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
            )
        });
        let (page_sql, last_sql) = page_sql(query.state, query.from == End::Last)?;
        // Without a search the page reads its items; with one, a bounded stretch to filter.
        let limit_i64 = i64::try_from(limit).unwrap_or(1000);
        let read = if pattern.is_some() { BUDGET } else { limit_i64 };
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
        let total = self.state_count(query.state, cap).await?;
        let mut page = Page::new(
            rows.into_iter()
                .map(|row| entry(row, query.state))
                .collect(),
            total,
        );
        page.next = next;
        page.capped_at = cap;
        Ok(page)
    }

    /// How many items are in `state`, counted up to `cap` and one more.
    async fn state_count(&self, state: ItemState, cap: Option<u64>) -> Result<u64, Error> {
        let (rows, order) = state_rows(state)?;
        let sql =
            format!("SELECT count(*) FROM (SELECT 1 FROM {rows} ORDER BY {order} LIMIT $2) i");
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(self.inner.id)
            .bind(count_limit(cap))
            .fetch_one(&self.inner.pool)
            .await?;
        Ok(n.max(0).unsigned_abs())
    }

    /// Everything the queue knows about the item stored as `raw` (its JSON text), or `None`
    /// if it knows nothing of it (no row, no failure count, no dead letter). Its states are
    /// in the order of [`ItemState::ALL`], [`ItemState::Dead`] when it has dead letters (of
    /// which the newest ten are listed, oldest first). A ready item's position is its place
    /// in the queue's order, except under flow control, where the hand-out order is the
    /// groups' turns: it has none then.
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
                    CASE WHEN i.ready AND NOT coalesce(
                        (SELECT s.flow FROM workqueue_queues s WHERE s.id = $1), false) THEN (
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
        let dead: Vec<DeadRow> = sqlx::query_as(&format!(
            "SELECT * FROM (
                SELECT {COLUMNS} FROM workqueue_dead
                WHERE queue = $1 AND item = $2 ORDER BY id DESC LIMIT 10
             ) d ORDER BY id"
        ))
        .bind(self.inner.id)
        .bind(raw)
        .fetch_all(&self.inner.pool)
        .await?;
        if ready.is_none() && failures.is_none() && dead.is_empty() {
            return Ok(None);
        }
        let leased = token.is_some();
        let mut detail = ItemDetail::new(raw);
        for (state, is) in [
            (ItemState::Ready, ready == Some(true)),
            (ItemState::Delayed, !leased && due_in.is_some()),
            (ItemState::InFlight, leased),
            (ItemState::Failing, failures.is_some()),
            (ItemState::Dead, !dead.is_empty()),
        ] {
            if is {
                detail.states.push(state);
            }
        }
        detail.priority = if leased {
            priority
        } else {
            ready.map(|_| priority.unwrap_or(0))
        };
        detail.position = position.map(|p| p.max(0).unsigned_abs());
        detail.due_in = due_in.map(seconds);
        detail.lease = token.map(|token| {
            LeaseInfo::new(
                seconds(age.unwrap_or(0.0)),
                seconds(left.unwrap_or(0.0)),
                token.unsigned_abs(),
            )
        });
        detail.readded = dirty == Some(true);
        detail.failures = failures.unwrap_or(0).max(0).unsigned_abs();
        detail.stalls = stalls.unwrap_or(0).max(0).unsigned_abs();
        detail.dead_letters = dead.into_iter().map(letter).collect();
        Ok(Some(detail))
    }

    /// "Run it now" for the item stored as `raw` (its JSON text), its failure count kept:
    /// waiting for a delay, it is queued at once (at the tail of its priority); failing and
    /// neither queued nor leased, it is added as [`add`](Self::add) would; leased with a
    /// delayed re-add pending, that re-add happens as soon as the lease ends. The answer says
    /// which, or why nothing changed ([`Retried::ShutDown`] while the queue is shut down, as
    /// an add would be ignored). With flow control, the item stays in the group the queue
    /// holds it in; one the queue knows only by its failure count joins the group this
    /// handle's group function gives it (`""` for a handle without one, as an operator's).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `raw` is not JSON, or the group function gives it a name the
    /// database cannot keep; a database error.
    pub async fn retry_now(&self, raw: &str) -> Result<Retried, Error> {
        json(raw)?;
        if self.is_closed() {
            return Ok(Retried::ShutDown);
        }
        // The queue's adding lock (an add: see the lock order in 0007_flow.sql), the item's
        // row, then the queue's: the queue is kept from shutting down until this commits, and
        // a shut-down queue rolls the move back. The item's state is read from the
        // statement's snapshot, before its changes. Under flow control the item's group
        // hears of it, as of an add.
        type Seen = (
            i64,
            i64,
            Option<bool>,
            Option<bool>,
            Option<bool>,
            bool,
            Option<String>,
            Option<i32>,
            bool,
        );
        let seen: Option<Seen> = self
            .inner
            .call("retry_now", || async move {
                let mut tx = self.inner.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock_shared(2003920492, $1)")
                    .bind(self.inner.id)
                    .execute(&mut *tx)
                    .await?;
                let seen: Seen = sqlx::query_as(
                    "WITH moved AS (
                        UPDATE workqueue_items i SET ready = true, due = NULL,
                            avail_at = clock_timestamp(), seq = nextval('workqueue_seq'),
                            last_add = 1
                        WHERE i.queue = $1 AND i.key = workqueue_key($2)
                          AND i.token IS NULL AND i.due IS NOT NULL
                        RETURNING i.grp, coalesce(i.priority, 0) AS p),
                     deferred AS (
                        UPDATE workqueue_items i SET dirty = true, due = NULL
                        WHERE i.queue = $1 AND i.key = workqueue_key($2)
                          AND i.token IS NOT NULL AND i.due IS NOT NULL AND NOT i.dirty
                        RETURNING 1),
                     old AS (
                        SELECT ready, token IS NOT NULL AS leased, dirty
                        FROM workqueue_items WHERE queue = $1 AND key = workqueue_key($2))
                     SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM deferred),
                            (SELECT ready FROM old), (SELECT leased FROM old),
                            (SELECT dirty FROM old),
                            EXISTS (SELECT 1 FROM workqueue_failures
                                    WHERE queue = $1 AND key = workqueue_key($2)),
                            (SELECT grp FROM moved), (SELECT p FROM moved),
                            coalesce((SELECT flow FROM workqueue_queues WHERE id = $1), false)",
                )
                .bind(self.inner.id)
                .bind(raw)
                .fetch_one(&mut *tx)
                .await?;
                let (moved, .., group, priority, flow) = &seen;
                if *moved > 0 && *flow {
                    sqlx::query(
                        "INSERT INTO workqueue_arrivals (queue, id, grp, priority, n)
                         VALUES ($1, nextval('workqueue_seq'), coalesce($2, ''), $3, 1)",
                    )
                    .bind(self.inner.id)
                    .bind(group)
                    .bind(priority)
                    .execute(&mut *tx)
                    .await?;
                }
                let shut: bool = sqlx::query_scalar(
                    "SELECT coalesce((SELECT shut_down FROM workqueue_queues
                                      WHERE id = $1 FOR SHARE), false)",
                )
                .bind(self.inner.id)
                .fetch_one(&mut *tx)
                .await?;
                if shut {
                    tx.rollback().await?;
                    return Ok(None);
                }
                tx.commit().await?;
                Ok(Some(seen))
            })
            .await?;
        let Some((moved, deferred, ready, leased, dirty, failing, ..)) = seen else {
            return Ok(Retried::ShutDown);
        };
        if moved > 0 {
            self.notify(1).await?;
            return Ok(Retried::Queued);
        }
        if deferred > 0 {
            return Ok(Retried::Deferred);
        }
        Ok(match (ready, leased, dirty) {
            (Some(true), _, _) | (_, Some(true), Some(true)) => Retried::AlreadyQueued,
            (_, Some(true), _) => Retried::InFlight,
            (None, _, _) if failing => match self.add_raw(raw).await?.kind {
                AddKind::Queued => Retried::Queued,
                AddKind::Deferred => Retried::Deferred,
                AddKind::Ignored => Retried::ShutDown,
                _ => Retried::AlreadyQueued,
            },
            _ => Retried::Unknown,
        })
    }

    /// Takes the item stored as `raw` out of the queue, in one statement: queued or
    /// delayed, it is gone, and its failure count with it; leased, its lease stays with its
    /// holder ([`Removed::leased`]), its pending re-add is dropped, and its failure count
    /// stays. Its dead letters stay. A second call finds nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `raw` is not JSON; a database error.
    pub async fn remove(&self, raw: &str) -> Result<Removed, Error> {
        json(raw)?;
        let (queued, delayed, readd, leased, counts): (bool, bool, bool, bool, bool) = self
            .inner
            .call("remove", || {
                // Items' rows, then failure rows: the lock order.
                sqlx::query_as(
                    "WITH gone AS (
                        DELETE FROM workqueue_items
                        WHERE queue = $1 AND key = workqueue_key($2) AND token IS NULL
                        RETURNING ready, due IS NOT NULL AS delayed),
                     kept AS (
                        UPDATE workqueue_items SET dirty = false, due = NULL, priority = NULL
                        WHERE queue = $1 AND key = workqueue_key($2) AND token IS NOT NULL
                          AND (dirty OR due IS NOT NULL)
                        RETURNING 1),
                     held AS (
                        SELECT 1 FROM workqueue_items
                        WHERE queue = $1 AND key = workqueue_key($2) AND token IS NOT NULL),
                     counts AS (
                        DELETE FROM workqueue_failures
                        WHERE queue = $1 AND key = workqueue_key($2)
                          AND NOT EXISTS (SELECT 1 FROM held)
                        RETURNING 1)
                     SELECT coalesce((SELECT ready FROM gone), false),
                            coalesce((SELECT delayed AND NOT ready FROM gone), false),
                            EXISTS (SELECT 1 FROM kept), EXISTS (SELECT 1 FROM held),
                            EXISTS (SELECT 1 FROM counts)",
                )
                .bind(self.inner.id)
                .bind(raw)
                .fetch_one(&self.inner.pool)
            })
            .await?;
        let mut removed = Removed::default();
        removed.queued = queued;
        removed.delayed = delayed;
        removed.readd = readd;
        removed.leased = leased;
        removed.counts = counts;
        Ok(removed)
    }

    /// Clears the failure count of the item stored as `raw` (its JSON text); the count it
    /// had.
    pub(crate) async fn forget_raw(&self, raw: &str) -> Result<u32, Error> {
        json(raw)?;
        let n: Option<i32> = self
            .inner
            .call("forget", || {
                sqlx::query_scalar(
                    "DELETE FROM workqueue_failures WHERE queue = $1 AND key = workqueue_key($2)
                     RETURNING failures",
                )
                .bind(self.inner.id)
                .bind(raw)
                .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(n.unwrap_or(0).max(0).unsigned_abs())
    }

    /// Adds the item stored as `raw`, as [`add`](Self::add) adds an item: in the group this
    /// handle's group function gives it if it reads the item (`""` for a handle without one,
    /// as an operator's).
    async fn add_raw(&self, raw: &str) -> Result<workq::Added, Error> {
        let raws = [raw.to_owned()];
        let groups = match (&self.group, serde_json::from_str::<T>(raw)) {
            (Some(group), Ok(item)) => {
                let name = group(&item);
                crate::flow::check_group(&name)?;
                Some([name])
            }
            _ => None,
        };
        let options = AddOptions::default();
        let added = self
            .inner
            .call("add", || {
                self.add_texts(
                    &self.inner.pool,
                    &raws,
                    groups.as_ref().map(|g| g.as_slice()),
                    &options,
                )
            })
            .await?;
        Ok(added.into_iter().next().unwrap_or(workq::Added::IGNORED))
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

/// A [`PageEntry`] of `state` from a page's row.
fn entry(row: Row, state: ItemState) -> PageEntry {
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
    let mut entry = PageEntry::new(item.clone(), state);
    entry.priority = priority;
    entry.due_in = due_in.map(seconds);
    entry.lease = token.map(|token| {
        LeaseInfo::new(
            seconds(age.unwrap_or(0.0)),
            seconds(left.unwrap_or(0.0)),
            token.unsigned_abs(),
        )
    });
    entry.failures = failures.map(|f| f.max(0).unsigned_abs());
    entry.dead = id.map(|id| {
        letter((
            id,
            item,
            reason.unwrap_or_default(),
            stalls.unwrap_or(0),
            dead_failures.unwrap_or(0),
            at.unwrap_or(0),
        ))
    });
    entry
}
