//! Queues on PostgreSQL: [`PgSource`].
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
use std::time::Duration;

use serde_json::value::RawValue;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use workq_postgres::{AddKind, DeadLetter, PageQuery, PgQueue, QueueSummary, Removed};

use crate::redact;
use crate::source::{
    Action, DeadLetterView, End, ItemDetail, ItemPage, ItemState, ItemView, LeaseView, Outcome,
    PageRequest, QueueView, Source, SourceError, SourceStatus,
};

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
/// # async fn run() -> Result<(), workq_dashboard::SourceError> {
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
    pub fn new(url: &str) -> Result<Self, SourceError> {
        // sqlx reads any URL's host and path, whatever its scheme.
        if !["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(SourceError::BadRequest(format!(
                "postgres URL {}: not a postgres:// or postgresql:// URL",
                redact(url)
            )));
        }
        let mut options = PgConnectOptions::from_str(url).map_err(|e| {
            let text = e.to_string().replace(url, &redact(url));
            SourceError::BadRequest(format!("postgres URL {}: {text}", redact(url)))
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
    fn clean(&self, text: String) -> String {
        let mut text = text.replace(&self.url, &redact(&self.url));
        if let Some(password) = &self.password {
            text = text.replace(password.as_str(), "***");
        }
        text
    }

    /// The server is down: the page says so, and the settings are read again once it is up.
    fn down(&self, why: String) -> SourceError {
        self.up.store(false, Ordering::Relaxed);
        self.settings_read.store(false, Ordering::Relaxed);
        SourceError::Unavailable(why)
    }

    /// A queue error as the page shows it: the server cannot be reached, the request was
    /// wrong, or something else went wrong.
    fn error(&self, e: workq_postgres::Error) -> SourceError {
        use workq_postgres::Error as E;
        match &e {
            E::Database(sqlx::Error::PoolTimedOut) => self.down(format!(
                "no connection to the server within {} s (it is down or unreachable, or the \
                 dashboard's {} connections are all busy)",
                CONNECT_TIMEOUT.as_secs(),
                Self::MAX_CONNECTIONS
            )),
            E::Database(db) if unreachable(db) => self.down(self.clean(e.to_string())),
            E::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
                SourceError::Backend(format!(
                    "the database has no workqueue tables on the search path (install the \
                     schema of workq-postgres, version {}): {}",
                    workq_postgres::SCHEMA_VERSION,
                    self.clean(db.to_string())
                ))
            }
            E::Config(m) => SourceError::BadRequest(self.clean(m.clone())),
            _ => SourceError::Backend(self.clean(e.to_string())),
        }
    }

    /// `read`, failing as [`SourceError::Unavailable`] if it takes over [`READ_TIMEOUT`].
    async fn read<T>(
        &self,
        read: impl Future<Output = Result<T, workq_postgres::Error>>,
    ) -> Result<T, SourceError> {
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

    /// A handle on queue `name` ([`SourceError::NotFound`] if the database has no such
    /// queue): a kept one, or one built on the pool (a look-up of the queue and of the
    /// schema's version).
    async fn handle(&self, name: &str) -> Result<PgQueue<Item>, SourceError> {
        if let Some(why) = unopenable(name) {
            return Err(SourceError::BadRequest(format!("queue {name:?}: {why}")));
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
            return Err(SourceError::NotFound);
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
            Err(workq_postgres::Error::Config(_)) => return Err(SourceError::NotFound),
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

    fn item(text: &str) -> Result<Item, SourceError> {
        serde_json::from_str(text).map_err(|e| SourceError::BadRequest(format!("item: {e}")))
    }

    /// "Retry now" of an item `retry_now` did not queue: what the item is doing, and for a
    /// failing item no longer in the queue or a leased one with a delayed re-add, an add
    /// (queued now, or when its lease ends), as the Redis source does.
    async fn retry_otherwise(
        &self,
        queue: &PgQueue<Item>,
        item: &str,
    ) -> Result<Outcome, SourceError> {
        let detail = queue.item_detail(item).await.map_err(|e| self.error(e))?;
        let Some(d) = detail else {
            return Ok(Outcome::new(0, "not delayed or failing in this queue"));
        };
        let ready = d.states.contains(&workq_postgres::ItemState::Ready);
        if ready || d.readded {
            return Ok(Outcome::new(0, "already queued"));
        }
        let leased = d.lease.is_some();
        if leased && d.due_in.is_none() {
            return Ok(Outcome::new(0, "being processed; nothing to retry"));
        }
        if !leased && (d.due_in.is_some() || d.failures == 0) {
            // Delayed again since `retry_now`, or known only by its dead letters.
            return Ok(Outcome::new(0, "not delayed or failing in this queue"));
        }
        let added = queue
            .add(Self::item(item)?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(match added.kind {
            AddKind::Queued => Outcome::new(1, "queued now"),
            AddKind::Deferred => Outcome::new(1, "queued again when its current lease ends"),
            AddKind::Ignored => Outcome::new(0, "the queue is shut down"),
            _ => Outcome::new(0, "already queued"),
        })
    }

    /// "Remove": out of the queue (a lease stays with its holder, its pending re-add goes),
    /// and, unless it is leased, its failure count too, as the Redis source does.
    async fn remove(&self, queue: &PgQueue<Item>, item: &str) -> Result<Outcome, SourceError> {
        let parsed = Self::item(item)?;
        let e = |e| self.error(e);
        let removed = queue.remove(item).await.map_err(e)?;
        let mut parts = Vec::new();
        match removed {
            Removed::Removed => parts.push("taken out of the queue"),
            Removed::PendingDropped => {
                parts.push("its pending re-add is dropped (the lease stays with its holder)");
            }
            _ => {}
        }
        let detail = queue.item_detail(item).await.map_err(e)?;
        let leased = detail.as_ref().is_some_and(|d| d.lease.is_some());
        if !leased && detail.is_some_and(|d| d.failures > 0) {
            queue.forget(parsed).await.map_err(e)?;
            parts.push("its failure count is cleared");
        }
        Ok(if !parts.is_empty() {
            Outcome::new(1, parts.join("; "))
        } else if leased {
            Outcome::new(
                0,
                "being processed with nothing pending: the lease stays with its holder",
            )
        } else {
            Outcome::new(0, "not in the queue")
        })
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

fn view(s: &QueueSummary) -> QueueView {
    QueueView {
        broken: unopenable(&s.name),
        depth: s.depth,
        delayed: s.delayed,
        in_flight: s.in_flight,
        failing: s.failing,
        failures: s.failures,
        stalled: s.stalled,
        dead: s.dead,
        dead_dropped: s.dead_dropped,
        paused: s.paused,
        shut_down: s.shut_down,
        longest_running_s: s.longest_lease.as_secs_f64(),
        unfinished_work_s: s.lease_age_sum.as_secs_f64(),
        // PostgreSQL keeps no running counts of adds, completions or retries.
        adds_total: None,
        completions_total: None,
        retries_total: None,
        ..QueueView::named(s.name.clone())
    }
}

fn letter(d: &DeadLetter) -> DeadLetterView {
    DeadLetterView {
        id: d.id.to_string(),
        item: d.item.clone(),
        error: d.reason.clone(),
        at_ms: d.at_unix_ms.max(0).unsigned_abs(),
        stalls: u64::from(d.stalls),
        failures: u64::from(d.failures),
    }
}

fn lease(l: &workq_postgres::LeaseInfo) -> LeaseView {
    LeaseView {
        age_s: l.age.as_secs_f64(),
        expires_in_s: l.expires_in.as_secs_f64(),
        token: l.token,
        holder: None,
    }
}

fn state_arg(state: ItemState) -> workq_postgres::ItemState {
    match state {
        ItemState::Ready => workq_postgres::ItemState::Ready,
        ItemState::Delayed => workq_postgres::ItemState::Delayed,
        ItemState::InFlight => workq_postgres::ItemState::InFlight,
        ItemState::Failing => workq_postgres::ItemState::Failing,
        ItemState::Dead => workq_postgres::ItemState::Dead,
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

impl Source for PgSource {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn has_actions(&self) -> bool {
        true
    }

    fn has_items(&self) -> bool {
        true
    }

    async fn status(&self) -> SourceStatus {
        SourceStatus {
            up: self.up.load(Ordering::Relaxed),
            error: None,
            server: redact(&self.url),
            warnings: self.warnings.lock().clone(),
        }
    }

    async fn queues(&self) -> Result<Vec<QueueView>, SourceError> {
        let all = self.read(workq_postgres::queues(self.pool())).await?;
        self.read_settings().await;
        Ok(all.iter().map(view).collect())
    }

    async fn queue(&self, name: &str) -> Result<QueueView, SourceError> {
        self.read(workq_postgres::queue_summary(self.pool(), name))
            .await?
            .map(|s| view(&s))
            .ok_or(SourceError::NotFound)
    }

    async fn items(&self, name: &str, request: &PageRequest) -> Result<ItemPage, SourceError> {
        let queue = self.handle(name).await?;
        let query = PageQuery::new(state_arg(request.state), request.limit.clamp(1, 1000))
            .from_last(request.from == End::Last)
            .cursor(request.cursor.clone())
            .search(request.search.clone());
        let page = self.read(queue.items(&query)).await?;
        let items = page
            .items
            .into_iter()
            .map(|i| ItemView {
                priority: i.priority,
                due_in_s: i.due_in.map(|d| d.as_secs_f64()),
                lease: i.lease.as_ref().map(lease),
                failures: i.failures.map(u64::from),
                dead: i.dead.as_ref().map(letter),
                ..ItemView::new(i.item, request.state)
            })
            .collect();
        // Keyset cursors go forward only; the page keeps the cursors it came through.
        Ok(ItemPage {
            items,
            total: page.total,
            next: page.next,
            prev: None,
        })
    }

    async fn item(&self, name: &str, item: &str) -> Result<ItemDetail, SourceError> {
        let queue = self.handle(name).await?;
        let Some(d) = self.read(queue.item_detail(item)).await? else {
            return Err(SourceError::NotFound);
        };
        let mut states: Vec<ItemState> = d.states.iter().copied().filter_map(state_of).collect();
        if !d.dead_letters.is_empty() {
            states.push(ItemState::Dead);
        }
        Ok(ItemDetail {
            item: d.item.clone(),
            states,
            priority: d.priority,
            position: d.position,
            due_in_s: d.due_in.map(|d| d.as_secs_f64()),
            lease: d.lease.as_ref().map(lease),
            readded: d.readded,
            failures: u64::from(d.failures),
            stalls: u64::from(d.stalls),
            dead_letters: d.dead_letters.iter().map(letter).collect(),
        })
    }

    async fn act(&self, name: &str, action: &Action) -> Result<Outcome, SourceError> {
        use workq_postgres::Error as E;
        let queue = self.handle(name).await?;
        let e = |e| self.error(e);
        let id = |id: &str| {
            id.parse::<i64>()
                .map_err(|_| SourceError::BadRequest(format!("not a dead-letter id: {id:?}")))
        };
        let outcome = match action {
            Action::Pause => match queue.pause().await.map_err(e)? {
                true => Outcome::new(1, "paused"),
                false => Outcome::new(0, "already paused"),
            },
            Action::Resume => match queue.resume().await.map_err(e)? {
                true => Outcome::new(1, "resumed"),
                false => Outcome::new(0, "already running"),
            },
            Action::RequeueDeadLetters => match queue.requeue_dead_letters().await {
                Ok(n) => Outcome::new(n as u64, format!("requeued {n} dead letters")),
                Err(E::ShutDown) => Outcome::new(
                    0,
                    "the queue is shut down: no dead letter was requeued (resume it first)",
                ),
                Err(other) => return Err(e(other)),
            },
            Action::PurgeDeadLetters => {
                let n = queue.purge_dead_letters().await.map_err(e)?;
                Outcome::new(n as u64, format!("purged {n} dead letters"))
            }
            Action::RequeueDeadLetter { id: letter } => {
                match queue.requeue_dead_by_id(id(letter)?).await {
                    Ok(true) => Outcome::new(1, "requeued the dead letter"),
                    Ok(false) => {
                        Outcome::new(0, "no such dead letter (requeued or deleted already)")
                    }
                    Err(E::ShutDown) => Outcome::new(
                        0,
                        "the queue is shut down: the dead letter stays (resume it first)",
                    ),
                    Err(other) => return Err(e(other)),
                }
            }
            Action::DeleteDeadLetter { id: letter } => {
                match queue.delete_dead_letter(id(letter)?).await.map_err(e)? {
                    true => Outcome::new(1, "deleted the dead letter"),
                    false => Outcome::new(0, "no such dead letter (requeued or deleted already)"),
                }
            }
            Action::RetryNow { item } => {
                Self::item(item)?;
                match queue.retry_now(item).await {
                    Ok(true) => Outcome::new(1, "queued now"),
                    Ok(false) => self.retry_otherwise(&queue, item).await?,
                    Err(E::ShutDown) => Outcome::new(0, "the queue is shut down"),
                    Err(other) => return Err(e(other)),
                }
            }
            Action::Remove { item } => self.remove(&queue, item).await?,
            Action::Forget { item } => {
                let parsed = Self::item(item)?;
                let n = queue.num_requeues(&parsed).await.map_err(e)?;
                queue.forget(parsed).await.map_err(e)?;
                if n > 0 {
                    Outcome::new(1, format!("cleared {n} failures"))
                } else {
                    Outcome::new(0, "no failures to clear")
                }
            }
        };
        self.up.store(true, Ordering::Relaxed);
        Ok(outcome)
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
