//! [`Persistence`]: whether the server's settings can keep the queue's promise.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use redis::aio::ConnectionLike;

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
