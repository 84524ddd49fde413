//! [`Builder`]: the options of a [`RedisQueue`], and the connection it opens; the handle's
//! constructors ([`RedisQueue::connect`], [`RedisQueue::builder`]) start here.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::Client;
use redis::aio::ConnectionManagerConfig;
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::flow::FlowControl;

#[cfg(feature = "cluster")]
use crate::connection::host_of;
use crate::connection::{Conn, Source, check_version, validate};
use crate::error::Error;
use crate::faults::Faults;
#[cfg(feature = "fault-injection")]
use crate::faults::Mutation;
use crate::flow::{self, FlowSide};
use crate::inner::Inner;
use crate::persistence::{self, Persistence, SETTINGS_CHECK_INTERVAL, log_change, read_for_queue};
use crate::queue::RedisQueue;
use crate::rate_limit::RateLimit;
use crate::scripts::Keys;
use crate::units::{NO_LIMIT, capped};
use crate::wait::Waiter;

/// The options of a [`RedisQueue`]; start with [`RedisQueue::builder`].
///
/// # Defaults
///
/// Key prefix `wq`, leases of 30 s renewed every 10 s while held for at most an hour, an item
/// moved to the dead letters after 5 expired leases in a row, at most 10,000 dead letters,
/// client-go's [`RateLimit::default_controller`], blocked getters looking again at least every
/// 2 s, transient server states waited out for up to 30 s, and a persistence check at start.
///
/// # Long durations
///
/// A duration setting may be as long as `Duration::MAX`: anything over a hundred years is
/// taken as a hundred years, which is no limit in practice. So `max_hold(Duration::MAX)`
/// renews a held lease for as long as it is held, `retry_deadline(Duration::MAX)` waits out
/// a server outage for as long as it lasts, `poll_interval(Duration::MAX)` makes a blocked
/// getter wait for wake-ups and due times only, `response_timeout(Duration::MAX)` waits for
/// an answer as long as the connection lasts, and `lease_duration(Duration::MAX)` makes a
/// lease that never expires (a worker that dies holding it keeps the item until an operator
/// removes it). Only a [`renew_every`](Self::renew_every) as long as the lease (or longer)
/// is refused, since the lease would expire between renewals.
#[must_use]
pub struct Builder<T> {
    name: String,
    url: Option<String>,
    client: Option<Client>,
    #[cfg(feature = "cluster")]
    cluster: Option<Vec<String>>,
    prefix: String,
    lease: Duration,
    renew_every: Option<Duration>,
    auto_renew: bool,
    rate_limit: RateLimit,
    poll: Duration,
    response_timeout: Duration,
    check_persistence: bool,
    settings_check: Duration,
    max_stalls: u32,
    max_hold: Duration,
    dead_letter_cap: usize,
    retry_deadline: Duration,
    faults: Faults,
    /// Flow control: the group function and the limits (see `flow.rs`).
    flow: FlowControl<T>,
    /// A connection shared with a [`RedisAdmin`](crate::RedisAdmin): no connection of its
    /// own.
    shared: Option<Arc<Shared>>,
    _item: PhantomData<fn() -> T>,
}

/// How long opening a [`Shared`] connection may take before the server counts as down.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a [`Shared`] connection connects.
pub(crate) enum Target {
    /// A single server (boxed: a client is ten times the size of the other variant).
    Single(Box<Client>),
    /// A Redis Cluster, by the URLs of some of its nodes.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

/// A connection opened on first use and shared: a [`RedisAdmin`](crate::RedisAdmin)'s, and
/// the queue handles it makes take it instead of connecting.
pub(crate) struct Shared {
    target: Target,
    opened: tokio::sync::OnceCell<Opened>,
}

/// A [`Shared`] connection once open.
pub(crate) struct Opened {
    /// Commands (multiplexed, reconnecting by itself).
    pub(crate) con: Conn,
    /// Where more connections come from (the handles' blocking waits).
    pub(crate) source: Source,
    /// The server's persistence settings, read when it opened (`None` on a cluster).
    pub(crate) persistence: Option<Persistence>,
}

impl Shared {
    /// A connection to `target`, not open yet.
    pub(crate) fn new(target: Target) -> Self {
        Shared {
            target,
            opened: tokio::sync::OnceCell::new(),
        }
    }

    /// The connection, if it is open.
    pub(crate) fn opened(&self) -> Option<&Opened> {
        self.opened.get()
    }

    /// The connection, opened now if it is not yet (once, whoever asks at the same time;
    /// after a failure the next call tries again). Opening checks the server's version, and
    /// reads its persistence settings (warning once when they cannot keep acknowledged
    /// work). Gives up after 5 s.
    pub(crate) async fn open(&self) -> Result<&Opened, Error> {
        self.opened
            .get_or_try_init(|| async {
                match tokio::time::timeout(OPEN_TIMEOUT, self.connect()).await {
                    Ok(opened) => opened,
                    Err(_) => Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "timed out connecting to redis",
                    )))),
                }
            })
            .await
    }

    async fn connect(&self) -> Result<Opened, Error> {
        // Answers within 5 s, and a reconnect that gives up quickly while the server is down
        // (the next call tries again).
        let timeout = OPEN_TIMEOUT;
        match &self.target {
            Target::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                let mut con =
                    Conn::Manager(client.get_connection_manager_with_config(config).await?);
                check_version(&mut con).await?;
                let persistence = Persistence::read(&mut con).await;
                persistence::warn_once(
                    &client.get_connection_info().addr().to_string(),
                    &persistence,
                );
                Ok(Opened {
                    con,
                    source: Source::Single((**client).clone()),
                    persistence: Some(persistence),
                })
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()?;
                let blocking = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout * 2)
                    .build()?;
                let mut con = Conn::Cluster(client.get_async_connection().await?);
                check_version(&mut con).await?;
                Ok(Opened {
                    con,
                    source: Source::Cluster { blocking },
                    persistence: None,
                })
            }
        }
    }
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("auto_renew", &self.auto_renew)
            .field("max_hold", &self.max_hold)
            .field("max_stalls", &self.max_stalls)
            .field("dead_letter_cap", &self.dead_letter_cap)
            .field("retry_deadline", &self.retry_deadline)
            .field("rate_limit", &self.rate_limit)
            .field("flow", &self.flow)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// Connects to `url` and opens queue `name` with the default options.
    ///
    /// # Errors
    ///
    /// See [`Builder::build`].
    pub async fn connect(url: &str, name: &str) -> Result<Self, Error> {
        Self::builder(name).url(url).build().await
    }

    /// Starts building a queue named `name` (see [`Builder`] for the options).
    pub fn builder(name: impl Into<String>) -> Builder<T> {
        Builder::new(name.into())
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Builder<T> {
    /// The defaults (see above), for a queue named `name`.
    pub(crate) fn new(name: String) -> Self {
        Builder {
            name,
            url: None,
            client: None,
            #[cfg(feature = "cluster")]
            cluster: None,
            prefix: "wq".to_owned(),
            lease: Duration::from_secs(30),
            renew_every: None,
            auto_renew: true,
            rate_limit: RateLimit::default_controller(),
            poll: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            check_persistence: true,
            settings_check: SETTINGS_CHECK_INTERVAL,
            max_stalls: 5,
            max_hold: Duration::from_secs(3600),
            dead_letter_cap: 10_000,
            retry_deadline: Duration::from_secs(30),
            faults: Faults::default(),
            flow: FlowControl::new(),
            shared: None,
            _item: PhantomData,
        }
    }

    /// Uses `shared`'s connection instead of opening one: `build` then opens it if it is not
    /// open yet, and makes no round trip otherwise.
    pub(crate) fn shared(mut self, shared: Arc<Shared>) -> Self {
        self.shared = Some(shared);
        self
    }

    /// The server: `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS (feature
    /// `tls`).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The server, as a client you configured yourself.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// A Redis Cluster, by the URLs of some of its nodes (feature `cluster`). Every key of the
    /// queue carries the queue's hash tag, so the whole queue lives on the primary that owns
    /// its slot and every script runs there.
    #[cfg(feature = "cluster")]
    pub fn cluster<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.cluster = Some(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// The prefix of the queue's keys (`prefix:{name}:ready`, ...). Default `wq`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a lease lasts without renewal (server clock). A worker that dies holding an
    /// item frees it after at most this long. Default 30 s.
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a held lease is renewed. Default a third of the lease duration. With
    /// [`auto_renew`](Self::auto_renew) on (the default) it must be shorter than the lease
    /// duration.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Whether leases renew themselves while held (default `true`). Without it, call
    /// [`Lease::renew`](crate::Lease::renew) yourself.
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// Moves an item to the dead letters once its lease expired this many times in a row
    /// (its workers died or stalled each time: a poison item), instead of handing it out
    /// again; the dead letter records the count and the item's failure count, and both are
    /// cleared. A `done` resets the count; a released lease (dropped without `done`) does not
    /// count. Default 5; 0 means no limit.
    pub fn max_stalls(mut self, max_stalls: u32) -> Self {
        self.max_stalls = max_stalls;
        self
    }

    /// The longest a lease is renewed automatically. After it, renewal stops and the lease
    /// expires on the server a lease duration later, so a deadlocked handler or a leaked lease
    /// cannot hold an item forever (the expiry counts as a stall, see
    /// [`max_stalls`](Self::max_stalls)). Default 1 hour.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The most dead letters kept; beyond it the oldest are dropped and counted
    /// ([`QueueSummary::dead_dropped`](workq::admin::QueueSummary::dead_dropped)). Default
    /// 10,000; 0 means no cap.
    pub fn dead_letter_cap(mut self, cap: usize) -> Self {
        self.dead_letter_cap = cap;
        self
    }

    /// How long an operation keeps retrying, with backoff, through transient server states
    /// (a lost connection, a restart replaying its AOF (`LOADING`), `BUSY`, `TRYAGAIN`,
    /// `MASTERDOWN`, `READONLY` after a failover, which also reconnects) before it returns
    /// the error. [`get`](RedisQueue::get) restarts the deadline each time the server
    /// answers. Default 30 s.
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// The rate limiter of `add_rate_limited`. Default [`RateLimit::default_controller`].
    pub fn rate_limit(mut self, rate_limit: RateLimit) -> Self {
        self.rate_limit = rate_limit;
        self
    }

    /// The longest a blocked getter waits before it looks at the queue again even without a
    /// wake-up. Default 2 s.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How long a call waits for the server's answer. Default 5 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Whether to read the server's persistence settings at start and warn (once per server
    /// and process, through `tracing`) when they cannot keep acknowledged work through a
    /// crash, and to read them again while the handle lives (see
    /// [`settings_check_interval`](Self::settings_check_interval)). On a Redis Cluster the
    /// settings read are those of the primary of the queue's slot, the one node that holds
    /// its keys. Default `true`.
    pub fn check_persistence(mut self, check: bool) -> Self {
        self.check_persistence = check;
        self
    }

    /// How often a handle built with [`check_persistence`](Self::check_persistence) reads the
    /// server's persistence settings again, in a task of its own that ends with the handle:
    /// a setting changed on the running server (`CONFIG SET maxmemory-policy allkeys-lru`,
    /// which lets Redis evict the queue's keys) is logged once, as a warning, and its fix
    /// once more, however many calls the handle makes. At least 100 ms. Default
    /// [`SETTINGS_CHECK_INTERVAL`], a minute.
    pub fn settings_check_interval(mut self, interval: Duration) -> Self {
        self.settings_check = interval;
        self
    }

    /// Groups the items by `group` (for example the namespace of a `"namespace/name"` key)
    /// and makes getters take turns between groups, in every process: the in-memory
    /// [`workq::Builder::group_by`], whose rules hold here across the fleet.
    ///
    /// Within the highest priority that has ready work, each hand-out goes to the next group
    /// in turn (round robin; deficit round robin with [`group_weight`](Self::group_weight)),
    /// and inside a group items come out in the order they became ready; priorities stay
    /// strict.
    ///
    /// `group` runs in the adding process at every add (each `add*`, a failed item's retry,
    /// a periodic tick) and the group's name travels with the add; the server keeps an item's
    /// group while it holds the item, so it must give the same group for equal items in every
    /// process. The settings (this and the limits below) are kept on the server beside the
    /// queue, and the last handle built with settings sets them for every process; a handle
    /// built without any follows the queue's (see the crate docs, "Flow control").
    pub fn group_by<G: Into<String>>(
        mut self,
        group: impl Fn(&T) -> G + Send + Sync + 'static,
    ) -> Self {
        self.flow = self.flow.group_by(group);
        self
    }

    /// Gives the group `group` `weight` turns in a row where the others get one
    /// ([`workq::Builder::group_weight`]). Weight 0 counts as 1.
    pub fn group_weight(mut self, group: impl Into<String>, weight: u32) -> Self {
        self.flow = self.flow.group_weight(group, weight);
        self
    }

    /// At most `limit` leases out over the whole queue, whatever process holds them
    /// ([`workq::Builder::max_in_flight`]). A getter held back by it waits for the end of a
    /// lease (a done, a release, an expired lease reclaimed by the next `get` after its
    /// deadline), which wakes it through the queue's wake-up, not a poll.
    ///
    /// # Panics
    ///
    /// If `limit` is 0 (nothing could ever be handed out).
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        self.flow = self.flow.max_in_flight(limit);
        self
    }

    /// At most `limit` leases out per group (each group, unless
    /// [`group_max_in_flight`](Self::group_max_in_flight) names it), over the whole fleet
    /// ([`workq::Builder::max_in_flight_per_group`]). A ready item of a group at its limit
    /// never holds back another group; when one of its leases ends, the group takes its turn
    /// again and a waiting getter wakes. An item re-added while processing still waits for
    /// its own done.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight_per_group(mut self, limit: usize) -> Self {
        self.flow = self.flow.max_in_flight_per_group(limit);
        self
    }

    /// Overrides [`max_in_flight_per_group`](Self::max_in_flight_per_group) for one group.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn group_max_in_flight(mut self, group: impl Into<String>, limit: usize) -> Self {
        self.flow = self.flow.group_max_in_flight(group, limit);
        self
    }

    /// Hands out at most `per_second` items a second over the whole queue and the whole
    /// fleet, with bursts of up to `burst` ([`workq::Builder::hand_out_rate`]): one token
    /// bucket on the server's clock. A getter waiting for a token sleeps until it is due (the
    /// script tells it when). Separate from, and composable with, the
    /// [rate limit](Self::rate_limit) of re-adds.
    ///
    /// # Panics
    ///
    /// If `per_second` is not a positive finite number, or `burst` is 0.
    pub fn hand_out_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.flow = self.flow.hand_out_rate(per_second, burst);
        self
    }

    /// Paces every group as [`hand_out_rate`](Self::hand_out_rate) paces the queue, each
    /// with a bucket of its own on the server (unless
    /// [`group_hand_out_rate`](Self::group_hand_out_rate) names it). A group waiting for its
    /// token leaves the turns to the others.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn hand_out_rate_per_group(mut self, per_second: f64, burst: u32) -> Self {
        self.flow = self.flow.hand_out_rate_per_group(per_second, burst);
        self
    }

    /// Overrides [`hand_out_rate_per_group`](Self::hand_out_rate_per_group) for one group.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn group_hand_out_rate(
        mut self,
        group: impl Into<String>,
        per_second: f64,
        burst: u32,
    ) -> Self {
        self.flow = self.flow.group_hand_out_rate(group, per_second, burst);
        self
    }

    /// Switches on a deliberate bug (see [`Mutation`], feature `fault-injection`); may be
    /// called more than once to combine them. It exists only to prove that the fault tests
    /// can fail.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn mutation(mut self, mutation: Mutation) -> Self {
        self.faults.add(mutation);
        self
    }

    /// The configuration of the command connection.
    fn client_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
    }

    /// Opens the command connection; returns it, the source of more connections, and the
    /// server's name for messages.
    async fn connect(&self) -> Result<(Conn, Source, String), Error> {
        #[cfg(feature = "cluster")]
        if let Some(nodes) = &self.cluster {
            let builder = |timeout: Duration| {
                redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(self.response_timeout)
                    .response_timeout(timeout)
                    .build()
            };
            let client = builder(self.response_timeout)?;
            let blocking = builder(self.poll.saturating_add(self.response_timeout))?;
            let con = client.get_async_connection().await?;
            let server = nodes.first().map(|url| host_of(url)).unwrap_or_default();
            return Ok((Conn::Cluster(con), Source::Cluster { blocking }, server));
        }
        let client = match (&self.client, &self.url) {
            (Some(client), _) => client.clone(),
            (None, Some(url)) => Client::open(url.as_str())?,
            (None, None) => return Err(Error::Config("no server: give a url or a client".into())),
        };
        let con = client
            .get_connection_manager_with_config(self.client_config())
            .await?;
        let server = client.get_connection_info().addr().to_string();
        Ok((Conn::Manager(con), Source::Single(client), server))
    }

    /// Connects and builds the queue, and registers its name in the index of queue names
    /// under the prefix (`SADD prefix:queues NAME`), which operators' listings read
    /// ([`RedisAdmin::queues`](crate::RedisAdmin::queues)); a handle made by a
    /// [`RedisAdmin`](crate::RedisAdmin) registers nothing. A refused registration (an ACL
    /// user without `SADD` on the index) is logged, and the queue works on.
    ///
    /// With flow control settings ([`group_by`](Self::group_by), the limits, the rates), it
    /// writes them beside the queue for every process (one script run; other settings there
    /// are replaced, with a warning); without, it reads the queue's settings once, and warns
    /// when the queue groups its items while this handle cannot (see the crate docs, "Flow
    /// control").
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty name or prefix, or one with braces (the queue's hash
    /// tag), white space or control characters, a lease under 10 ms, or a renewal interval
    /// that is not shorter than the lease (with `auto_renew`);
    /// [`Error::UnsupportedServer`] for a server older than [`MIN_REDIS_VERSION`](crate::MIN_REDIS_VERSION);
    /// [`Error::Redis`] if the server cannot be reached.
    pub async fn build(mut self) -> Result<RedisQueue<T>, Error> {
        validate("queue name", &self.name)?;
        validate("key prefix", &self.prefix)?;
        if self.lease < Duration::from_millis(10) {
            return Err(Error::Config(
                "lease_duration: the lease must last at least 10 ms".into(),
            ));
        }
        // Every duration from here on is at most NO_LIMIT: no arithmetic on it overflows.
        self.lease = capped(self.lease);
        self.max_hold = capped(self.max_hold);
        self.retry_deadline = capped(self.retry_deadline);
        self.poll = capped(self.poll);
        self.response_timeout = capped(self.response_timeout);
        let renew_every = capped(self.renew_every.unwrap_or(self.lease / 3));
        if self.auto_renew && renew_every >= self.lease && self.lease < NO_LIMIT {
            return Err(Error::Config(format!(
                "renew_every ({renew_every:?}) must be shorter than lease_duration ({:?}): \
                 the lease would expire between renewals",
                self.lease
            )));
        }
        let renew_every = renew_every.max(Duration::from_millis(1));
        let from_admin = self.shared.is_some();
        let keys = Keys::new(&self.prefix, &self.name);
        // The server's name, when the handle watches its settings.
        let mut watched = None;
        let (con, source, persistence) = match self.shared.take() {
            Some(shared) => {
                let opened = shared.open().await?;
                (
                    opened.con.clone(),
                    opened.source.clone(),
                    opened.persistence.clone(),
                )
            }
            None => {
                let (mut con, source, server) = self.connect().await?;
                check_version(&mut con).await?;
                let persistence = if self.check_persistence {
                    let persistence = read_for_queue(&con, keys.marker()).await;
                    persistence::warn_once(&server, &persistence);
                    watched = Some(server);
                    Some(persistence)
                } else {
                    None
                };
                (con, source, persistence)
            }
        };
        // A handle an admin made registers nothing: an operator's look at a queue that does
        // not exist must not make it appear.
        let registering = if from_admin { None } else { Some(con.clone()) };
        if let Some(mut con) = registering {
            register(&mut con, &self.prefix, &self.name).await;
        }
        let client_config = self.client_config();
        // Flow control: a handle with settings writes them (the last one built wins); one
        // without reads what the queue has, to warn when it cannot group its adds. A handle
        // an admin made without settings reads nothing (it is made per operator call).
        let flow_side = if self.flow.is_active() {
            let written = flow::write(&mut con.clone(), &keys, self.flow.limits()).await?;
            flow::warn_at_build(&self.name, Some(&written), None);
            FlowSide::new(true, written.generation)
        } else {
            // The read only feeds a warning: a failure to read costs the warning, not the build.
            if !from_admin
                && let Ok(Some(json)) = flow::read(&mut con.clone(), &keys).await
                && let Ok(found) = flow::parse_limits(&json)
            {
                flow::warn_at_build(&self.name, None, Some(&found));
            }
            FlowSide::new(false, 0)
        };
        let poll = self.poll.max(Duration::from_millis(1));
        let wake = Waiter::new(
            source.clone(),
            keys.marker().to_owned(),
            poll,
            self.response_timeout,
        );
        let at_build = persistence.as_ref().map(Persistence::problems);
        let inner = Arc::new(Inner {
            keys,
            name: self.name,
            source,
            con: RwLock::new(con),
            lease: self.lease,
            renew_every,
            auto_renew: self.auto_renew,
            rate_limit: self.rate_limit,
            poll,
            response_timeout: self.response_timeout,
            max_stalls: self.max_stalls,
            max_hold: self.max_hold,
            dead_letter_cap: self.dead_letter_cap,
            retry_deadline: self.retry_deadline,
            faults: self.faults,
            persistence,
            client_config,
            shut: AtomicBool::new(false),
            registered: AtomicBool::new(!from_admin),
            leases_out: AtomicUsize::new(0),
            wake,
            flow: flow_side,
        });
        if let (Some(server), Some(last)) = (watched, at_build) {
            let every = capped(self.settings_check).max(Duration::from_millis(100));
            tokio::spawn(watch(Arc::downgrade(&inner), every, server, last));
        }
        Ok(RedisQueue {
            inner,
            group: self.flow.group_fn().cloned(),
            _item: PhantomData,
        })
    }
}

/// While the queue handle of `inner` lives, reads its server's persistence settings every
/// `every` (`read_for_queue`) and logs a change of their problems once (`last`: the
/// problems read when it was built); a read that gets nothing (the server is away) changes
/// nothing.
async fn watch(
    inner: std::sync::Weak<Inner>,
    every: Duration,
    server: String,
    mut last: Vec<String>,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = read_for_queue(&inner.con(), inner.keys.marker()).await;
        if now == Persistence::default() {
            continue;
        }
        let problems = now.problems();
        log_change(&server, Some(&inner.name), &last, &problems);
        last = problems;
    }
}

/// A build without the feature has no fault switch: this compiles only while `Builder` has
/// no `mutation` method of its own (the probe trait's method would lose to it, and the call
/// below would not type-check) and the crate has no `Mutation` item (the two glob imports
/// would make the name ambiguous).
#[cfg(not(feature = "fault-injection"))]
#[allow(dead_code, reason = "a compile-time check")]
mod no_switch {
    use crate::*;
    use probe::*;

    mod probe {
        /// Stands for the crate's `Mutation`, which must not exist.
        pub(super) struct Mutation;
    }

    /// What the probe's `mutation` returns.
    struct NotInherent;

    trait Probe {
        fn mutation(self, mutation: Mutation) -> NotInherent;
    }

    impl<T> Probe for Builder<T> {
        fn mutation(self, _: Mutation) -> NotInherent {
            NotInherent
        }
    }

    fn probe(builder: Builder<String>) -> NotInherent {
        builder.mutation(Mutation)
    }
}

/// Registers queue `name` in the index of queue names under `prefix` (`SADD`, a command of
/// its own, so it works on a cluster whatever the slots). A failure (an ACL user without
/// `SADD` on the index, a server gone meanwhile) is logged and does not stop the queue: only
/// the operators' listing misses it until a handle is built again.
async fn register(con: &mut Conn, prefix: &str, name: &str) {
    let added: redis::RedisResult<i64> = redis::cmd("SADD")
        .arg(Keys::index(prefix))
        .arg(name)
        .query_async(con)
        .await;
    if let Err(e) = added {
        tracing::warn!(
            queue = name,
            error = %e,
            "workq-redis: the queue could not register in the index of queue names; \
             operators' listings miss it until a handle is built again"
        );
    }
}
