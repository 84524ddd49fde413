//! [`Admin`]: an operator's view of every queue under a key prefix, over one connection.
//!
//! A dashboard or a command that looks at many queues must not open a connection per queue:
//! with a thousand queues that is a thousand connections, close to a server's limit. An
//! `Admin` holds one multiplexed connection that reconnects by itself (a connection manager on
//! a single server, the cluster client on a cluster), lists the queues with `SCAN` on every
//! primary, reads every queue's figures in one pipeline per primary, and makes queue handles
//! ([`Admin::queue`]) that share its connection, so each of [`RedisQueue`]'s operations works
//! on any queue without connecting again.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{Client, FromRedisValue, ParsingError, Script, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::builder::{Builder, Shared};
use crate::connection::{Conn, Source, check_version, validate};
use crate::error::Error;
use crate::persistence::{self, Persistence};
use crate::queue::RedisQueue;
use crate::reply::{self, count, number, parts, span};
use crate::scripts::{Keys, Oom, script_source};
use crate::stats::Counters;

/// Queues summarised per pipeline: each call is about 20 small reads on the server, so a
/// pipeline of 200 keeps the server's other clients waiting no longer than a few milliseconds.
const SUMMARY_CHUNK: usize = 200;

/// Keys asked of each `SCAN` round.
const SCAN_COUNT: usize = 5000;

/// At most this many `SCAN` rounds per primary per listing.
const MAX_SCAN_ROUNDS: usize = 100_000;

/// The script behind [`Admin::overview`].
static SUMMARY_SOURCE: LazyLock<String> =
    LazyLock::new(|| script_source(&[include_str!("lua/summary.lua")], Oom::Allow));
static SUMMARY: LazyLock<Script> = LazyLock::new(|| Script::new(&SUMMARY_SOURCE));

/// One queue's figures in a listing ([`Admin::overview`]), read atomically on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Items ready to hand out, at every priority.
    pub depth: usize,
    /// Items waiting for a delay.
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items under a lease that were re-added meanwhile.
    pub in_flight_dirty: usize,
    /// Items with a failure count.
    pub failing: usize,
    /// The sum of the failure counts (of the first 1,000 items when more are failing).
    pub failures: u64,
    /// Items whose lease expired at least once and was reclaimed.
    pub stalled: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by the cap.
    pub dead_dropped: u64,
    /// Whether the queue is shut down for every process.
    pub shut_down: bool,
    /// Whether the queue is paused ([`RedisQueue::pause`]).
    pub paused: bool,
    /// The queue's running totals.
    pub counters: Counters,
    /// How long the oldest lease out has been held (server clock).
    pub longest_lease: Duration,
    /// The sum of how long the leases out have been held (of the 1,000 with the nearest
    /// deadlines when more are out).
    pub lease_age_sum: Duration,
    /// Whether any key of the queue exists (a queue with none holds nothing and has never
    /// counted anything).
    pub exists: bool,
}

impl FromRedisValue for Summary {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let p = parts(value)?;
        if p.len() < 18 {
            return Err(format!("short summary reply: {} fields", p.len()).into());
        }
        let now = number(&p[0])?;
        let n = |i: usize| count(&p[i]).map(|c| c as usize);
        let depth = n(1)?;
        let oldest = match &p[14] {
            Value::BulkString(b) if b.is_empty() => None,
            other => Some(number(other)?),
        };
        Ok(Summary {
            depth,
            delayed: n(2)?,
            in_flight: n(3)?,
            in_flight_dirty: n(4)?.saturating_sub(depth),
            failing: n(5)?,
            stalled: n(6)?,
            dead: n(7)?,
            shut_down: number(&p[8])? == 1,
            paused: number(&p[9])? == 1,
            dead_dropped: count(&p[10])?,
            counters: Counters {
                adds: count(&p[11])?,
                completions: count(&p[12])?,
                failures: count(&p[13])?,
            },
            longest_lease: oldest.map_or(Duration::ZERO, |t| span(t, now)),
            lease_age_sum: Duration::from_micros(count(&p[15])?),
            failures: count(&p[17])?,
            exists: p.get(18).map(count).transpose()?.unwrap_or(1) > 0,
        })
    }
}

/// A primary of a cluster, or the single server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    /// The one server of a single-server deployment.
    Single,
    /// A cluster primary by address.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Addr(String, u16),
}

/// Every queue under a key prefix, over one connection that reconnects by itself: listings
/// scan every primary and read every queue's figures in one pipeline per primary, and the
/// queue handles it makes ([`Admin::queue`]) share the connection, so a dashboard or a tool
/// over a thousand queues holds one connection, not a thousand.
///
/// ```no_run
/// use workq_redis::{Admin, RedisQueue};
///
/// # async fn run() -> Result<(), workq_redis::Error> {
/// let admin = Admin::connect(redis::Client::open("redis://127.0.0.1:6379")?, "wq").await?;
/// for (name, summary) in admin.overview().await? {
///     match summary {
///         Ok(s) => println!("{name}: {} ready, {} dead", s.depth, s.dead),
///         Err(e) => println!("{name}: cannot be read: {e}"),
///     }
/// }
/// let pods: RedisQueue<String> = admin.queue("pods").build().await?;
/// pods.pause().await?;
/// # Ok(())
/// # }
/// ```
pub struct Admin {
    prefix: String,
    con: Conn,
    source: Source,
    persistence: Option<Persistence>,
    retry_deadline: Duration,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The command connection's configuration: answers within `timeout`, and a reconnect that
/// gives up quickly while the server is down (the next call tries again).
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200))
}

impl Admin {
    /// Connects to the server of `client` for the queues under `prefix`: one connection,
    /// which reconnects by itself after the server restarts. Reads the server's persistence
    /// settings once ([`persistence`](Self::persistence)).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad prefix, [`Error::UnsupportedServer`] for a server older than
    /// [`MIN_REDIS_VERSION`](crate::MIN_REDIS_VERSION), [`Error::Redis`] if the server cannot
    /// be reached.
    pub async fn connect(client: Client, prefix: &str) -> Result<Self, Error> {
        validate("key prefix", prefix)?;
        let mut con = Conn::Manager(
            client
                .get_connection_manager_with_config(manager_config(Duration::from_secs(5)))
                .await?,
        );
        check_version(&mut con).await?;
        let persistence = Persistence::read(&mut con).await;
        persistence::warn_once(
            &client.get_connection_info().addr().to_string(),
            &persistence,
        );
        Ok(Admin {
            prefix: prefix.to_owned(),
            con,
            source: Source::Single(client),
            persistence: Some(persistence),
            retry_deadline: Duration::from_secs(1),
        })
    }

    /// Connects to a Redis Cluster by the URLs of some of its nodes (feature `cluster`), for
    /// the queues under `prefix`. Listings scan every primary.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster<S: Into<String>>(
        nodes: impl IntoIterator<Item = S>,
        prefix: &str,
    ) -> Result<Self, Error> {
        validate("key prefix", prefix)?;
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        let timeout = Duration::from_secs(5);
        let client = redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()?;
        let blocking = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout * 2)
            .build()?;
        let mut con = Conn::Cluster(client.get_async_connection().await?);
        check_version(&mut con).await?;
        Ok(Admin {
            prefix: prefix.to_owned(),
            con,
            source: Source::Cluster { blocking },
            persistence: None,
            retry_deadline: Duration::from_secs(1),
        })
    }

    /// How long the handles of [`queue`](Self::queue) wait out a server that is restarting
    /// or unreachable before an operation fails. Default 1 s: an operator's page should say
    /// the server is down rather than hang.
    #[must_use]
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The server's persistence settings as read when connecting (`None` on a cluster).
    pub fn persistence(&self) -> Option<&Persistence> {
        self.persistence.as_ref()
    }

    /// A builder for a handle on queue `name` that shares this connection: its `build` makes
    /// no round trip and opens no connection. Its leases are not renewed by themselves
    /// (`auto_renew(false)`), and its retry deadline is [`retry_deadline`](Self::retry_deadline)'s;
    /// both may be changed on the builder.
    pub fn queue<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        name: &str,
    ) -> Builder<T> {
        RedisQueue::builder(name)
            .prefix(self.prefix.clone())
            .auto_renew(false)
            .check_persistence(false)
            .retry_deadline(self.retry_deadline)
            .shared(Shared {
                con: self.con.clone(),
                source: self.source.clone(),
                persistence: self.persistence.clone(),
            })
    }

    /// Answers whether the server (or every cluster primary known) answers `PING`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn ping(&self) -> Result<(), Error> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.con.clone())
            .await?;
        Ok(())
    }

    /// The [`Summary`] of queue `name` (with [`Summary::exists`] false if it has no key), in
    /// one round trip.
    ///
    /// # Errors
    ///
    /// A connection error, or the server's error for a queue that cannot be read (a key of
    /// the wrong type).
    pub async fn summary(&self, name: &str) -> Result<Summary, Error> {
        validate("queue name", name)?;
        let keys = Keys::new(&self.prefix, name);
        let mut invocation = SUMMARY.prepare_invoke();
        for key in &keys.all {
            invocation.key(key.as_str());
        }
        let value: Value = invocation.invoke_async(&mut self.con.clone()).await?;
        reply::parse("summary", value)
    }

    /// The names of the queues under the prefix, sorted: every name `N` with a key
    /// `prefix:{N}:...` on any primary.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn queue_names(&self) -> Result<Vec<String>, Error> {
        let mut names: Vec<String> = self
            .names_by_node()
            .await?
            .into_values()
            .flatten()
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Every queue under the prefix with its [`Summary`], sorted by name, in a bounded number
    /// of round trips: `SCAN` rounds on each primary, then one pipelined script call per
    /// queue, 200 to a pipeline. A queue that cannot be read (a key of the wrong type under
    /// its name, say) is listed with its error and does not stop the others.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn overview(&self) -> Result<Vec<(String, Result<Summary, Error>)>, Error> {
        let mut all = Vec::new();
        for (node, names) in self.names_by_node().await? {
            for chunk in names.chunks(SUMMARY_CHUNK) {
                let replies = self.summary_pipeline(&node, chunk).await?;
                all.extend(chunk.iter().cloned().zip(replies));
            }
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    /// One pipeline of summary calls on `node`; a `NOSCRIPT` (the server's script cache was
    /// emptied, by a restart say) loads the script and sends the pipeline once more.
    async fn summary_pipeline(
        &self,
        node: &Node,
        names: &[String],
    ) -> Result<Vec<Result<Summary, Error>>, Error> {
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
                .map(|reply| match reply {
                    Value::ServerError(e) => Err(Error::Redis(e.into())),
                    value => reply::parse::<Summary>("summary", value),
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
        match (node, &self.con) {
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
                Ok(pipe.query_async(&mut self.con.clone()).await?)
            }
        }
    }

    /// Runs `cmd` on `node`.
    async fn on_node<R: FromRedisValue>(&self, node: &Node, cmd: &redis::Cmd) -> Result<R, Error> {
        match (node, &self.con) {
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
            _ => Ok(cmd.query_async(&mut self.con.clone()).await?),
        }
    }

    /// The primaries: the single server, or every primary of the cluster.
    async fn nodes(&self) -> Result<Vec<Node>, Error> {
        match &self.con {
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

    /// The queue names found on each primary.
    async fn names_by_node(&self) -> Result<BTreeMap<Node, Vec<String>>, Error> {
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
        let mut out = BTreeMap::new();
        for node in self.nodes().await? {
            let mut names = std::collections::BTreeSet::new();
            let mut cursor: u64 = 0;
            for _ in 0..MAX_SCAN_ROUNDS {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys): (u64, Vec<Vec<u8>>) = self.on_node(&node, &cmd).await?;
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
                    break;
                }
            }
            out.insert(node, names.into_iter().collect());
        }
        Ok(out)
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
            let host = reply::text(primary.first()?).ok()?;
            let port = u16::try_from(number(primary.get(1)?).ok()?).ok()?;
            Some(Node::Addr(host, port))
        })
        .collect()
}
