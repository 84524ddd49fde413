//! [`Persistence`]: whether the server's settings can keep the queue's promise.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::connection::Conn;
#[cfg(feature = "cluster")]
use crate::connection::OnNode;

/// How often, at most, the server's persistence settings are read again while in use: by a
/// [`RedisAdmin`](crate::RedisAdmin) (see
/// [`RedisAdmin::settings_check_interval`](crate::RedisAdmin::settings_check_interval)) and
/// by a queue handle (see [`Builder::settings_check_interval`](crate::Builder::settings_check_interval)).
pub const SETTINGS_CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// The server settings that decide whether acknowledged adds and dones survive a crash.
///
/// "Nothing lost" needs, on one primary:
/// - `appendonly yes`: without it a restart loses the queue;
/// - `appendfsync always` to survive a power loss or kernel crash (`everysec` survives a crash
///   of `redis-server` itself but may lose about a second of writes to a power loss);
/// - `maxmemory-policy noeviction`: any other policy may evict a queue's keys.
///
/// Failover to an asynchronously replicated replica can still lose acknowledged writes; no
/// setting here prevents that (see the README's "Scaling out").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Persistence {
    /// `appendonly`, if the server let us read it.
    pub appendonly: Option<String>,
    /// `appendfsync`, if the server let us read it.
    pub appendfsync: Option<String>,
    /// `maxmemory-policy`, if the server let us read it.
    pub maxmemory_policy: Option<String>,
    /// The server's version, from `INFO server`.
    pub version: Option<String>,
}

impl Persistence {
    /// Reads the settings with `CONFIG GET` (managed services may refuse it: the fields are
    /// then `None`).
    pub(crate) async fn read<C: ConnectionLike>(con: &mut C) -> Self {
        async fn config<C: ConnectionLike>(con: &mut C, name: &str) -> Option<String> {
            let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(con)
                .await;
            reply.ok().and_then(|pair| pair.into_iter().nth(1))
        }
        let info: Option<String> = redis::cmd("INFO").arg("server").query_async(con).await.ok();
        let version = info.and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("redis_version:"))
                .map(|v| v.trim().to_owned())
        });
        Persistence {
            appendonly: config(con, "appendonly").await,
            appendfsync: config(con, "appendfsync").await,
            maxmemory_policy: config(con, "maxmemory-policy").await,
            version,
        }
    }

    /// The reasons the settings cannot keep "nothing lost"; empty when they can.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.appendonly.as_deref() {
            Some("yes") => {}
            Some(other) => problems.push(format!(
                "appendonly is {other:?}: a restart of the server loses the queue (set appendonly yes)"
            )),
            None => problems.push("cannot read appendonly (CONFIG GET refused)".to_owned()),
        }
        match self.appendfsync.as_deref() {
            Some("always" | "everysec") => {}
            Some(other) => problems.push(format!(
                "appendfsync is {other:?}: the OS decides when writes reach the disk (use always, or everysec)"
            )),
            None => problems.push("cannot read appendfsync (CONFIG GET refused)".to_owned()),
        }
        match self.maxmemory_policy.as_deref() {
            Some("noeviction") => {}
            Some(other) => problems.push(format!(
                "maxmemory-policy is {other:?}: the server may evict the queue's keys (set noeviction)"
            )),
            None => problems.push("cannot read maxmemory-policy (CONFIG GET refused)".to_owned()),
        }
        if let Some(version) = &self.version
            && !crate::connection::supported(version)
        {
            problems.push(format!(
                "server version {version} is older than {}, the oldest this crate runs on",
                crate::MIN_REDIS_VERSION
            ));
        }
        problems
    }

    /// Whether the settings keep acknowledged writes through a crash of the server process.
    pub fn is_durable(&self) -> bool {
        self.problems().is_empty()
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".to_owned());
        write!(
            f,
            "redis {} appendonly={} appendfsync={} maxmemory-policy={}",
            show(&self.version),
            show(&self.appendonly),
            show(&self.appendfsync),
            show(&self.maxmemory_policy)
        )
    }
}

/// Warns about `persistence` once per server address and process.
pub(crate) fn warn_once(server: &str, persistence: &Persistence) {
    static WARNED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let problems = persistence.problems();
    if problems.is_empty() {
        return;
    }
    let first = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(server.to_owned());
    if first {
        tracing::warn!(
            server,
            problems = %problems.join("; "),
            "workq-redis: the server's persistence settings cannot keep acknowledged work through a crash"
        );
    }
}

/// The settings of the server queue `key` lives on: the server, or on a cluster the primary
/// of the key's slot (its keys are there and nowhere else, so only that primary's settings
/// can lose them).
pub(crate) async fn read_for_queue(con: &Conn, key: &str) -> Persistence {
    match con {
        #[cfg(feature = "cluster")]
        Conn::Cluster(c) => Persistence::read(&mut OnNode::primary_of(c.clone(), key)).await,
        con => {
            let _ = key;
            Persistence::read(&mut con.clone()).await
        }
    }
}

/// The settings of the servers something lives on, as read: one reading for a single
/// server (no node named), one per primary of a cluster (named `host:port`).
pub(crate) type Readings = Vec<(Option<String>, Persistence)>;

/// The problems of `readings`, each named by its node on a cluster.
pub(crate) fn problems_of(readings: &Readings) -> Vec<String> {
    readings
        .iter()
        .flat_map(|(node, persistence)| {
            persistence.problems().into_iter().map(move |p| match node {
                Some(node) => format!("{node}: {p}"),
                None => p,
            })
        })
        .collect()
}

/// Logs a change of the settings' problems (`before` to `now`) on `server`, for `queue` if
/// the reader is one queue's handle: a warning while there are some, a note when they are
/// gone. Nothing when they did not change, so a setting is logged once per change, however
/// often it is read.
pub(crate) fn log_change(server: &str, queue: Option<&str>, before: &[String], now: &[String]) {
    if before == now {
        return;
    }
    let queue = queue.unwrap_or_default();
    if now.is_empty() {
        tracing::info!(
            server,
            queue,
            "workq-redis: the server's persistence settings changed: they keep acknowledged work through a crash again"
        );
    } else {
        tracing::warn!(
            server,
            queue,
            problems = %now.join("; "),
            "workq-redis: the server's persistence settings changed: they cannot keep acknowledged work through a crash"
        );
    }
}
