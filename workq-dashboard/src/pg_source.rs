//! Queues on PostgreSQL: [`PgSource`], the dashboard's [`Admin`] over `workq-postgres`'s
//! operator calls until that crate implements the contract itself (`PgAdmin`).
//!
//! Every queue of the database is one row of `workqueue_queues` (crate `workq-postgres`),
//! so one statement lists them all with their figures ([`workq_postgres::queues`]),
//! whatever their number. Everything goes through one small pool of the source's own (at
//! most [`PgSource::MAX_CONNECTIONS`]), which drops a connection the server closed and opens another
//! on the next call, so the source answers again by itself after a restart. The queues'
//! handles are built on that pool without side effects (no schema change, no queue created,
//! no `LISTEN` connection) and kept, at most [`MAX_HANDLES`] of them.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use workq::admin::{
    Admin, AdminError, BoxFuture, Capabilities, DeadLetter, End, InFlight, ItemDetail, ItemState,
    LeaseInfo, Page, PageEntry, PageQuery, QueueSummary, Removed, Retried, ServerStatus, Stats,
    redact_url as redact,
};
use workq_postgres::{AddKind, PgQueue};

/// Items as stored: the raw JSON text is their identity (its hash is the row's key), kept
/// byte for byte.
type Item = Box<RawValue>;

/// How long a call waits for a connection (opening one included) before the server counts
/// as down: short, so that the page says so quickly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a listing, a page or an item may take before the server counts as down (it
/// hangs, or the network dropped it without a word); the server cancels a statement after
/// as long ([`PgSource::statement_timeout`]).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The most queue handles kept (a handle is a few hundred bytes and no connection).
const MAX_HANDLES: usize = 256;

/// How the source's connections are named in `pg_stat_activity`.
const APPLICATION_NAME: &str = "wq-dashboard";

/// Every queue in one PostgreSQL database (the tables of `workq-postgres`, schema version
/// [`workq_postgres::SCHEMA_VERSION`]), with actions.
///
/// ```no_run
/// use workq_dashboard::{Config, Dashboard, PgSource, RedisSource};
///
/// # async fn run() -> Result<(), workq::admin::AdminError> {
/// let app = Dashboard::new(Config::default())
///     .source(RedisSource::new("redis://127.0.0.1/", "wq")?)
///     .source(PgSource::new("postgres://ops@127.0.0.1/app")?)
///     .router()
///     .expect("a valid configuration");
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
pub struct PgSource {
    /// The URL as given, to take it out of error messages.
    url: String,
    /// The password in the URL, to take it out of error messages.
    password: Option<String>,
    options: PgConnectOptions,
    /// Made on first use, inside the runtime (the pool's upkeep is a task).
    pool: OnceLock<PgPool>,
    handles: parking_lot::Mutex<HashMap<String, PgQueue<Item>>>,
    up: AtomicBool,
    /// Whether the server's settings were read since the source last reached it.
    settings_read: AtomicBool,
    warnings: parking_lot::Mutex<Vec<String>>,
    /// The `statement_timeout` of the source's connections.
    statement_timeout: Duration,
}

impl std::fmt::Debug for PgSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSource")
            .field("url", &redact(&self.url))
            .finish_non_exhaustive()
    }
}

impl PgSource {
    /// The most server connections the source holds, whatever the number of queues.
    pub const MAX_CONNECTIONS: u32 = 4;

    /// The queues in the database at `url` (`postgres://user:password@host:port/database`,
    /// `?sslmode=require` for TLS when `workq-postgres` has its feature `tls`). Does not
    /// connect yet: a server that is down shows as down on the page until it is up. The
    /// source's role needs the privileges of a worker (see `workq-postgres`'s "Least
    /// privileges"); it never changes the schema or creates a queue.
    ///
    /// # Errors
    ///
    /// A URL that does not parse (the message holds no password).
    pub fn new(url: &str) -> Result<Self, AdminError> {
        // sqlx reads any URL's host and path, whatever its scheme.
        if !["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(AdminError::BadRequest(format!(
                "postgres URL {}: not a postgres:// or postgresql:// URL",
                redact(url)
            )));
        }
        let mut options = PgConnectOptions::from_str(url).map_err(|e| {
            let text = e.to_string().replace(url, &redact(url));
            AdminError::BadRequest(format!("postgres URL {}: {text}", redact(url)))
        })?;
        if options.get_application_name().is_none() {
            options = options.application_name(APPLICATION_NAME);
        }
        Ok(PgSource {
            url: url.to_owned(),
            password: password_of(url),
            options,
            pool: OnceLock::new(),
            handles: parking_lot::Mutex::new(HashMap::new()),
            up: AtomicBool::new(false),
            settings_read: AtomicBool::new(false),
            warnings: parking_lot::Mutex::new(Vec::new()),
            statement_timeout: READ_TIMEOUT,
        })
    }

    /// How long the server may run one statement of the source before it cancels it
    /// (`statement_timeout`, set on each of the source's connections; 10 s, as long as the
    /// source waits for an answer). Giving up on an answer does not stop a query on the
    /// server: this does, so a slow listing or a search stuck behind a lock holds no
    /// connection and no lock after the page has moved on. Zero: no limit.
    #[must_use]
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// The pool: at most [`Self::MAX_CONNECTIONS`], none opened until a call needs one, each
    /// checked before use (one the server closed is replaced), idle ones closed after a
    /// minute.
    fn pool(&self) -> &PgPool {
        let timeout_ms = self.statement_timeout.as_millis();
        self.pool.get_or_init(|| {
            PgPoolOptions::new()
                .max_connections(Self::MAX_CONNECTIONS)
                .min_connections(0)
                .acquire_timeout(CONNECT_TIMEOUT)
                .idle_timeout(Some(Duration::from_secs(60)))
                .test_before_acquire(true)
                .after_connect(move |connection, _| {
                    Box::pin(async move {
                        // A SET, not a startup option, so that poolers that refuse startup
                        // options (PgBouncer) take it too.
                        sqlx::query(&format!("SET statement_timeout = {timeout_ms}"))
                            .execute(connection)
                            .await
                            .map(drop)
                    })
                })
                .connect_lazy_with(self.options.clone())
        })
    }

    /// An error's text without the URL's password.
    fn clean(&self, text: &str) -> String {
        let mut text = text.replace(&self.url, &redact(&self.url));
        if let Some(password) = &self.password {
            text = text.replace(password.as_str(), "***");
        }
        text
    }

    /// The server is down: the page says so, and the settings are read again once it is up.
    fn down(&self, why: String) -> AdminError {
        self.up.store(false, Ordering::Relaxed);
        self.settings_read.store(false, Ordering::Relaxed);
        AdminError::Unavailable(why)
    }

    /// A queue error as the page shows it: the server cannot be reached, the request was
    /// wrong, or something else went wrong.
    fn error(&self, e: workq_postgres::Error) -> AdminError {
        use workq_postgres::Error as E;
        match &e {
            E::Database(sqlx::Error::PoolTimedOut) => self.down(format!(
                "no connection to the server within {} s (it is down or unreachable, or the \
                 dashboard's {} connections are all busy)",
                CONNECT_TIMEOUT.as_secs(),
                Self::MAX_CONNECTIONS
            )),
            E::Database(db) if unreachable(db) => self.down(self.clean(&e.to_string())),
            E::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
                AdminError::Backend(format!(
                    "the database has no workqueue tables on the search path (install the \
                     schema of workq-postgres, version {}): {}",
                    workq_postgres::SCHEMA_VERSION,
                    self.clean(&db.to_string())
                ))
            }
            E::Config(m) => AdminError::BadRequest(self.clean(m)),
            E::ShutDown => AdminError::ShutDown,
            _ => AdminError::Backend(self.clean(&e.to_string())),
        }
    }

    /// `read`, failing as [`AdminError::Unavailable`] if it takes over [`READ_TIMEOUT`].
    async fn read<T>(
        &self,
        read: impl Future<Output = Result<T, workq_postgres::Error>>,
    ) -> Result<T, AdminError> {
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(answer)) => {
                self.up.store(true, Ordering::Relaxed);
                Ok(answer)
            }
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(self.down(format!(
                "no answer from the server within {} s",
                READ_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Reads the server settings that decide whether acknowledged work survives a crash,
    /// once after each time the source reaches the server.
    async fn read_settings(&self) {
        if self.settings_read.swap(true, Ordering::Relaxed) {
            return;
        }
        let settings: Result<(String, String, String), _> = sqlx::query_as(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'),
                    current_setting('full_page_writes')",
        )
        .fetch_one(self.pool())
        .await;
        match settings {
            Ok((fsync, commit, pages)) => *self.warnings.lock() = warnings(&fsync, &commit, &pages),
            Err(_) => self.settings_read.store(false, Ordering::Relaxed),
        }
    }

    /// A handle on queue `name` ([`AdminError::NotFound`] if the database has no such
    /// queue): a kept one, or one built on the pool (a look-up of the queue and of the
    /// schema's version).
    async fn handle(&self, name: &str) -> Result<PgQueue<Item>, AdminError> {
        if let Some(why) = unopenable(name) {
            return Err(AdminError::BadRequest(format!("queue {name:?}: {why}")));
        }
        if let Some(handle) = self.handles.lock().get(name) {
            return Ok(handle.clone());
        }
        // A cheap look first, so that a server that is down reads as down (a build reports
        // every failure to read the schema's version alike).
        let found: Option<i32> = self
            .read(async {
                sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
                    .bind(name)
                    .fetch_optional(self.pool())
                    .await
                    .map_err(workq_postgres::Error::from)
            })
            .await?;
        if found.is_none() {
            return Err(AdminError::NotFound);
        }
        let built = PgQueue::<Item>::builder(name)
            .pool(self.pool().clone())
            .migrate(false)
            .create(false)
            .listen(false)
            // The operator (or the page's next refresh) tries again; a call never waits out
            // an outage.
            .retry_deadline(Duration::ZERO)
            .build()
            .await;
        let handle = match built {
            Ok(handle) => handle,
            Err(workq_postgres::Error::Config(_)) => return Err(AdminError::NotFound),
            Err(e) => return Err(self.error(e)),
        };
        let mut handles = self.handles.lock();
        if handles.len() >= MAX_HANDLES {
            // Any one: building it again costs two statements.
            if let Some(old) = handles.keys().next().cloned() {
                handles.remove(&old);
            }
        }
        handles.insert(name.to_owned(), handle.clone());
        Ok(handle)
    }

    fn item(text: &str) -> Result<Item, AdminError> {
        serde_json::from_str(text).map_err(|e| AdminError::BadRequest(format!("item: {e}")))
    }

    /// "Retry now" of an item `retry_now` did not queue: what the item is doing, and for a
    /// failing item no longer in the queue or a leased one with a delayed re-add, an add
    /// (queued now, or when its lease ends), as the Redis backend does.
    async fn retry_otherwise(
        &self,
        queue: &PgQueue<Item>,
        item: &str,
    ) -> Result<Retried, AdminError> {
        let detail = queue.item_detail(item).await.map_err(|e| self.error(e))?;
        let Some(d) = detail else {
            return Ok(Retried::Unknown);
        };
        let ready = d.states.contains(&workq_postgres::ItemState::Ready);
        if ready || d.readded {
            return Ok(Retried::AlreadyQueued);
        }
        let leased = d.lease.is_some();
        if leased && d.due_in.is_none() {
            return Ok(Retried::InFlight);
        }
        if !leased && (d.due_in.is_some() || d.failures == 0) {
            // Delayed again since `retry_now`, or known only by its dead letters.
            return Ok(Retried::Unknown);
        }
        let added = queue
            .add(Self::item(item)?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(match added.kind {
            AddKind::Queued => Retried::Queued,
            AddKind::Deferred => Retried::Deferred,
            AddKind::Ignored => Retried::ShutDown,
            _ => Retried::AlreadyQueued,
        })
    }

    /// "Remove": out of the queue (a lease stays with its holder, its pending re-add goes),
    /// and, unless it is leased, its failure count too, as the Redis backend does.
    async fn take_out(&self, queue: &PgQueue<Item>, item: &str) -> Result<Removed, AdminError> {
        let parsed = Self::item(item)?;
        let e = |e| self.error(e);
        let mut removed = Removed::default();
        match queue.remove(item).await.map_err(e)? {
            workq_postgres::Removed::Removed => removed.queued = true,
            workq_postgres::Removed::PendingDropped => removed.readd = true,
            _ => {}
        }
        let detail = queue.item_detail(item).await.map_err(e)?;
        removed.leased = detail.as_ref().is_some_and(|d| d.lease.is_some());
        if !removed.leased && detail.is_some_and(|d| d.failures > 0) {
            queue.forget(parsed).await.map_err(e)?;
            removed.counts = true;
        }
        Ok(removed)
    }

    /// `call` on the handle of queue `name`, its errors told as the contract tells them.
    async fn on<T, F>(
        &self,
        name: &str,
        call: impl FnOnce(PgQueue<Item>) -> F,
    ) -> Result<T, AdminError>
    where
        F: Future<Output = Result<T, workq_postgres::Error>>,
    {
        let queue = self.handle(name).await?;
        let answer = call(queue).await.map_err(|e| self.error(e))?;
        self.up.store(true, Ordering::Relaxed);
        Ok(answer)
    }
}

/// Whether a connection error says the server cannot be reached (or refuses this client:
/// a wrong password, no such database), rather than that a statement failed.
fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        // 08: connection exceptions; 57P: shutting down, starting up; 28: authentication;
        // 3D000: no such database.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("28")
                || code == "3D000"
        }),
        _ => false,
    }
}

/// Why no handle can open queue `name` (a name the library refuses, written by hand into
/// the table), if none can.
fn unopenable(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("its name is empty".into());
    }
    if name.len() > workq_postgres::MAX_NAME_BYTES {
        return Some(format!(
            "its name is {} bytes long, over the {} a queue may have",
            name.len(),
            workq_postgres::MAX_NAME_BYTES
        ));
    }
    name.chars()
        .find(|c| c.is_control())
        .map(|c| format!("its name holds the control character {c:?}"))
}

/// The password in a URL's user information or in its `password=` parameter.
fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let from_user = authority
        .rsplit_once('@')
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, password)| password.to_owned());
    let from_query = rest.split_once('?').and_then(|(_, query)| {
        query.split('&').find_map(|p| {
            p.split_once('=')
                .filter(|(k, _)| k.eq_ignore_ascii_case("password"))
                .map(|(_, v)| v.to_owned())
        })
    });
    from_user.or(from_query).filter(|p| !p.is_empty())
}

/// The warnings of the server's settings that can lose acknowledged work (as this role's
/// sessions see them).
fn warnings(fsync: &str, synchronous_commit: &str, full_page_writes: &str) -> Vec<String> {
    let mut out = Vec::new();
    if fsync == "off" {
        out.push(
            "fsync is off: a crash of the server's machine can lose or corrupt acknowledged \
             work (set fsync = on)"
                .to_owned(),
        );
    }
    if synchronous_commit == "off" {
        out.push(
            "synchronous_commit is off: a crash loses the last acknowledged adds and dones \
             (set synchronous_commit = on)"
                .to_owned(),
        );
    }
    if full_page_writes == "off" {
        out.push(
            "full_page_writes is off: a crash can corrupt the queues' tables (set \
             full_page_writes = on)"
                .to_owned(),
        );
    }
    out
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn summary_of(s: &workq_postgres::QueueSummary) -> QueueSummary {
    let mut q = QueueSummary::named(s.name.clone());
    q.broken = unopenable(&s.name);
    q.depth = count(s.depth);
    q.delayed = count(s.delayed);
    q.in_flight = count(s.in_flight);
    q.in_flight_dirty = count(s.in_flight_dirty);
    q.failing = count(s.failing);
    q.failures = s.failures;
    q.stalled = count(s.stalled);
    q.dead = count(s.dead);
    q.dead_dropped = s.dead_dropped;
    q.paused = s.paused;
    q.shut_down = s.shut_down;
    q.oldest_ready = s.oldest_ready;
    q.longest_lease = s.longest_lease;
    q.lease_age_sum = s.lease_age_sum;
    // PostgreSQL keeps no running counts of adds, completions or retries.
    q
}

fn letter(d: &workq_postgres::DeadLetter) -> DeadLetter {
    let mut l = DeadLetter::new(d.id.to_string(), d.item.clone());
    l.error.clone_from(&d.reason);
    l.at = SystemTime::UNIX_EPOCH + Duration::from_millis(d.at_unix_ms.max(0).unsigned_abs());
    l.stalls = d.stalls;
    l.failures = d.failures;
    l
}

fn lease(l: &workq_postgres::LeaseInfo) -> LeaseInfo {
    LeaseInfo::new(l.age, l.expires_in, l.token)
}

fn state_arg(state: ItemState) -> workq_postgres::ItemState {
    match state {
        ItemState::Ready => workq_postgres::ItemState::Ready,
        ItemState::Delayed => workq_postgres::ItemState::Delayed,
        ItemState::InFlight => workq_postgres::ItemState::InFlight,
        ItemState::Failing => workq_postgres::ItemState::Failing,
        _ => workq_postgres::ItemState::Dead,
    }
}

fn state_of(state: workq_postgres::ItemState) -> Option<ItemState> {
    match state {
        workq_postgres::ItemState::Ready => Some(ItemState::Ready),
        workq_postgres::ItemState::Delayed => Some(ItemState::Delayed),
        workq_postgres::ItemState::InFlight => Some(ItemState::InFlight),
        workq_postgres::ItemState::Failing => Some(ItemState::Failing),
        workq_postgres::ItemState::Dead => Some(ItemState::Dead),
        _ => None,
    }
}

fn letter_id(id: &str) -> Result<i64, AdminError> {
    id.parse::<i64>()
        .map_err(|_| AdminError::BadRequest(format!("not a dead-letter id: {id:?}")))
}

impl Admin for PgSource {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    fn status(&self) -> ServerStatus {
        let mut status = ServerStatus::new(self.up.load(Ordering::Relaxed), redact(&self.url));
        status.warnings = self.warnings.lock().clone();
        status
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        Box::pin(async move {
            let all = self.read(workq_postgres::queues(self.pool())).await?;
            self.read_settings().await;
            Ok(all.iter().map(summary_of).collect())
        })
    }

    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        Box::pin(async move {
            self.read(workq_postgres::queue_summary(self.pool(), queue))
                .await?
                .map(|s| summary_of(&s))
                .ok_or(AdminError::NotFound)
        })
    }

    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        Box::pin(async move {
            let summary = self.summary(queue).await?;
            let handle = self.handle(queue).await?;
            let s = self.read(handle.stats(limit)).await?;
            let mut stats = Stats::new(summary);
            stats.next_delayed_in = s.next_delayed_in;
            stats.leases = s
                .leases
                .iter()
                .map(|l| {
                    InFlight::new(l.item.clone(), LeaseInfo::new(l.age, l.expires_in, l.token))
                })
                .collect();
            stats.failures = s
                .failures
                .iter()
                .map(|(item, n)| (item.clone(), u32::try_from(*n).unwrap_or(u32::MAX)))
                .collect();
            Ok(stats)
        })
    }

    fn page<'a>(
        &'a self,
        queue: &'a str,
        query: &'a PageQuery,
    ) -> BoxFuture<'a, Result<Page, AdminError>> {
        Box::pin(async move {
            let handle = self.handle(queue).await?;
            let q = workq_postgres::PageQuery::new(state_arg(query.state), query.effective_limit())
                .from_last(query.from == End::Last)
                .cursor(query.cursor.clone())
                .search(query.search.clone());
            let page = self.read(handle.items(&q)).await?;
            let items = page
                .items
                .into_iter()
                .map(|i| {
                    let mut entry = PageEntry::new(i.item, query.state);
                    entry.priority = i.priority;
                    entry.due_in = i.due_in;
                    entry.lease = i.lease.as_ref().map(lease);
                    entry.failures = i.failures;
                    entry.dead = i.dead.as_ref().map(letter);
                    entry
                })
                .collect();
            // Keyset cursors go forward only; the page keeps the cursors it came through.
            let mut out = Page::new(items, page.total);
            out.next = page.next;
            Ok(out)
        })
    }

    fn item_detail<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
        Box::pin(async move {
            let handle = self.handle(queue).await?;
            let Some(d) = self.read(handle.item_detail(item)).await? else {
                return Ok(None);
            };
            let mut detail = ItemDetail::new(d.item.clone());
            detail.states = d.states.iter().copied().filter_map(state_of).collect();
            if !d.dead_letters.is_empty() {
                detail.states.push(ItemState::Dead);
            }
            detail.priority = d.priority;
            detail.position = d.position;
            detail.due_in = d.due_in;
            detail.lease = d.lease.as_ref().map(lease);
            detail.readded = d.readded;
            detail.failures = d.failures;
            detail.stalls = d.stalls;
            detail.dead_letters = d.dead_letters.iter().map(letter).collect();
            Ok(Some(detail))
        })
    }

    fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.pause().await }))
    }

    fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume().await }))
    }

    fn shut_down_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move {
            let was = q.is_fleet_shut_down().await?;
            q.shut_down_fleet().await?;
            Ok(!was)
        }))
    }

    fn resume_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume_fleet().await }))
    }

    fn retry_now<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        Box::pin(async move {
            Self::item(item)?;
            let handle = self.handle(queue).await?;
            match handle.retry_now(item).await {
                Ok(true) => Ok(Retried::Queued),
                Ok(false) => self.retry_otherwise(&handle, item).await,
                Err(workq_postgres::Error::ShutDown) => Ok(Retried::ShutDown),
                Err(e) => Err(self.error(e)),
            }
        })
    }

    fn remove<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Removed, AdminError>> {
        Box::pin(async move {
            let handle = self.handle(queue).await?;
            self.take_out(&handle, item).await
        })
    }

    fn forget<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<u32, AdminError>> {
        Box::pin(async move {
            let parsed = Self::item(item)?;
            self.on(queue, |q| async move {
                let n = q.num_requeues(&parsed).await?;
                q.forget(parsed).await?;
                Ok(u32::try_from(n).unwrap_or(u32::MAX))
            })
            .await
        })
    }

    fn dead_letters<'a>(
        &'a self,
        queue: &'a str,
        from: End,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
        Box::pin(async move {
            let query = PageQuery::new(ItemState::Dead, limit).from(from);
            let page = self.page(queue, &query).await?;
            Ok(page.items.into_iter().filter_map(|e| e.dead).collect())
        })
    }

    fn requeue_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let id = letter_id(id)?;
            self.on(queue, |q| async move { q.requeue_dead_by_id(id).await })
                .await
        })
    }

    fn requeue_dead_letters<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(self.on(queue, |q| async move {
            q.requeue_dead_letters().await.map(count)
        }))
    }

    fn delete_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let id = letter_id(id)?;
            self.on(queue, |q| async move { q.delete_dead_letter(id).await })
                .await
        })
    }

    fn purge_dead_letters<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(self.on(
            queue,
            |q| async move { q.purge_dead_letters().await.map(count) },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{password_of, unopenable, warnings};

    #[test]
    fn the_password_is_found_wherever_the_url_holds_it() {
        assert_eq!(
            password_of("postgres://app:s3cret@db:5432/app").as_deref(),
            Some("s3cret")
        );
        assert_eq!(
            password_of("postgres://app@db/app?sslmode=require&password=pw").as_deref(),
            Some("pw")
        );
        assert_eq!(password_of("postgres://app@db/app"), None);
        assert_eq!(password_of("postgres://app:@db/app"), None);
    }

    #[test]
    fn names_the_library_refuses_are_told_apart() {
        assert_eq!(unopenable("pods"), None);
        assert!(unopenable("a\u{1}b").unwrap().contains("control character"));
        assert!(unopenable(&"x".repeat(300)).unwrap().contains("300 bytes"));
    }

    #[test]
    fn settings_that_lose_work_are_warned_of() {
        assert!(warnings("on", "on", "on").is_empty());
        assert!(warnings("on", "local", "on").is_empty());
        let all = warnings("off", "off", "off");
        assert_eq!(all.len(), 3);
        assert!(all[0].starts_with("fsync is off"));
    }
}
