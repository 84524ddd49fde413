//! Every queue of a database for operators: [`PgAdmin`], a handle on the database rather than
//! on one queue, which lists every queue with its figures in one statement, and opens a
//! queue's handle without side effects. Its [`workq::admin::Admin`] implementation is in
//! `admin.rs`.
//!
//! A queue's figures are counted in one statement, one bounded index scan per state, whose
//! counts stop at a cap ([`PgAdmin::count_cap`]): a look at a queue of millions of items costs
//! what one of the cap does.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use workq::admin::QueueSummary;

use crate::error::Error;
use crate::inner::Inner;
use crate::queue::PgQueue;
use crate::units::{count_limit, seconds};

/// The row of [`summary_sql`]: name; ready items, stalled among them; delayed; in flight,
/// re-added among them, stalled among them; failing, their failures; dead letters; dropped
/// letters; shut down; paused; the oldest ready item's wait (s), the longest lease (s), the
/// leases' ages (s).
pub(crate) type SummaryRow = (
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
    i64,
    bool,
    bool,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// Which queues [`summary_sql`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which {
    /// Every queue, by name.
    All,
    /// The queue named `$2`.
    Named,
    /// The queue whose id is `$2`.
    Id,
}

/// The figures of the queues `which` names, one [`SummaryRow`] each, sorted by name. `$1` is
/// how many rows of each state to count at most (a capped count reads one more than its cap;
/// NULL: all). Each state is one index scan in the order of its index, so the figures taken
/// from its rows (stalls, re-adds, failures, ages) come from its first rows when the count
/// stops: the longest lease, the oldest by token, is exact whatever the cap.
///
/// Items with stalls are ready (taken back, or released) or leased (handed out again): the
/// two scans that count those states count them.
pub(crate) fn summary_sql(which: Which) -> String {
    let filter = match which {
        Which::All => "",
        Which::Named => "WHERE s.name = $2",
        Which::Id => "WHERE s.id = $2",
    };
    format!(
        "SELECT s.name, r.depth, r.stalled, d.delayed, l.in_flight, l.dirty, l.stalled,
                f.failing, f.failures, x.dead, s.dead_dropped, s.shut_down, s.paused,
                extract(epoch FROM statement_timestamp() - r.oldest)::float8,
                extract(epoch FROM statement_timestamp() - l.first_lease)::float8,
                extract(epoch FROM l.lease_ages)::float8
         FROM workqueue_queues s
         CROSS JOIN LATERAL (
             SELECT count(*) AS depth, count(*) FILTER (WHERE stalls > 0) AS stalled,
                    min(avail_at) FILTER (WHERE avail_at > '-infinity') AS oldest
             FROM (SELECT stalls, avail_at FROM workqueue_items
                   WHERE queue = s.id AND ready
                   ORDER BY coalesce(priority, 0) DESC, avail_at, seq LIMIT $1) i
         ) r
         CROSS JOIN LATERAL (
             SELECT count(*) AS delayed
             FROM (SELECT 1 FROM workqueue_items
                   WHERE queue = s.id AND due IS NOT NULL AND token IS NULL
                   ORDER BY due LIMIT $1) i
         ) d
         CROSS JOIN LATERAL (
             SELECT count(*) AS in_flight,
                    count(*) FILTER (WHERE dirty OR due <= statement_timestamp()) AS dirty,
                    count(*) FILTER (WHERE stalls > 0) AS stalled,
                    min(leased_at) AS first_lease,
                    sum(greatest(statement_timestamp() - leased_at, interval '0')) AS lease_ages
             FROM (SELECT dirty, due, stalls, leased_at FROM workqueue_items
                   WHERE queue = s.id AND token IS NOT NULL
                   ORDER BY token LIMIT $1) i
         ) l
         CROSS JOIN LATERAL (
             SELECT count(*) AS failing, coalesce(sum(failures), 0)::bigint AS failures
             FROM (SELECT failures FROM workqueue_failures WHERE queue = s.id
                   ORDER BY key LIMIT $1) i
         ) f
         CROSS JOIN LATERAL (
             SELECT count(*) AS dead
             FROM (SELECT 1 FROM workqueue_dead WHERE queue = s.id ORDER BY id LIMIT $1) i
         ) x
         {filter}
         ORDER BY s.name"
    )
}

/// A [`QueueSummary`] from its row, counted with `cap`.
pub(crate) fn summary(row: SummaryRow, cap: Option<u64>) -> QueueSummary {
    let (
        name,
        depth,
        stalled_ready,
        delayed,
        in_flight,
        dirty,
        stalled_leased,
        failing,
        failures,
        dead,
        dropped,
        shut_down,
        paused,
        oldest,
        longest,
        ages,
    ) = row;
    let n = |count: i64| count.max(0).unsigned_abs();
    let mut s = QueueSummary::named(name);
    s.depth = n(depth);
    s.delayed = n(delayed);
    s.in_flight = n(in_flight);
    s.in_flight_dirty = n(dirty);
    s.failing = n(failing);
    s.failures = n(failures);
    s.stalled = n(stalled_ready).saturating_add(n(stalled_leased));
    s.dead = n(dead);
    s.dead_dropped = n(dropped);
    s.shut_down = shut_down;
    s.paused = paused;
    s.oldest_ready = oldest.map(seconds);
    s.longest_lease = seconds(longest.unwrap_or(0.0));
    s.lease_age_sum = seconds(ages.unwrap_or(0.0));
    s.capped_at = cap;
    s
}

/// Every queue of `pool`'s database, by name, with its figures counted with `cap`: one
/// statement.
pub(crate) async fn list(pool: &PgPool, cap: Option<u64>) -> Result<Vec<QueueSummary>, Error> {
    let rows: Vec<SummaryRow> = sqlx::query_as(&summary_sql(Which::All))
        .bind(count_limit(cap))
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|row| summary(row, cap)).collect())
}

/// The queue named `name` of `pool`'s database with its figures counted with `cap`, or
/// `None`: one statement, which reads that queue's rows only.
pub(crate) async fn one(
    pool: &PgPool,
    name: &str,
    cap: Option<u64>,
) -> Result<Option<QueueSummary>, Error> {
    let row: Option<SummaryRow> = sqlx::query_as(&summary_sql(Which::Named))
        .bind(count_limit(cap))
        .bind(name)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|row| summary(row, cap)))
}

/// Every queue in the database behind `pool`, by name, with its figures (exact counts): one
/// statement, which reads every row of every queue.
///
/// # Errors
///
/// [`Error::Database`], also when the schema is not installed.
#[deprecated(
    since = "0.1.0",
    note = "use `PgAdmin::from_pool(pool).queues()`, or `PgAdmin::new(url)`, whose pool has a statement timeout; its counts have a cap"
)]
pub async fn queues(pool: &PgPool) -> Result<Vec<QueueSummary>, Error> {
    list(pool, None).await
}

/// The queue named `name`, with the figures [`queues`] gives, or `None` if the database has
/// no queue of that name: one statement, which reads that queue's rows only.
///
/// # Errors
///
/// [`Error::Database`], also when the schema is not installed.
#[deprecated(
    since = "0.1.0",
    note = "use `PgAdmin::from_pool(pool).summary(name)`, or `PgAdmin::new(url)`, whose pool has a statement timeout; its counts have a cap"
)]
pub async fn queue_summary(pool: &PgPool, name: &str) -> Result<Option<QueueSummary>, Error> {
    one(pool, name, None).await
}

/// How long a call waits for a connection (opening one included) before the server counts as
/// down: short, so that an operator's page says so quickly.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The most queue handles a [`PgAdmin`] keeps (a handle is a few hundred bytes and no
/// connection).
const MAX_HANDLES: usize = 256;

/// The operator's handle on every queue of one PostgreSQL database (the tables of this crate,
/// schema version [`SCHEMA_VERSION`](crate::SCHEMA_VERSION)): what the dashboard and `wq
/// queue` use, through its implementation of [`workq::admin::Admin`], and a program can use
/// directly.
///
/// It holds a small pool of its own, at most [`MAX_CONNECTIONS`](Self::MAX_CONNECTIONS)
/// whatever the number of queues, opened lazily (no connection until a call needs one), each
/// connection checked before use (one the server closed is replaced, so the admin answers
/// again by itself after a restart) and closed after a minute idle; connections are named
/// `workq-admin` in `pg_stat_activity` ([`application_name`](Self::application_name)). Every
/// statement runs under a `statement_timeout` ([`statement_timeout`](Self::statement_timeout),
/// 10 s), so a slow listing or a search stuck behind a lock is cancelled on the server, not
/// only abandoned by its caller. Counts stop at a cap ([`count_cap`](Self::count_cap),
/// [`DEFAULT_COUNT_CAP`](Self::DEFAULT_COUNT_CAP)), so a look at a queue of millions of items
/// costs what one of the cap does.
///
/// It never installs the schema or creates a queue: its role needs the privileges of the
/// operator role (see the crate's "Least privileges"). A call on a queue the database does not have answers
/// not found. Queue handles are built on its pool without side effects (no schema change, no
/// queue created, no `LISTEN` connection, no retries) and kept, at most 256.
///
/// ```no_run
/// use workq::admin::Admin;
/// use workq_postgres::PgAdmin;
///
/// # async fn run() -> Result<(), workq_postgres::Error> {
/// let admin = PgAdmin::new("postgres://ops@127.0.0.1/app")?;
/// for queue in admin.queues().await? {
///     let depth = if queue.is_capped(queue.depth) {
///         format!("{}+", queue.capped_at.unwrap_or_default())
///     } else {
///         queue.depth.to_string()
///     };
///     println!("{}: {depth} ready", queue.name);
/// }
/// // The operator's contract, as the dashboard uses it.
/// let admin: Box<dyn Admin> = Box::new(admin);
/// let paused = admin.pause("emails").await;
/// # let _ = paused;
/// # Ok(())
/// # }
/// ```
pub struct PgAdmin {
    /// Where the queues live, for people: the URL without its password.
    pub(crate) server: String,
    /// Texts to take out of error messages: the URL as given, the password.
    pub(crate) secrets: Vec<String>,
    options: PgConnectOptions,
    /// Made on first use, inside the runtime (the pool's upkeep is a task).
    pool: OnceLock<PgPool>,
    handles: Mutex<HashMap<String, Arc<Inner>>>,
    pub(crate) statement_timeout: Duration,
    pub(crate) count_cap: Option<u64>,
    /// The last call reached the server.
    pub(crate) up: AtomicBool,
    /// Why the last call did not, when it did not.
    pub(crate) error: Mutex<Option<String>>,
    /// Whether the server's settings were read since the admin last reached it.
    pub(crate) settings_read: AtomicBool,
    /// The server's settings that can lose acknowledged work, and the line that states them.
    pub(crate) settings: Mutex<(Vec<String>, Option<String>)>,
}

impl fmt::Debug for PgAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgAdmin")
            .field("server", &self.server)
            .field("statement_timeout", &self.statement_timeout)
            .field("count_cap", &self.count_cap)
            .finish_non_exhaustive()
    }
}

impl PgAdmin {
    /// The most server connections it holds, whatever the number of queues.
    pub const MAX_CONNECTIONS: u32 = 4;

    /// The cap of its counts unless [`count_cap`](Self::count_cap) says otherwise.
    pub const DEFAULT_COUNT_CAP: u64 = 10_000;

    /// The `application_name` of its connections unless the URL or
    /// [`application_name`](Self::application_name) gives one.
    pub const APPLICATION_NAME: &'static str = "workq-admin";

    /// Every queue of the database at `url` (`postgres://user:password@host:port/database`,
    /// `?sslmode=require` for TLS with the feature `tls`). Does not connect yet: a server
    /// that is down answers as down on the first call, not as a failure to start.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a URL that is not a `postgres://` or `postgresql://` URL or does
    /// not parse (the message holds no password).
    pub fn new(url: &str) -> Result<Self, Error> {
        let server = workq::admin::redact_url(url);
        // sqlx reads any URL's host and path, whatever its scheme.
        if !["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(Error::Config(format!(
                "postgres URL {server}: not a postgres:// or postgresql:// URL"
            )));
        }
        let mut secrets = vec![url.to_owned()];
        secrets.extend(password_of(url));
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            let text = scrub(&e.to_string(), &secrets);
            Error::Config(format!("postgres URL {server}: {text}"))
        })?;
        let mut admin = PgAdmin::with_options(options);
        admin.server = server;
        admin.secrets = secrets;
        Ok(admin)
    }

    /// Every queue of the database `options` name, for a program that has its own
    /// [`PgConnectOptions`] (or a pool's: `pool.connect_options()`): the admin opens its own
    /// connections with them. Does not connect yet.
    pub fn with_options(options: PgConnectOptions) -> Self {
        let server = format!(
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username())
        );
        let secrets = Vec::new();
        let options = if options.get_application_name().is_none() {
            options.application_name(Self::APPLICATION_NAME)
        } else {
            options
        };
        PgAdmin {
            server,
            secrets,
            options,
            pool: OnceLock::new(),
            handles: Mutex::new(HashMap::new()),
            statement_timeout: Duration::from_secs(10),
            count_cap: Some(Self::DEFAULT_COUNT_CAP),
            up: AtomicBool::new(false),
            error: Mutex::new(None),
            settings_read: AtomicBool::new(false),
            settings: Mutex::new((Vec::new(), None)),
        }
    }

    /// Every queue of the database behind `pool`, a caller's pool, on which the admin runs
    /// its statements. The pool is the caller's: its size and its connections' settings are
    /// its own, so [`statement_timeout`](Self::statement_timeout) and
    /// [`application_name`](Self::application_name) do not apply to it (set them on the
    /// pool's options: `after_connect`, `PgConnectOptions::application_name`).
    pub fn from_pool(pool: PgPool) -> Self {
        let admin = Self::with_options((*pool.connect_options()).clone());
        // A fresh `OnceLock`: it takes the pool.
        let _ = admin.pool.set(pool);
        admin
    }

    /// Names its connections `name` in `pg_stat_activity` (`wq dashboard` passes
    /// `wq-dashboard`).
    #[must_use]
    pub fn application_name(mut self, name: &str) -> Self {
        self.options = self.options.application_name(name);
        self
    }

    /// How long the server may run one of its statements before it cancels it
    /// (`statement_timeout`, set on each of its connections; at least a millisecond; 10 s
    /// unless set). Giving up on an answer does not stop a query on the server: this does, so
    /// a slow listing or a search stuck behind a lock holds no connection and no lock once
    /// its caller has moved on. A call waits for an answer as long, and 2 s more, before it
    /// counts the server as down. A timeout longer than PostgreSQL takes (`i32::MAX`
    /// milliseconds, about 24.8 days), `Duration::MAX` included, is no limit: the server
    /// cancels nothing (`statement_timeout = 0`) and a call waits as long as it takes.
    #[must_use]
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Counts at most `cap` items of each state of a queue, in its figures and in a page's
    /// total ([`QueueSummary::capped_at`], [`Page::capped_at`](workq::admin::Page::capped_at));
    /// `None`: exact counts, which read every row of a queue. [`DEFAULT_COUNT_CAP`](Self::DEFAULT_COUNT_CAP)
    /// unless set.
    #[must_use]
    pub fn count_cap(mut self, cap: Option<u64>) -> Self {
        self.count_cap = cap;
        self
    }

    /// The pool: at most [`Self::MAX_CONNECTIONS`], none opened until a call needs one, each
    /// checked before use, idle ones closed after a minute, each with the statement timeout.
    pub(crate) fn pool(&self) -> &PgPool {
        // PostgreSQL's own "no limit" for what it cannot take.
        let timeout_ms = i32::try_from(self.statement_timeout.as_millis()).unwrap_or(0);
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

    /// Every queue of the database, by name, with its figures (counts capped at
    /// [`count_cap`](Self::count_cap)): one statement, whatever the number of queues.
    ///
    /// # Errors
    ///
    /// [`Error::Database`], also when the schema is not installed.
    pub async fn queues(&self) -> Result<Vec<QueueSummary>, Error> {
        list(self.pool(), self.count_cap).await
    }

    /// The queue named `name` with the figures [`queues`](Self::queues) gives it, or `None`
    /// if the database has no such queue: one statement, which reads that queue's rows only.
    ///
    /// # Errors
    ///
    /// As for [`queues`](Self::queues).
    pub async fn summary(&self, name: &str) -> Result<Option<QueueSummary>, Error> {
        one(self.pool(), name, self.count_cap).await
    }

    /// A handle on the existing queue `name`, built on the admin's pool without side effects
    /// (no schema change, no queue created, no `LISTEN` connection: its getters poll; no
    /// retries: a failed call answers at once), kept for the next call.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the database has no queue of that name (or no handle can open
    /// one of that name); [`Error::Migrate`] if the schema is missing or of another version;
    /// [`Error::Database`].
    pub async fn queue<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        name: &str,
    ) -> Result<PgQueue<T>, Error> {
        // A cheap look first: a server that is down reads as down (a build reports every
        // failure to read the schema's version alike), and a queue deleted and made again
        // since its handle was kept has another id.
        let id: Option<i32> = sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await?;
        let Some(id) = id else {
            return Err(Error::Config(format!(
                "the database has no queue named {name:?}"
            )));
        };
        let kept = self
            .handles()
            .get(name)
            .filter(|inner| inner.id == id)
            .cloned();
        let inner = match kept {
            Some(inner) => inner,
            None => {
                let built = PgQueue::<T>::builder(name)
                    .pool(self.pool().clone())
                    .migrate(false)
                    .create(false)
                    .listen(false)
                    .retry_deadline(Duration::ZERO)
                    .leave_flow()
                    .build()
                    .await?;
                let mut handles = self.handles();
                if handles.len() >= MAX_HANDLES {
                    // Any one: building it again costs two statements.
                    if let Some(old) = handles.keys().next().cloned() {
                        handles.remove(&old);
                    }
                }
                handles.insert(name.to_owned(), built.inner.clone());
                built.inner
            }
        };
        Ok(PgQueue::from_inner(inner))
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Inner>>> {
        self.handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `text` without any of `secrets`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = workq::admin::redact_urls_in(text);
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    text
}

/// The password in a URL's user information or in its `password=` parameter, as written.
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

#[cfg(test)]
mod tests {
    use super::{password_of, scrub};

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
        assert_eq!(password_of("no url"), None);
    }

    #[test]
    fn secrets_leave_messages() {
        let url = "postgres://app:s3cret@db:5432/app";
        let secrets = [url.to_owned(), "s3cret".to_owned()];
        let text = scrub(
            &format!("cannot reach {url}: password s3cret refused"),
            &secrets,
        );
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("db:5432"), "{text}");
    }
}
