//! Connections: to a single server or a cluster, and the checks a new connection passes
//! (the server's version, the names that become keys).

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{Client, Value};

use crate::error::Error;

/// A connection to a single server or to a cluster; every call goes through it.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A single server, reconnecting by itself.
    Manager(ConnectionManager),
    /// A connection of its own (blocking waits).
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster: each call goes to the primary of its keys' slot.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A cluster connection whose every command goes to one node: the settings of a primary
/// are read with the commands a single server takes (`CONFIG GET`, `INFO`), which the
/// cluster client would otherwise send to every primary and answer with a map.
#[cfg(feature = "cluster")]
pub(crate) struct OnNode {
    con: redis::cluster_async::ClusterConnection,
    node: redis::cluster_routing::SingleNodeRoutingInfo,
}

#[cfg(feature = "cluster")]
impl OnNode {
    /// Commands to `node` over `con`.
    pub(crate) fn new(
        con: redis::cluster_async::ClusterConnection,
        node: redis::cluster_routing::SingleNodeRoutingInfo,
    ) -> Self {
        OnNode { con, node }
    }

    /// Commands to the primary that holds `key`'s slot (it follows a failover).
    pub(crate) fn primary_of(con: redis::cluster_async::ClusterConnection, key: &str) -> Self {
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        Self::new(
            con,
            SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)),
        )
    }
}

#[cfg(feature = "cluster")]
impl redis::aio::ConnectionLike for OnNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        let routing = redis::cluster_routing::RoutingInfo::SingleNode(self.node.clone());
        Box::pin(self.con.route_command(cmd.clone(), routing))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.con
                .route_pipeline(pipeline.clone(), offset, count, self.node.clone()),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Where connections come from.
#[derive(Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per queue, never moved on a hot path"
)]
pub(crate) enum Source {
    Single(Client),
    #[cfg(feature = "cluster")]
    Cluster {
        /// For blocking waits: a response timeout longer than the longest wait.
        blocking: redis::cluster::ClusterClient,
    },
}

/// The `host:port` of a URL, for messages: never its user name or password.
#[cfg_attr(
    all(not(feature = "cluster"), not(test)),
    expect(dead_code, reason = "the cluster's messages name its nodes")
)]
pub(crate) fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

/// The oldest Redis this crate runs on: 7.0, for the `allow-oom` script flag that keeps
/// renewals, `done` and releases working on a full server. [`Builder::build`](crate::Builder::build) checks it.
pub const MIN_REDIS_VERSION: &str = "7.0";

/// Checks a queue name or key prefix: it becomes part of every key, inside or before the
/// Redis Cluster hash tag, and of log lines.
pub(crate) fn validate(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::Config(format!("the {what} must not be empty")));
    }
    if let Some(c) = value
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(Error::Config(format!(
            "the {what} {value:?} contains {c:?}: braces (the hash tag), white space and \
             control characters are not allowed"
        )));
    }
    Ok(())
}

/// The `redis_version`s in an `INFO server` reply (one per node for a cluster).
fn versions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => {
            let text = String::from_utf8_lossy(bytes);
            out.extend(
                text.lines()
                    .filter_map(|line| line.strip_prefix("redis_version:"))
                    .map(|v| v.trim().to_owned()),
            );
        }
        Value::VerbatimString { text, .. } => {
            versions(&Value::BulkString(text.clone().into()), out);
        }
        Value::SimpleString(text) => versions(&Value::BulkString(text.clone().into()), out),
        Value::Array(values) | Value::Set(values) => {
            values.iter().for_each(|v| versions(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| versions(v, out)),
        _ => {}
    }
}

/// Whether `version` (`major.minor.patch`) is at least [`MIN_REDIS_VERSION`].
pub(crate) fn supported(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (7, 0)
}

/// Fails with [`Error::UnsupportedServer`] unless every server is at least
/// [`MIN_REDIS_VERSION`].
pub(crate) async fn check_version(con: &mut Conn) -> Result<(), Error> {
    let info: Value = redis::cmd("INFO").arg("server").query_async(con).await?;
    let mut found = Vec::new();
    versions(&info, &mut found);
    if found.is_empty() {
        return Err(Error::UnsupportedServer(format!(
            "cannot read redis_version from INFO server; workq-redis needs Redis \
             {MIN_REDIS_VERSION} or newer"
        )));
    }
    if let Some(old) = found.iter().find(|v| !supported(v)) {
        return Err(Error::UnsupportedServer(format!(
            "Redis {old} is older than {MIN_REDIS_VERSION}, the oldest workq-redis runs on \
             (it needs script flags such as allow-oom)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_floor_is_7_0() {
        for ok in ["7.0.0", "7.0.15", "7.2.4", "8.0.1", "10.0.0"] {
            assert!(supported(ok), "{ok}");
        }
        for old in ["6.2.14", "5.0.7", "", "garbage"] {
            assert!(!supported(old), "{old}");
        }
        let mut found = Vec::new();
        versions(
            &Value::Array(vec![Value::BulkString(
                b"# Server\r\nredis_version:6.2.1\r\nredis_mode:standalone\r\n".to_vec(),
            )]),
            &mut found,
        );
        assert_eq!(found, ["6.2.1"]);
    }

    #[test]
    fn messages_name_the_host_without_credentials() {
        assert_eq!(host_of("redis://:pw@h:6379/0"), "h:6379");
        assert_eq!(host_of("rediss://user:p@ss@h:1"), "h:1");
        assert_eq!(host_of("redis://h:2"), "h:2");
        assert_eq!(host_of("h:3"), "h:3");
    }

    #[test]
    fn names_with_braces_or_spaces_are_refused() {
        assert!(validate("queue name", "pods").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "a\tb"] {
            let error = validate("queue name", bad).unwrap_err();
            assert!(matches!(error, Error::Config(_)), "{bad:?}");
        }
    }
}
