//! [`RedisAdmin`]: an operator's view of every queue under a key prefix, over one connection.
//!
//! A dashboard or a command that looks at many queues must not open a connection per queue:
//! with a thousand queues that is a thousand connections, close to a server's limit. A
//! `RedisAdmin` holds one multiplexed connection that reconnects by itself (a connection
//! manager on a single server, the cluster client on a cluster), opened on first use, lists
//! the queues from the index of queue names they keep themselves (`prefix:queues`, a set each
//! queue registers in when a handle is built), reads every queue's figures in pipelines of
//! 200, and makes queue handles ([`RedisAdmin::queue`]) that share its connection, so each of
//! [`RedisQueue`]'s operations works on any queue without connecting again. The contract every
//! backend implements (`workq::admin::Admin`) is in `admin.rs`.
//!
//! # The index of queue names
//!
//! A listing must not cost more on a server that holds millions of other keys: a `SCAN` of the
//! keyspace looks at every key, whoever owns it. So queues register their names in a set,
//! `prefix:queues` (`SADD` when a handle is built, or for a handle a `RedisAdmin` made, at its
//! first add; `RedisQueue::delete` takes the name out), and a listing reads that set
//! (`SMEMBERS`) and then each named queue's figures: its work grows with the number of
//! queues, never with the size of the keyspace. A name whose queue holds no key (built and
//! never used, or emptied by its last `done`) is read and left out.
//!
//! On a Redis Cluster the index is one key, in the slot of `prefix:queues`, on one primary;
//! registering is a command of its own (never part of a queue's scripts, which may only touch
//! the keys of their queue's slot), and the listing reads the index from that primary and each
//! queue's figures from the primary of its own slot.
//!
//! Queues made by a version that kept no index (and not opened by a handle of this one
//! since, which would register them) are found by a one-time migration, a bounded step per
//! listing: until `prefix:queues:scanned` is set, a listing first scans at most 10 `SCAN`
//! rounds of 1,000 keys on each primary (`SCAN MATCH prefix:{*}:*`), from the cursor the last
//! listing left in `prefix:queues:scanning` (one per primary, so the listings of every
//! process share the work), adds the names it finds to the index, and once every primary's
//! keyspace is scanned sets `prefix:queues:scanned` and drops the cursors. A listing then
//! scans nothing. Meanwhile [`status`](workq::admin::Admin::status) warns that older queues
//! may be missing. [`RedisAdmin::reindex`] scans the whole keyspace at once (to finish the
//! migration, or again while processes of an old version still make queues).

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::{Client, FromRedisValue, Script, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{QueueSummary, redact_url, redact_urls_in};

use crate::builder::{Builder, Opened, Shared, Target};
use crate::connection::validate;
#[cfg(feature = "cluster")]
use crate::connection::{Conn, OnNode};
use crate::error::Error;
use crate::persistence::{Persistence, Readings, SETTINGS_CHECK_INTERVAL, log_change, problems_of};
use crate::queue::RedisQueue;
use crate::reply::{number, parts, parts_ref};
use crate::scripts::{FIGURES, Keys, Oom, script_source};
use crate::stats::figures;

/// Queues summarised per pipeline: each call is about 20 small reads on the server, so a
/// pipeline of 200 keeps the server's other clients waiting no longer than a few milliseconds.
const SUMMARY_CHUNK: usize = 200;

/// Names added to the index per `SADD` of [`RedisAdmin::reindex`].
const INDEX_CHUNK: usize = 1000;

/// Keys asked of each `SCAN` round of [`RedisAdmin::reindex`].
const SCAN_COUNT: usize = 5000;

/// At most this many `SCAN` rounds per primary in [`RedisAdmin::reindex`].
const MAX_SCAN_ROUNDS: usize = 100_000;

/// `SCAN` rounds per primary a listing spends on finding the queues of older versions,
/// until the keyspace is scanned once: with [`MIGRATION_COUNT`], some 10,000 keys looked at.
const MIGRATION_ROUNDS: usize = 10;

/// Keys asked of each of those rounds.
const MIGRATION_COUNT: usize = 1000;

/// A primary's cursor in `prefix:queues:scanning` once its keyspace is scanned.
const SCAN_DONE: &str = "done";

/// The script behind [`RedisAdmin::summary`] and [`RedisAdmin::queues`].
static SUMMARY_SOURCE: LazyLock<String> =
    LazyLock::new(|| script_source(&[FIGURES, include_str!("lua/summary.lua")], Oom::Allow));
static SUMMARY: LazyLock<Script> = LazyLock::new(|| Script::new(&SUMMARY_SOURCE));

/// Reads the reply of the `summary` script for queue `name`: its figures, or `None` if it
/// has no key.
fn parse_summary(name: &str, value: Value) -> Result<Option<QueueSummary>, Error> {
    let read = || {
        let p = parts(value)?;
        if p.len() < 2 {
            return Err(format!("short summary reply: {} fields", p.len()).into());
        }
        figures(name, number(&p[0])?, parts_ref(&p[1])?)
    };
    let (summary, exists) =
        read().map_err(|e: redis::ParsingError| Error::Protocol(format!("summary: {e}")))?;
    Ok(exists.then_some(summary))
}

/// A primary of a cluster, or the single server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    /// The one server of a single-server deployment.
    Single,
    /// A cluster primary by address.
    #[cfg_attr(
        not(feature = "cluster"),
        expect(dead_code, reason = "only a cluster has primaries by address")
    )]
    Addr(String, u16),
}

impl Node {
    /// How the node is named in `prefix:queues:scanning`.
    fn label(&self) -> String {
        match self {
            Node::Single => "server".to_owned(),
            Node::Addr(host, port) => format!("{host}:{port}"),
        }
    }
}

/// Every queue under a key prefix of a Redis server or cluster, over one connection that is
/// opened on first use and reconnects by itself: listings read the queues' own index of names
/// (not the keyspace) and every queue's figures in pipelines, and the queue handles it makes
/// ([`RedisAdmin::queue`]) share the connection, so a dashboard or a tool over a thousand
/// queues holds one connection, not a thousand.
///
/// It implements the operator's contract, [`workq::admin::Admin`]: what the dashboard and
/// `wq` use, as `Box<dyn Admin>`. Its own methods are the Redis-specific rest (handles, the
/// persistence settings, a ping). Clones share the connection.
///
/// ```no_run
/// use workq::admin::Admin;
/// use workq_redis::{RedisAdmin, RedisQueue};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // No connection yet: the first call connects, so a server that is down reads as down.
/// let admin = RedisAdmin::new("redis://127.0.0.1:6379", "wq")?;
/// for queue in admin.queues().await? {
///     match &queue.broken {
///         None => println!("{}: {} ready, {} dead", queue.name, queue.depth, queue.dead),
///         Some(why) => println!("{}: cannot be read: {why}", queue.name),
///     }
/// }
/// // Through the contract, as every backend answers it.
/// let operator: Box<dyn Admin> = Box::new(admin.clone());
/// operator.pause("pods").await?;
/// // A typed handle on the same connection.
/// let pods: RedisQueue<String> = admin.queue("pods").build().await?;
/// pods.add("default/web-0".to_owned()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisAdmin {
    prefix: String,
    shared: Arc<Shared>,
    health: Arc<Health>,
    retry_deadline: Duration,
    settings_check: Duration,
}

/// What the last call found of the server, and how to speak of it.
pub(crate) struct Health {
    /// The last call reached the server.
    pub(crate) up: AtomicBool,
    /// Why the last call did not (no password in it).
    pub(crate) error: Mutex<Option<String>>,
    /// Where the queues live, for people: the URLs with no password.
    pub(crate) server: String,
    /// The URLs as given, and the passwords in them: taken out of every message.
    secrets: Vec<String>,
    /// The persistence settings as last read (of the server, or of every primary of a
    /// cluster), and when: at the connection's opening, then by the periodic check.
    pub(crate) settings: Mutex<Option<(Instant, Readings)>>,
    /// The last listing found the keyspace not yet scanned for the queues of older versions.
    pub(crate) indexing: AtomicBool,
}

impl Health {
    fn new(urls: &[String]) -> Self {
        let mut secrets = Vec::new();
        for url in urls {
            if let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                && let Some(password) = info.redis_settings().password()
                && !password.is_empty()
            {
                secrets.push(password.to_owned());
            }
        }
        Health {
            up: AtomicBool::new(false),
            error: Mutex::new(None),
            server: urls
                .iter()
                .map(|url| redact_url(url))
                .collect::<Vec<_>>()
                .join(", "),
            secrets,
            settings: Mutex::new(None),
            indexing: AtomicBool::new(false),
        }
    }

    /// `text` with no password: every URL in it redacted, and the passwords of the admin's
    /// URLs wherever they appear.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = redact_urls_in(text);
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

impl fmt::Debug for RedisAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAdmin")
            .field("server", &self.health.server)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisAdmin {
    /// The queues under `prefix` (`wq` is the queues' default) on the server at `url`
    /// (`redis://[user:password@]host:port[/db]`, `rediss://` with the feature `tls`). Does
    /// not connect yet: the first call does (within 5 s), so a server that is down reads as
    /// down ([`workq::admin::AdminError::Unavailable`]) rather than failing a start-up, and
    /// as up again once it is back.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a URL that does not parse (the message holds no password) or a
    /// bad prefix.
    pub fn new(url: &str, prefix: &str) -> Result<Self, Error> {
        validate("key prefix", prefix)?;
        let client = Client::open(url)
            .map_err(|e| Error::Config(format!("redis URL {}: {:?}", redact_url(url), e.kind())))?;
        Ok(Self::with(
            &[url.to_owned()],
            prefix,
            Target::Single(Box::new(client)),
        ))
    }

    /// The queues under `prefix` on a Redis Cluster, by the URLs of some of its nodes
    /// (feature `cluster`). Does not connect yet, as [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad prefix.
    #[cfg(feature = "cluster")]
    pub fn cluster<S: Into<String>>(
        nodes: impl IntoIterator<Item = S>,
        prefix: &str,
    ) -> Result<Self, Error> {
        validate("key prefix", prefix)?;
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        Ok(Self::with(&nodes, prefix, Target::Cluster(nodes.clone())))
    }

    fn with(urls: &[String], prefix: &str, target: Target) -> Self {
        RedisAdmin {
            prefix: prefix.to_owned(),
            shared: Arc::new(Shared::new(target)),
            health: Arc::new(Health::new(urls)),
            retry_deadline: Duration::from_secs(1),
            settings_check: SETTINGS_CHECK_INTERVAL,
        }
    }

    /// Connects to the server of `client` for the queues under `prefix`, now: one
    /// connection, which reconnects by itself after the server restarts. Reads the server's
    /// persistence settings once ([`persistence`](Self::persistence)).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad prefix, [`Error::UnsupportedServer`] for a server older than
    /// [`MIN_REDIS_VERSION`](crate::MIN_REDIS_VERSION), [`Error::Redis`] if the server cannot
    /// be reached within 5 s.
    pub async fn connect(client: Client, prefix: &str) -> Result<Self, Error> {
        validate("key prefix", prefix)?;
        let url = client.get_connection_info().addr().to_string();
        let admin = Self::with(&[url], prefix, Target::Single(Box::new(client)));
        admin.open().await?;
        Ok(admin)
    }

    /// Connects to a Redis Cluster now, by the URLs of some of its nodes (feature
    /// `cluster`), for the queues under `prefix`.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster<S: Into<String>>(
        nodes: impl IntoIterator<Item = S>,
        prefix: &str,
    ) -> Result<Self, Error> {
        let admin = Self::cluster(nodes, prefix)?;
        admin.open().await?;
        Ok(admin)
    }

    /// How long the handles of [`queue`](Self::queue) (and the contract's calls) wait out a
    /// server that is restarting or unreachable before an operation fails. Default 1 s: an
    /// operator's page should say the server is down rather than hang.
    #[must_use]
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// How often, at most, the server's persistence settings (`appendonly`, `appendfsync`,
    /// `maxmemory-policy`) are read again while the admin is used: the first call of the
    /// contract after the interval reads them (one `CONFIG GET` each, on every primary of a
    /// cluster), so a setting changed on a running server (`CONFIG SET maxmemory-policy
    /// allkeys-lru`) shows in [`status`](workq::admin::Admin::status)'s warnings, and is
    /// logged once, without a reconnect. Default [`SETTINGS_CHECK_INTERVAL`], a minute; an
    /// idle admin reads nothing.
    #[must_use]
    pub fn settings_check_interval(mut self, interval: Duration) -> Self {
        self.settings_check = interval;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The server's persistence settings as last read: when the connection opened, or since
    /// by the periodic check ([`settings_check_interval`](Self::settings_check_interval)).
    /// `None` before the first call, and on a cluster, where each primary has settings of its
    /// own: [`status`](workq::admin::Admin::status) names each primary's problems.
    pub fn persistence(&self) -> Option<Persistence> {
        match self.readings().as_slice() {
            [(None, persistence)] => Some(persistence.clone()),
            _ => None,
        }
    }

    /// The persistence settings as last read, each named by its primary on a cluster (for
    /// `status`).
    pub(crate) fn readings(&self) -> Readings {
        let checked = self
            .health
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, readings)| readings.clone());
        checked
            .or_else(|| {
                let at_open = self.shared.opened()?.persistence.clone()?;
                Some(vec![(None, at_open)])
            })
            .unwrap_or_default()
    }

    /// Reads the persistence settings again if the last read is older than the interval
    /// (the connection's opening counts as a read on a single server; a cluster's primaries
    /// are first read at the first call, once the connection opened); logs a change of
    /// their problems once. Nothing before the connection opened, or, past the first read,
    /// while the last call found the server down (a read would only wait out the timeouts).
    pub(crate) async fn check_settings(&self) {
        let Some(opened) = self.shared.opened() else {
            return;
        };
        let up = self.health.up.load(std::sync::atomic::Ordering::Relaxed);
        let before = {
            let mut settings = self
                .health
                .settings
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if settings.is_none()
                && let Some(at_open) = &opened.persistence
            {
                *settings = Some((Instant::now(), vec![(None, at_open.clone())]));
            }
            match settings.as_mut() {
                Some((read_at, last)) => {
                    if !up || read_at.elapsed() < self.settings_check {
                        return;
                    }
                    // Whoever gets here first reads; the others keep the last reading
                    // meanwhile.
                    *read_at = Instant::now();
                    problems_of(last)
                }
                // A cluster's primaries, never read yet.
                None => {
                    *settings = Some((Instant::now(), Vec::new()));
                    Vec::new()
                }
            }
        };
        let Some(now) = self.read_settings(opened).await else {
            // Nothing could be read (a server went away meanwhile): keep the last reading.
            return;
        };
        log_change(&self.health.server, None, &before, &problems_of(&now));
        *self
            .health
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), now));
    }

    /// The persistence settings of the server, or of every primary of a cluster (each holds
    /// some of the queues, and has settings of its own); `None` if one could not be read at
    /// all.
    async fn read_settings(&self, opened: &Opened) -> Option<Readings> {
        let mut readings = Vec::new();
        match &opened.con {
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                for node in self.nodes().await.ok()? {
                    let Node::Addr(host, port) = node else {
                        continue;
                    };
                    let route = redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    };
                    let persistence = Persistence::read(&mut OnNode::new(c.clone(), route)).await;
                    readings.push((Some(format!("{host}:{port}")), persistence));
                }
            }
            con => readings.push((None, Persistence::read(&mut con.clone()).await)),
        }
        let unread = readings.is_empty()
            || readings
                .iter()
                .any(|(_, persistence)| *persistence == Persistence::default());
        (!unread).then_some(readings)
    }

    /// What the last call found of the server (for `status`).
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// The connection, opened if it is not yet.
    pub(crate) async fn open(&self) -> Result<&Opened, Error> {
        self.shared.open().await
    }

    /// A builder for a handle on queue `name` that shares this connection: its `build`
    /// opens the connection if no call has yet, and makes no round trip otherwise. Its leases
    /// are not renewed by themselves (`auto_renew(false)`), and its retry deadline is
    /// [`retry_deadline`](Self::retry_deadline)'s; both may be changed on the builder.
    pub fn queue<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        name: &str,
    ) -> Builder<T> {
        RedisQueue::builder(name)
            .prefix(self.prefix.clone())
            .auto_renew(false)
            .check_persistence(false)
            .retry_deadline(self.retry_deadline)
            .shared(self.shared.clone())
    }

    /// Answers whether the server (or every cluster primary known) answers `PING`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn ping(&self) -> Result<(), Error> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.open().await?.con.clone())
            .await?;
        Ok(())
    }

    /// The figures of queue `name`, in one round trip; `None` if it has no key (a queue with
    /// none holds nothing and has never counted anything).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a name no queue can have (braces, white space); a connection
    /// error, or the server's error for a queue that cannot be read (a key of the wrong
    /// type).
    pub async fn summary(&self, name: &str) -> Result<Option<QueueSummary>, Error> {
        validate("queue name", name)?;
        let keys = Keys::new(&self.prefix, name);
        let mut invocation = SUMMARY.prepare_invoke();
        for key in &keys.all {
            invocation.key(key.as_str());
        }
        let mut con = self.open().await?.con.clone();
        let value: Value = invocation.invoke_async(&mut con).await?;
        parse_summary(name, value)
    }

    /// The names in the index of queue names under the prefix, sorted: every queue a handle
    /// was built for (and not deleted since), whether it holds anything or not. Until the
    /// queues of older versions are found (see [`reindex`](Self::reindex)), each call first
    /// scans a bounded part of the keyspace for them (at most 10 `SCAN` rounds of 1,000 keys
    /// per primary), going on where the last call stopped.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn queue_names(&self) -> Result<Vec<String>, Error> {
        let mut con = self.open().await?.con.clone();
        let indexed = self.find_older_queues().await?;
        self.health
            .indexing
            .store(!indexed, std::sync::atomic::Ordering::Relaxed);
        let mut names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(Keys::index(&self.prefix))
            .query_async(&mut con)
            .await?;
        // Anyone with write access may have put anything in the set: a name no queue can
        // have (braces, white space) would make keys of another queue's slot; it is skipped.
        names.retain(|name| validate("queue name", name).is_ok());
        names.sort();
        Ok(names)
    }

    /// The one-time migration of the queues made by a version that kept no index, a bounded
    /// step at a time: unless the keyspace was scanned once already (`prefix:queues:scanned`),
    /// scans at most [`MIGRATION_ROUNDS`] rounds of [`MIGRATION_COUNT`] keys on each primary
    /// from where the last step stopped (each primary's cursor is kept in
    /// `prefix:queues:scanning`, so steps of other processes go on from it too), adds the
    /// queue names it found to the index, and marks the scan done once every primary's is.
    /// Whether the keyspace is scanned.
    async fn find_older_queues(&self) -> Result<bool, Error> {
        let mut con = self.open().await?.con.clone();
        let scanned: bool = redis::cmd("EXISTS")
            .arg(Keys::index_scanned(&self.prefix))
            .query_async(&mut con)
            .await?;
        if scanned {
            return Ok(true);
        }
        let scanning = Keys::index_scanning(&self.prefix);
        let cursors: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&scanning)
            .query_async(&mut con)
            .await?;
        let mut names = Vec::new();
        let mut done = true;
        for node in self.nodes().await? {
            let field = node.label();
            let cursor = match cursors.get(&field).map(String::as_str) {
                Some(SCAN_DONE) => continue,
                Some(cursor) => cursor.parse().unwrap_or(0),
                None => 0,
            };
            let (found, next) = self
                .scan_names(&node, cursor, MIGRATION_ROUNDS, MIGRATION_COUNT)
                .await?;
            names.extend(found);
            let next = match next {
                Some(next) => {
                    done = false;
                    next.to_string()
                }
                None => SCAN_DONE.to_owned(),
            };
            let _: i64 = redis::cmd("HSET")
                .arg(&scanning)
                .arg(field)
                .arg(next)
                .query_async(&mut con)
                .await?;
        }
        self.add_to_index(names).await?;
        if done {
            self.mark_scanned().await?;
        }
        Ok(done)
    }

    /// Scans every primary for the keys of queues under the prefix (`SCAN MATCH
    /// prefix:{*}:*`) in one go, work in proportion to the whole keyspace, adds their names
    /// to the index of queue names and marks the keyspace scanned; answers how many names the
    /// scan found. The listings do the same a bounded step at a time until the keyspace was
    /// scanned once, for the queues made by a version that kept no index: call this to finish
    /// at once, or again while processes of such a version still make new queues.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn reindex(&self) -> Result<usize, Error> {
        let mut names = Vec::new();
        for node in self.nodes().await? {
            let (found, _) = self
                .scan_names(&node, 0, MAX_SCAN_ROUNDS, SCAN_COUNT)
                .await?;
            names.extend(found);
        }
        let found = self.add_to_index(names).await?;
        self.mark_scanned().await?;
        Ok(found)
    }

    /// Adds `names` to the index of queue names; how many distinct names they were.
    async fn add_to_index(&self, mut names: Vec<String>) -> Result<usize, Error> {
        names.sort();
        names.dedup();
        let mut con = self.open().await?.con.clone();
        for chunk in names.chunks(INDEX_CHUNK) {
            let _: i64 = redis::cmd("SADD")
                .arg(Keys::index(&self.prefix))
                .arg(chunk)
                .query_async(&mut con)
                .await?;
        }
        Ok(names.len())
    }

    /// Marks the keyspace scanned for the queues of older versions, and forgets the cursors.
    async fn mark_scanned(&self) -> Result<(), Error> {
        let mut con = self.open().await?.con.clone();
        let _: () = redis::cmd("SET")
            .arg(Keys::index_scanned(&self.prefix))
            .arg(1)
            .query_async(&mut con)
            .await?;
        let _: i64 = redis::cmd("DEL")
            .arg(Keys::index_scanning(&self.prefix))
            .query_async(&mut con)
            .await?;
        self.health
            .indexing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Every queue under the prefix with its figures, sorted by name, in a bounded number of
    /// round trips whatever the size of the keyspace: the index of queue names
    /// ([`queue_names`](Self::queue_names), with a bounded step of the one-time migration
    /// until it is done), then one pipelined script call per queue, 200 to a pipeline. A
    /// name in the index whose queue holds no key is left out. A queue that cannot be read
    /// (a key of the wrong type under its name, say) is listed with
    /// [`QueueSummary::broken`] set (the server's error, with no password) and does not stop
    /// the others.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn queues(&self) -> Result<Vec<QueueSummary>, Error> {
        let mut all = Vec::new();
        for (name, summary) in self.read_every_queue().await? {
            match summary {
                Ok(Some(summary)) => all.push(summary),
                // Its keys went away since the scan.
                Ok(None) => {}
                Err(e) => all.push(QueueSummary::broken(
                    name,
                    self.health.scrub(&e.to_string()),
                )),
            }
        }
        Ok(all)
    }

    /// Every queue under the prefix with its figures or the error that kept them from being
    /// read, sorted by name.
    ///
    /// # Errors
    ///
    /// A connection error.
    #[deprecated(
        since = "0.1.0",
        note = "use `queues`, which marks a queue it cannot read `broken`"
    )]
    pub async fn overview(&self) -> Result<Vec<(String, Result<QueueSummary, Error>)>, Error> {
        Ok(self
            .read_every_queue()
            .await?
            .into_iter()
            .map(|(name, summary)| {
                let summary = summary.map(|s| s.unwrap_or_else(|| QueueSummary::named(&name)));
                (name, summary)
            })
            .collect())
    }

    /// Every queue under the prefix and what its summary read, sorted by name.
    async fn read_every_queue(
        &self,
    ) -> Result<Vec<(String, Result<Option<QueueSummary>, Error>)>, Error> {
        let names = self.queue_names().await?;
        let mut all = Vec::with_capacity(names.len());
        for chunk in names.chunks(SUMMARY_CHUNK) {
            let replies = self.summaries(chunk).await?;
            all.extend(chunk.iter().cloned().zip(replies));
        }
        Ok(all)
    }

    /// The summaries of the queues `names`: one pipeline on a single server; on a cluster,
    /// where a pipeline goes to one primary and the queues' slots are spread, one call per
    /// queue, all sent at once over the multiplexed connection.
    async fn summaries(
        &self,
        names: &[String],
    ) -> Result<Vec<Result<Option<QueueSummary>, Error>>, Error> {
        match &self.open().await?.con {
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                let mut calls = tokio::task::JoinSet::new();
                for (i, name) in names.iter().enumerate() {
                    let mut con = c.clone();
                    let keys = Keys::new(&self.prefix, name);
                    calls.spawn(async move {
                        let mut invocation = SUMMARY.prepare_invoke();
                        for key in &keys.all {
                            invocation.key(key.as_str());
                        }
                        (i, invocation.invoke_async::<Value>(&mut con).await)
                    });
                }
                let mut replies: Vec<Option<Result<Value, redis::RedisError>>> =
                    (0..names.len()).map(|_| None).collect();
                while let Some(done) = calls.join_next().await {
                    let (i, reply) =
                        done.map_err(|e| Error::Protocol(format!("a summary call failed: {e}")))?;
                    replies[i] = Some(reply);
                }
                let replies: Vec<_> = replies
                    .into_iter()
                    .zip(names)
                    .map(|(reply, name)| match reply {
                        Some(Ok(value)) => parse_summary(name, value),
                        Some(Err(e)) => Err(Error::Redis(e)),
                        None => Err(Error::Protocol("a summary call gave no answer".into())),
                    })
                    .collect();
                // A server that cannot be reached fails the listing, as on a single server;
                // only a queue's own error marks that queue broken.
                let mut replies = replies;
                if let Some(at) = replies
                    .iter()
                    .position(|r| r.as_ref().is_err_and(Error::is_connection))
                    && let Err(e) = replies.swap_remove(at)
                {
                    return Err(e);
                }
                Ok(replies)
            }
            _ => self.summary_pipeline(&Node::Single, names).await,
        }
    }

    /// One pipeline of summary calls on `node`; a `NOSCRIPT` (the server's script cache was
    /// emptied, by a restart say) loads the script and sends the pipeline once more.
    async fn summary_pipeline(
        &self,
        node: &Node,
        names: &[String],
    ) -> Result<Vec<Result<Option<QueueSummary>, Error>>, Error> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for name in names {
            let keys = Keys::new(&self.prefix, name);
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(SUMMARY.get_hash()).arg(keys.all.len());
            for key in &keys.all {
                cmd.arg(key.as_str());
            }
            pipe.add_command(cmd);
        }
        for attempt in 0..2 {
            let replies = self.run_pipeline(node, &pipe, names.len()).await?;
            let no_script = replies.iter().any(|r| {
                matches!(r, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
            });
            if no_script && attempt == 0 {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(SUMMARY_SOURCE.as_str());
                let _: Value = self.on_node(node, &load).await?;
                continue;
            }
            return Ok(replies
                .into_iter()
                .zip(names)
                .map(|(reply, name)| match reply {
                    Value::ServerError(e) => Err(Error::Redis(e.into())),
                    value => parse_summary(name, value),
                })
                .collect());
        }
        unreachable!("the second attempt returns")
    }

    async fn run_pipeline(
        &self,
        node: &Node,
        pipe: &redis::Pipeline,
        len: usize,
    ) -> Result<Vec<Value>, Error> {
        let con = &self.open().await?.con;
        match (node, con) {
            #[cfg(feature = "cluster")]
            (Node::Addr(host, port), Conn::Cluster(c)) => Ok(c
                .clone()
                .route_pipeline(
                    pipe.clone(),
                    0,
                    len,
                    redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    },
                )
                .await?),
            _ => {
                let _ = len;
                Ok(pipe.query_async(&mut con.clone()).await?)
            }
        }
    }

    /// Runs `cmd` on `node`.
    async fn on_node<R: FromRedisValue>(&self, node: &Node, cmd: &redis::Cmd) -> Result<R, Error> {
        let con = &self.open().await?.con;
        match (node, con) {
            #[cfg(feature = "cluster")]
            (Node::Addr(host, port), Conn::Cluster(c)) => {
                let value = c
                    .clone()
                    .route_command(
                        cmd.clone(),
                        redis::cluster_routing::RoutingInfo::SingleNode(
                            redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            },
                        ),
                    )
                    .await?;
                Ok(R::from_redis_value(value).map_err(redis::RedisError::from)?)
            }
            _ => Ok(cmd.query_async(&mut con.clone()).await?),
        }
    }

    /// The primaries: the single server, or every primary of the cluster.
    async fn nodes(&self) -> Result<Vec<Node>, Error> {
        match &self.open().await?.con {
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                let slots = c
                    .clone()
                    .route_command(
                        redis::cmd("CLUSTER").arg("SLOTS").clone(),
                        redis::cluster_routing::RoutingInfo::SingleNode(
                            redis::cluster_routing::SingleNodeRoutingInfo::Random,
                        ),
                    )
                    .await?;
                let mut nodes = primaries(&slots);
                nodes.sort();
                nodes.dedup();
                if nodes.is_empty() {
                    return Err(Error::Protocol("CLUSTER SLOTS named no primary".into()));
                }
                Ok(nodes)
            }
            _ => Ok(vec![Node::Single]),
        }
    }

    /// The queue names under the prefix in the keys of `node`, scanned from `cursor` for at
    /// most `rounds` `SCAN` rounds of `count` keys; and the cursor to go on from, `None` once
    /// the node's keyspace is scanned.
    async fn scan_names(
        &self,
        node: &Node,
        mut cursor: u64,
        rounds: usize,
        count: usize,
    ) -> Result<(Vec<String>, Option<u64>), Error> {
        // The prefix is matched literally: its glob characters are escaped.
        let literal: String = self
            .prefix
            .chars()
            .flat_map(|c| {
                let escape = matches!(c, '*' | '?' | '[' | ']' | '\\');
                escape.then_some('\\').into_iter().chain([c])
            })
            .collect();
        let pattern = format!("{literal}:{{*}}:*");
        let head = format!("{}:{{", self.prefix);
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..rounds {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(count);
            let (next, keys): (u64, Vec<Vec<u8>>) = self.on_node(node, &cmd).await?;
            for key in keys {
                let key = String::from_utf8_lossy(&key);
                if let Some(rest) = key.strip_prefix(&head)
                    && let Some((name, _suffix)) = rest.rsplit_once("}:")
                {
                    names.insert(name.to_owned());
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok((names.into_iter().collect(), None));
            }
        }
        Ok((names.into_iter().collect(), Some(cursor)))
    }
}

/// The primaries in a `CLUSTER SLOTS` reply: each slot range's first node.
#[cfg(feature = "cluster")]
fn primaries(slots: &Value) -> Vec<Node> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let Value::Array(primary) = fields.get(2)? else {
                return None;
            };
            let host = crate::reply::text(primary.first()?).ok()?;
            let port = u16::try_from(number(primary.get(1)?).ok()?).ok()?;
            Some(Node::Addr(host, port))
        })
        .collect()
}
