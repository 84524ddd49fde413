//! [`PgQueue`]: the queue's handle, and what its handles and leases share.

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use workqueue::{AddOptions, TryGet};

use crate::builder::Builder;
use crate::error::Error;
use crate::lease::Lease;

/// The channel every queue's wake-ups go through; the payload is the queue's name.
pub(crate) const CHANNEL: &str = "workqueue";

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddKind {
    /// The queue (or this handle) is shut down: the add was ignored.
    Ignored,
    /// The item was queued (it was new, or waiting for a delay and is ready now).
    Queued,
    /// The item was already queued (or already due to be queued again when its lease ends):
    /// nothing changed but perhaps its priority.
    Duplicate,
    /// The item is being processed: it will be queued again when its lease is done.
    Deferred,
    /// The item waits for its delay (the earliest of its pending delays).
    Delayed,
}

/// The outcome of an add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Added {
    /// What the add did.
    pub kind: AddKind,
    /// The add's place in the queue's order: taken from the sequence that also issues lease
    /// tokens, after the item's row was locked, so a lease whose token is larger was handed
    /// out after this add. Zero when the add was ignored.
    pub seq: u64,
    /// The delay the item got (for a rate-limited add, the rate limiter's answer).
    pub delay: Duration,
}

const IGNORED: Added = Added {
    kind: AddKind::Ignored,
    seq: 0,
    delay: Duration::ZERO,
};

/// A deliberate bug, switched on by [`Builder::mutation`].
///
/// These exist only to prove that the crate's fault tests can fail. Never use them in a
/// deployment.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `done`, renewals and releases accept a holder whatever its fencing token.
    NoFencing,
    /// A `done` of an item re-added while it was processed does not queue it again.
    NoDirtyRequeue,
}

impl Mutation {
    /// The flag `workqueue_done` tests.
    pub(crate) fn bit(self) -> i32 {
        match self {
            Mutation::NoFencing => 1,
            Mutation::NoDirtyRequeue => 2,
        }
    }
}

/// Local wake-ups of one handle's getters and drains.
pub(crate) struct Wakeups {
    /// A generation count; every wake-up bumps it.
    pub(crate) tx: tokio::sync::watch::Sender<u64>,
}

impl Wakeups {
    pub(crate) fn new() -> Self {
        Wakeups {
            tx: tokio::sync::watch::channel(0).0,
        }
    }

    /// Wakes every local getter (and drain).
    pub(crate) fn wake_all(&self) {
        self.tx.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// What every handle and lease of one queue share.
pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) pool: PgPool,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) base_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) bucket: Option<(f64, u32)>,
    pub(crate) poll: Duration,
    pub(crate) max_stalls: u32,
    pub(crate) max_hold: Duration,
    pub(crate) dead_letter_cap: usize,
    pub(crate) retry_deadline: Duration,
    /// [`Mutation`] bits; 0 outside the fault tests.
    pub(crate) mutations: i32,
    /// This handle (and its clones) is shut down: no more gets or adds here.
    pub(crate) shut: AtomicBool,
    /// Leases handed out by this handle that are not finished yet.
    pub(crate) leases_out: AtomicUsize,
    pub(crate) wake: Wakeups,
    /// The `LISTEN` task, stopped with the last handle.
    pub(crate) listener: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// Microseconds, saturating, for the SQL functions.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros())
        .unwrap_or(i64::MAX / 2)
        .min(i64::MAX / 2)
}

/// Clamps a count to what the SQL functions take.
fn int(n: impl TryInto<i32>) -> i32 {
    n.try_into().unwrap_or(i32::MAX)
}

/// Opens the `LISTEN` connection and starts the task that turns notifications for this queue
/// into local wake-ups. A lost connection wakes every getter (a notification may have been
/// missed) and reconnects; meanwhile the getters poll.
pub(crate) async fn start_listener(inner: &Arc<Inner>) -> Result<(), Error> {
    let mut listener = PgListener::connect_with(&inner.pool).await?;
    listener.listen(CHANNEL).await?;
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let task = tokio::spawn(async move {
        loop {
            let received = listener.try_recv().await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            match received {
                Ok(Some(note)) => {
                    if note.payload() == inner.name {
                        inner.wake.wake_all();
                    }
                }
                // The connection was lost; the next call reconnects and listens again.
                Ok(None) => inner.wake.wake_all(),
                Err(error) => {
                    tracing::debug!(queue = %inner.name, %error, "workqueue-postgres: LISTEN failed; retrying");
                    inner.wake.wake_all();
                    drop(inner);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    *inner.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    Ok(())
}

impl Inner {
    /// Runs `op` until it succeeds, fails for good, or the retry deadline passes: a lost
    /// connection or a restarting server is waited out with backoff.
    pub(crate) async fn call_until<R, F, Fut>(
        &self,
        what: &'static str,
        deadline: Instant,
        mut op: F,
    ) -> Result<R, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, sqlx::Error>>,
    {
        let mut backoff = Duration::from_millis(20);
        let mut warned = false;
        loop {
            let error = match op().await {
                Ok(reply) => return Ok(reply),
                Err(e) => Error::from(e),
            };
            let now = Instant::now();
            if !error.is_connection() || now >= deadline {
                return Err(error);
            }
            if !warned {
                tracing::warn!(queue = %self.name, op = what, %error, "workqueue-postgres: retrying");
                warned = true;
            }
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// [`call_until`](Self::call_until) the retry deadline from now.
    pub(crate) async fn call<R, F, Fut>(&self, what: &'static str, op: F) -> Result<R, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, sqlx::Error>>,
    {
        self.call_until(what, Instant::now() + self.retry_deadline, op)
            .await
    }

    /// Renews a lease: `Ok(false)` if it is no longer this holder's.
    pub(crate) async fn renew(
        &self,
        raw: &str,
        token: i64,
        deadline: Instant,
    ) -> Result<bool, Error> {
        let rows = self
            .call_until("renew", deadline, || {
                sqlx::query(
                    "UPDATE workqueue_items SET lease_until = clock_timestamp() + make_interval(secs => $4 / 1e6)
                     WHERE queue = $1 AND item = $2 AND token IS NOT NULL AND (token = $3 OR $5 & 1 = 1)",
                )
                .bind(&self.name)
                .bind(raw)
                .bind(token)
                .bind(micros(self.lease))
                .bind(self.mutations)
                .execute(&self.pool)
            })
            .await?;
        Ok(rows.rows_affected() == 1)
    }

    /// `done` (or a release), retried through a lost connection while the lease could still
    /// be ours.
    pub(crate) async fn finish(&self, raw: &str, token: i64, release: bool) -> Result<(), Error> {
        self.finish_from(raw, token, release, false).await
    }

    /// [`finish`](Self::finish), `unsure` already when an earlier call that may have ended
    /// the lease lost its answer with the connection: a lease found gone is then
    /// [`Error::OutcomeUnknown`], not lost.
    pub(crate) async fn finish_from(
        &self,
        raw: &str,
        token: i64,
        release: bool,
        mut unsure: bool,
    ) -> Result<(), Error> {
        let give_up = Instant::now() + self.lease.max(self.retry_deadline);
        let mut backoff = Duration::from_millis(20);
        loop {
            let outcome: Result<i32, sqlx::Error> =
                sqlx::query_scalar("SELECT workqueue_done($1, $2, $3, $4, $5)")
                    .bind(&self.name)
                    .bind(raw)
                    .bind(token)
                    .bind(release)
                    .bind(self.mutations)
                    .fetch_one(&self.pool)
                    .await;
            match outcome {
                Ok(1 | 2) => return Ok(()),
                Ok(_) if unsure => return Err(Error::OutcomeUnknown),
                Ok(_) => return Err(Error::LeaseLost),
                Err(e) => {
                    let e = Error::from(e);
                    if !e.is_connection() || Instant::now() + backoff >= give_up {
                        return Err(if unsure { Error::OutcomeUnknown } else { e });
                    }
                    // The commit may have been lost with the answer, or may not.
                    unsure = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// A lease of this handle was handed out.
    pub(crate) fn lease_started(&self) {
        self.leases_out.fetch_add(1, Ordering::SeqCst);
    }

    /// A lease of this handle ended: a drain may be waiting for the last one.
    pub(crate) fn lease_ended(&self) {
        if self.leases_out.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake.wake_all();
        }
    }
}

/// A work queue with client-go's rules, kept in PostgreSQL and shared by any number of
/// processes. Cheap to clone: clones are one handle.
///
/// See the [crate documentation](crate) for the rules, transactional enqueue and crashes.
pub struct PgQueue<T> {
    pub(crate) inner: Arc<Inner>,
    pub(crate) _item: PhantomData<fn() -> T>,
}

impl<T> Clone for PgQueue<T> {
    fn clone(&self) -> Self {
        PgQueue {
            inner: self.inner.clone(),
            _item: PhantomData,
        }
    }
}

impl<T> fmt::Debug for PgQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgQueue")
            .field("name", &self.inner.name)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

/// One item given up on: what [`PgQueue::dead_letters`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its place in the dead-letter table.
    pub id: i64,
    /// The item as stored (its JSON text).
    pub item: String,
    /// Why: `stalled` (its leases expired [`max_stalls`](Builder::max_stalls) times in a
    /// row), or the error that kept it from deserializing.
    pub reason: String,
    /// Its expired leases in a row when it was given up.
    pub stalls: u32,
    /// Its rate limiter's failure count then.
    pub failures: u32,
    /// When, in milliseconds since the Unix epoch (database clock).
    pub at_unix_ms: i64,
}

/// One attempt of a get.
enum Attempt<T> {
    Leased(Lease<T>),
    ShutDown,
    /// Nothing ready; the time until the next delay or lease deadline, if any.
    Empty(Option<Duration>),
}

/// The row `workqueue_get` returns.
type GetRow = (i32, Option<String>, Option<i64>, Option<i32>, Option<i64>);

/// The row `workqueue_done_get` returns: the done's answer, then the get's kind, item, token
/// and priority.
type DoneGetRow = (i32, i32, Option<String>, Option<i64>, Option<i32>);

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Connects to `url` and builds the queue `name` with the defaults.
    ///
    /// # Errors
    ///
    /// As for [`Builder::build`].
    pub async fn connect(url: &str, name: &str) -> Result<Self, Error> {
        Self::builder(name).url(url).build().await
    }

    /// A builder for the queue `name`.
    pub fn builder(name: impl Into<String>) -> Builder<T> {
        Builder::new(name.into())
    }

    /// Installs or upgrades the schema on `pool` (what [`Builder::build`] does unless built
    /// with [`migrate(false)`](Builder::migrate)).
    ///
    /// # Errors
    ///
    /// [`Error::Migrate`] or [`Error::Database`].
    pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
        crate::migrate::migrate(pool).await
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The pool the queue uses: begin the transactions of a transactional enqueue on it.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    fn encode(item: &T) -> Result<String, Error> {
        serde_json::to_string(item).map_err(Error::Serialize)
    }

    fn is_closed(&self) -> bool {
        self.inner.shut.load(Ordering::SeqCst)
    }

    /// Adds `item`: client-go's `Add`. An item already queued is not queued twice; an item
    /// being processed is queued again once its lease is done.
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
    /// `AddRateLimited`.
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
        if self.is_closed() {
            return Ok(IGNORED);
        }
        let raw = Self::encode(item.borrow())?;
        let raw = raw.as_str();
        // One transaction, so that a rate-limited add counts its failure once.
        self.inner
            .call("add", || async move {
                let mut tx = self.inner.pool.begin().await?;
                let added = self.add_raw(&mut tx, raw, options).await?;
                tx.commit().await?;
                Ok(added)
            })
            .await
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
        if self.is_closed() {
            return Ok(IGNORED);
        }
        let raw = Self::encode(item.borrow())?;
        Ok(self.add_raw(conn, &raw, options).await?)
    }

    /// The add itself, on `conn`.
    async fn add_raw(
        &self,
        conn: &mut PgConnection,
        raw: &str,
        options: AddOptions,
    ) -> Result<Added, sqlx::Error> {
        let mut delay = options.delay();
        if options.is_rate_limited() {
            let (interval, burst) = self.inner.bucket.map_or((0, 0), |(qps, burst)| {
                (
                    micros(Duration::from_secs_f64(1.0 / qps)).max(1),
                    int(burst),
                )
            });
            let wait: i64 = sqlx::query_scalar("SELECT workqueue_backoff($1, $2, $3, $4, $5, $6)")
                .bind(&self.inner.name)
                .bind(raw)
                .bind(micros(self.inner.base_delay))
                .bind(micros(self.inner.max_delay))
                .bind(interval)
                .bind(burst)
                .fetch_one(&mut *conn)
                .await?;
            let limited = Duration::from_micros(wait.max(0).unsigned_abs());
            // A delay given as well: the shorter one wins.
            delay = if delay.is_zero() {
                limited
            } else {
                delay.min(limited)
            };
        }
        let (kind, seq): (String, i64) =
            sqlx::query_as("SELECT kind, seq FROM workqueue_add($1, $2, $3, $4)")
                .bind(&self.inner.name)
                .bind(raw)
                .bind(options.requested_priority())
                .bind(micros(delay))
                .fetch_one(&mut *conn)
                .await?;
        let kind = match kind.as_str() {
            "ignored" => return Ok(IGNORED),
            "queued" => AddKind::Queued,
            "deferred" => AddKind::Deferred,
            "delayed" => AddKind::Delayed,
            _ => AddKind::Duplicate,
        };
        Ok(Added {
            kind,
            seq: seq.unsigned_abs(),
            delay,
        })
    }

    /// The rate limiter stops tracking `item`: client-go's `Forget`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn forget(&self, item: impl Borrow<T>) -> Result<(), Error> {
        self.forget_raw(&Self::encode(item.borrow())?).await
    }

    /// [`forget`](Self::forget) of the item stored as `raw`.
    async fn forget_raw(&self, raw: &str) -> Result<(), Error> {
        self.inner
            .call("forget", || {
                sqlx::query("DELETE FROM workqueue_failures WHERE queue = $1 AND item = $2")
                    .bind(&self.inner.name)
                    .bind(raw)
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
                    "SELECT failures FROM workqueue_failures WHERE queue = $1 AND item = $2",
                )
                .bind(&self.inner.name)
                .bind(&raw)
                .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(n.unwrap_or(0).max(0).unsigned_abs() as usize)
    }

    /// The number of items ready to hand out now (delays that are due count): client-go's
    /// `Len`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn len(&self) -> Result<usize, Error> {
        let n: i64 = self
            .inner
            .call("len", || {
                sqlx::query_scalar(
                    "SELECT count(*) FROM workqueue_items i WHERE i.queue = $1 AND (i.ready OR
                        (i.token IS NULL AND i.due <= clock_timestamp() AND NOT EXISTS
                            (SELECT 1 FROM workqueue_queues s WHERE s.name = $1 AND s.shut_down)))",
                )
                .bind(&self.inner.name)
                .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(n.max(0).unsigned_abs() as usize)
    }

    /// Whether no item is ready to hand out now.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The number of items waiting for a delay (and not queued or leased).
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn delayed_len(&self) -> Result<usize, Error> {
        self.count("WHERE queue = $1 AND NOT ready AND token IS NULL AND due IS NOT NULL")
            .await
    }

    /// The number of items under a lease.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn processing_len(&self) -> Result<usize, Error> {
        self.count("WHERE queue = $1 AND token IS NOT NULL").await
    }

    async fn count(&self, filter: &'static str) -> Result<usize, Error> {
        let sql = format!("SELECT count(*) FROM workqueue_items {filter}");
        let n: i64 = self
            .inner
            .call("count", || {
                sqlx::query_scalar(&sql)
                    .bind(&self.inner.name)
                    .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(n.max(0).unsigned_abs() as usize)
    }

    /// One get attempt, with the deadline for transient failures.
    async fn attempt(&self, deadline: Instant) -> Result<Attempt<T>, Error> {
        loop {
            if self.is_closed() {
                return Ok(Attempt::ShutDown);
            }
            let started = Instant::now();
            let (kind, item, token, priority, wait): GetRow = self
                .inner
                .call_until("get", deadline, || {
                    sqlx::query_as(
                        "SELECT kind, item, token, priority, wait_us FROM workqueue_get($1, $2, $3, $4)",
                    )
                    .bind(&self.inner.name)
                    .bind(micros(self.inner.lease))
                    .bind(int(self.inner.max_stalls))
                    .bind(int(self.inner.dead_letter_cap))
                    .fetch_one(&self.inner.pool)
                })
                .await?;
            match (kind, item, token) {
                (1, Some(raw), Some(token)) => {
                    if let Some(lease) = self.leased(raw, token, priority, started).await? {
                        return Ok(Attempt::Leased(lease));
                    }
                }
                (2, _, _) => return Ok(Attempt::ShutDown),
                _ => {
                    let wait = wait.map(|us| Duration::from_micros(us.max(1).unsigned_abs()));
                    return Ok(Attempt::Empty(wait));
                }
            }
        }
    }

    /// The lease of an item `workqueue_get` handed out, or `None` if its text does not
    /// deserialize (then it is moved to the dead letters).
    async fn leased(
        &self,
        raw: String,
        token: i64,
        priority: Option<i32>,
        started: Instant,
    ) -> Result<Option<Lease<T>>, Error> {
        match serde_json::from_str::<T>(&raw) {
            Ok(value) => Ok(Some(Lease::new(
                self.inner.clone(),
                value,
                raw,
                token,
                priority.unwrap_or(0),
                started,
            ))),
            Err(error) => {
                tracing::warn!(queue = %self.inner.name, item = %raw, %error,
                    "workqueue-postgres: an item cannot be deserialized; moved to the dead letters");
                self.bury(&raw, token, &error.to_string()).await?;
                Ok(None)
            }
        }
    }

    /// Marks `lease` done and hands out the next ready item, if any, without waiting: a
    /// worker's step from one item to the next in one call of `workqueue_done_get`, so one
    /// round trip and one commit instead of a `done` and a `get`. With `forget`, the item's
    /// failures are forgotten first (client-go's `Forget` after a success), in the same call.
    ///
    /// The `done` follows [`Lease::done`]'s rules: fenced by the lease's token, and an item
    /// re-added while processing is queued again (and may be the one handed out). The next
    /// item is handed out only when the `done` was accepted, and only while this handle is
    /// not shut down (then it is a plain `done`). `Ok(None)`: nothing was ready; call
    /// [`get`](Self::get) to wait for the next item.
    ///
    /// # Errors
    ///
    /// As for [`Lease::done`]. When the connection is lost during the call, the `done` is
    /// retried alone, as [`Lease::done`] retries it; a next lease the lost call may have
    /// taken is never seen, and is handed out again once it expires.
    pub async fn done_and_get(
        &self,
        mut lease: Lease<T>,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        if self.is_closed() {
            let forgotten = if forget {
                self.forget(lease.item()).await
            } else {
                Ok(())
            };
            lease.done().await?;
            return forgotten.map(|()| None);
        }
        let started = Instant::now();
        let (raw, token) = lease.finish_for_call();
        let reply: Result<DoneGetRow, sqlx::Error> = sqlx::query_as(
            "SELECT done, kind, item, token, priority
             FROM workqueue_done_get($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&self.inner.name)
        .bind(raw)
        .bind(token)
        .bind(forget)
        .bind(self.inner.mutations)
        .bind(micros(self.inner.lease))
        .bind(int(self.inner.max_stalls))
        .bind(int(self.inner.dead_letter_cap))
        .fetch_one(&self.inner.pool)
        .await;
        let (done, kind, item, next, priority) = match reply {
            Ok(row) => row,
            Err(error) => {
                let error = Error::from(error);
                if !error.is_connection() {
                    return Err(error);
                }
                // The call may or may not have committed: settle the done (and the forget)
                // on their own.
                let forgotten = if forget {
                    self.forget_raw(raw).await
                } else {
                    Ok(())
                };
                self.inner.finish_from(raw, token, false, true).await?;
                return forgotten.map(|()| None);
            }
        };
        if !matches!(done, 1 | 2) {
            return Err(Error::LeaseLost);
        }
        match (kind, item, next) {
            (1, Some(raw), Some(next)) => self.leased(raw, next, priority, started).await,
            _ => Ok(None),
        }
    }

    /// Moves a leased item to the dead letters (if the lease is still `token`'s).
    async fn bury(&self, raw: &str, token: i64, reason: &str) -> Result<(), Error> {
        self.inner
            .call("dead letter", || {
                sqlx::query(
                    "SELECT workqueue_bury($1, $2, $3, $4) FROM workqueue_items
                     WHERE queue = $1 AND item = $2 AND token = $5",
                )
                .bind(&self.inner.name)
                .bind(raw)
                .bind(reason)
                .bind(int(self.inner.dead_letter_cap))
                .bind(token)
                .execute(&self.inner.pool)
            })
            .await?;
        Ok(())
    }

    /// Waits for the next item and hands it out under a [`Lease`]: client-go's `Get`.
    /// `Ok(None)` once this handle is shut down, or the queue is and has nothing ready.
    ///
    /// Getters wake on the queue's `NOTIFY`s, and look again at least every
    /// [`poll_interval`](Builder::poll_interval) and when a delay or a lease deadline is due.
    /// Cancel safe: a dropped future loses no item.
    ///
    /// # Errors
    ///
    /// A database error that outlasted the retry deadline.
    pub async fn get(&self) -> Result<Option<Lease<T>>, Error> {
        let mut rx = self.inner.wake.tx.subscribe();
        loop {
            rx.borrow_and_update();
            let deadline = Instant::now() + self.inner.retry_deadline;
            match self.attempt(deadline).await? {
                Attempt::Leased(lease) => return Ok(Some(lease)),
                Attempt::ShutDown => return Ok(None),
                Attempt::Empty(wait) => {
                    let wait = wait.map_or(self.inner.poll, |w| w.min(self.inner.poll));
                    tokio::select! {
                        _ = rx.changed() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One look at the queue without waiting: client-go has no such call, the in-memory
    /// queue's `try_get` does. [`TryGet::Leased`], [`TryGet::Empty`] or
    /// [`TryGet::ShutDown`]; [`TryGet::into_result`] gives the in-memory queue's shape.
    ///
    /// # Errors
    ///
    /// As for [`get`](Self::get).
    pub async fn try_get(&self) -> Result<TryGet<Lease<T>>, Error> {
        let deadline = Instant::now() + self.inner.retry_deadline;
        Ok(match self.attempt(deadline).await? {
            Attempt::Leased(lease) => TryGet::Leased(lease),
            Attempt::ShutDown => TryGet::ShutDown,
            Attempt::Empty(_) => TryGet::Empty,
        })
    }

    /// Shuts this handle (and its clones) down: its adds are ignored and its getters return
    /// `None`. The queue goes on for the other processes; see
    /// [`shut_down_fleet`](Self::shut_down_fleet).
    pub fn shut_down(&self) {
        self.inner.shut.store(true, Ordering::SeqCst);
        self.inner.wake.wake_all();
    }

    /// Shuts this handle down, then waits until no lease it handed out is held: client-go's
    /// `ShutDownWithDrain`.
    ///
    /// # Errors
    ///
    /// None today; the signature leaves room for a backend's failure.
    pub async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.shut_down();
        let mut rx = self.inner.wake.tx.subscribe();
        while self.inner.leases_out.load(Ordering::SeqCst) > 0 {
            // A lease ending wakes this; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
        Ok(())
    }

    /// Shuts the queue down for every process: client-go's `ShutDown` of the shared queue.
    /// Adds are ignored, ready items are still handed out, delayed ones wait (on the server)
    /// for [`resume_fleet`](Self::resume_fleet).
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn shut_down_fleet(&self) -> Result<(), Error> {
        self.set_fleet_shut_down(true).await.map(|_| ())
    }

    /// Undoes [`shut_down_fleet`](Self::shut_down_fleet); `Ok(true)` if the queue was shut
    /// down.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn resume_fleet(&self) -> Result<bool, Error> {
        self.set_fleet_shut_down(false).await
    }

    async fn set_fleet_shut_down(&self, shut: bool) -> Result<bool, Error> {
        self.inner
            .call("shut_down_fleet", || async move {
                let mut tx = self.inner.pool.begin().await?;
                let was: Option<bool> = sqlx::query_scalar(
                    "SELECT shut_down FROM workqueue_queues WHERE name = $1 FOR UPDATE",
                )
                .bind(&self.inner.name)
                .fetch_optional(&mut *tx)
                .await?;
                sqlx::query("UPDATE workqueue_queues SET shut_down = $2 WHERE name = $1")
                    .bind(&self.inner.name)
                    .bind(shut)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(CHANNEL)
                    .bind(&self.inner.name)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(was == Some(!shut))
            })
            .await
    }

    /// Whether this handle, or the queue for everyone, is shut down: client-go's
    /// `ShuttingDown`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn is_shutting_down(&self) -> Result<bool, Error> {
        if self.is_closed() {
            return Ok(true);
        }
        let shut: Option<bool> = self
            .inner
            .call("is_shutting_down", || {
                sqlx::query_scalar("SELECT shut_down FROM workqueue_queues WHERE name = $1")
                    .bind(&self.inner.name)
                    .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(shut == Some(true))
    }

    /// The newest dead letters, at most `limit`.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, String, i32, i32, i64)> = self
            .inner
            .call("dead_letters", || {
                sqlx::query_as(
                    "SELECT id, item, reason, stalls, failures,
                            (extract(epoch FROM at) * 1000)::bigint
                     FROM workqueue_dead WHERE queue = $1 ORDER BY id DESC LIMIT $2",
                )
                .bind(&self.inner.name)
                .bind(limit)
                .fetch_all(&self.inner.pool)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, item, reason, stalls, failures, at_unix_ms)| DeadLetter {
                    id,
                    item,
                    reason,
                    stalls: stalls.max(0).unsigned_abs(),
                    failures: failures.max(0).unsigned_abs(),
                    at_unix_ms,
                },
            )
            .collect())
    }

    /// How many dead letters the cap dropped so far.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn dead_dropped(&self) -> Result<u64, Error> {
        let n: Option<i64> = self
            .inner
            .call("dead_dropped", || {
                sqlx::query_scalar("SELECT dead_dropped FROM workqueue_queues WHERE name = $1")
                    .bind(&self.inner.name)
                    .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(n.unwrap_or(0).max(0).unsigned_abs())
    }

    /// Adds a dead letter's item to the queue again and removes the letter; `Ok(false)` if
    /// the letter was gone already.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        self.requeue_dead(Some(letter.id)).await.map(|n| n == 1)
    }

    /// Adds every dead letter's item to the queue again; returns how many.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn requeue_dead_letters(&self) -> Result<usize, Error> {
        self.requeue_dead(None).await
    }

    async fn requeue_dead(&self, id: Option<i64>) -> Result<usize, Error> {
        let n: i64 = self
            .inner
            .call("requeue_dead_letters", || {
                sqlx::query_scalar(
                    "WITH gone AS (
                        DELETE FROM workqueue_dead WHERE queue = $1 AND ($2::bigint IS NULL OR id = $2)
                        RETURNING item
                     )
                     SELECT count(a.*) FROM gone, LATERAL workqueue_add($1, gone.item, NULL, 0) a",
                )
                .bind(&self.inner.name)
                .bind(id)
                .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(n.max(0).unsigned_abs() as usize)
    }

    /// Deletes every dead letter; returns how many.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn purge_dead_letters(&self) -> Result<usize, Error> {
        let rows = self
            .inner
            .call("purge_dead_letters", || {
                sqlx::query("DELETE FROM workqueue_dead WHERE queue = $1")
                    .bind(&self.inner.name)
                    .execute(&self.inner.pool)
            })
            .await?;
        Ok(usize::try_from(rows.rows_affected()).unwrap_or(usize::MAX))
    }

    /// Deletes the whole queue from the database: items, leases, failure counts, dead
    /// letters and its shut-down state. Leases still held are lost (their `done` is refused).
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn delete(&self) -> Result<(), Error> {
        self.inner
            .call("delete", || async move {
                let mut tx = self.inner.pool.begin().await?;
                for sql in [
                    "DELETE FROM workqueue_items WHERE queue = $1",
                    "DELETE FROM workqueue_failures WHERE queue = $1",
                    "DELETE FROM workqueue_dead WHERE queue = $1",
                    "UPDATE workqueue_queues SET shut_down = false, bucket_tat = NULL WHERE name = $1",
                ] {
                    sqlx::query(sql)
                        .bind(&self.inner.name)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            })
            .await?;
        Ok(())
    }
}
