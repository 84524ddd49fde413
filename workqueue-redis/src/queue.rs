//! [`RedisQueue`] and its [`Builder`].

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Script, ScriptInvocation, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workqueue::TryGetError;

use crate::error::Error;
use crate::lease::Lease;
use crate::persistence::{self, Persistence};
use crate::rate_limit::RateLimit;
use crate::scripts::{Keys, SCRIPTS};
use crate::stats::{DeadLetter, Stats};

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

/// Where connections come from.
#[allow(
    clippy::large_enum_variant,
    reason = "one per queue, never moved on a hot path"
)]
enum Source {
    Single(Client),
    #[cfg(feature = "cluster")]
    Cluster {
        /// For blocking waits: a response timeout longer than the longest wait.
        blocking: redis::cluster::ClusterClient,
    },
}

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddKind {
    /// The queue is shut down: the add was ignored.
    Ignored,
    /// The item was queued (it was new, or waiting for a delay and is ready now).
    Queued,
    /// The item was already queued (or already due to be queued again when its lease ends):
    /// nothing changed.
    Duplicate,
    /// The item is being processed: it will be queued again when its lease ends.
    Deferred,
    /// The item waits for its delay (the earliest of its pending delays).
    Delayed,
}

/// The outcome of [`RedisQueue::add`], [`add_after`](RedisQueue::add_after) and
/// [`add_rate_limited`](RedisQueue::add_rate_limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Added {
    /// What the add did.
    pub kind: AddKind,
    /// The add's place in the queue's total order: taken from the counter that also issues
    /// lease tokens, so a lease whose token is larger was handed out after this add. Zero when
    /// the add was ignored.
    pub seq: u64,
    /// The delay the item got (for [`add_rate_limited`](RedisQueue::add_rate_limited), the
    /// rate limiter's answer).
    pub delay: Duration,
}

impl Added {
    fn parse(value: Value, delay: Option<Duration>) -> Result<Self, Error> {
        let parts = array(value)?;
        let kind = match parts.first().map(int) {
            Some(Ok(0)) => AddKind::Ignored,
            Some(Ok(1)) => AddKind::Queued,
            Some(Ok(2)) => AddKind::Duplicate,
            Some(Ok(3)) => AddKind::Deferred,
            Some(Ok(4)) => AddKind::Delayed,
            _ => return Err(Error::Protocol(format!("add: {parts:?}"))),
        };
        let seq = parts.get(1).map(int).transpose()?.unwrap_or(0).max(0) as u64;
        let delay = match (delay, parts.get(2)) {
            (Some(delay), _) => delay,
            (None, Some(us)) => Duration::from_micros(int(us)?.max(0) as u64),
            (None, None) => Duration::ZERO,
        };
        Ok(Added { kind, seq, delay })
    }
}

/// A deliberate bug, switched on by [`Builder::mutation`].
///
/// These exist only to prove that the crate's fault tests can fail: a test turns one on and
/// checks that its history checker reports the loss or overlap the bug causes. Never use them
/// in a deployment.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `done`, renewals and releases accept a holder whatever its fencing token: a stale
    /// holder's `done` is accepted as if it were the current holder's.
    NoFencing,
    /// A `done` of an item that was re-added while it was processed does not queue it again:
    /// the re-add is lost.
    NoDirtyRequeue,
}

impl Mutation {
    /// The flag the scripts test (`NO_FENCING`, `NO_DIRTY_REQUEUE` in `common.lua`).
    fn bit(self) -> u32 {
        match self {
            Mutation::NoFencing => 1,
            Mutation::NoDirtyRequeue => 2,
        }
    }
}

/// The options of a [`RedisQueue`]; start with [`RedisQueue::builder`].
///
/// # Defaults
///
/// Key prefix `wq`, leases of 30 s renewed every 10 s while held, client-go's
/// [`RateLimit::default_controller`], blocked getters looking again at least every 2 s, and a
/// persistence check at start.
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
    max_stalls: u32,
    mutations: u32,
    _item: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("auto_renew", &self.auto_renew)
            .field("rate_limit", &self.rate_limit)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Builder<T> {
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

    /// How often a held lease is renewed. Default a third of the lease duration.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Whether leases renew themselves while held (default `true`). Without it, call
    /// [`Lease::renew`] yourself.
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// Moves an item to the dead letters once its lease expired this many times in a row
    /// (its workers died or stalled each time: a poison item), instead of handing it out
    /// again. A `done` resets the count. Default 0: no limit.
    pub fn max_stalls(mut self, max_stalls: u32) -> Self {
        self.max_stalls = max_stalls;
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
    /// crash. Default `true`.
    pub fn check_persistence(mut self, check: bool) -> Self {
        self.check_persistence = check;
        self
    }

    /// Switches on a deliberate bug (see [`Mutation`]); may be called more than once to
    /// combine them. It exists only to prove that the fault tests can fail.
    #[doc(hidden)]
    pub fn mutation(mut self, mutation: Mutation) -> Self {
        self.mutations |= mutation.bit();
        self
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
            let blocking = builder(self.poll + self.response_timeout)?;
            let con = client.get_async_connection().await?;
            let server = nodes.first().cloned().unwrap_or_default();
            return Ok((Conn::Cluster(con), Source::Cluster { blocking }, server));
        }
        let client = match (&self.client, &self.url) {
            (Some(client), _) => client.clone(),
            (None, Some(url)) => Client::open(url.as_str())?,
            (None, None) => return Err(Error::Config("no server: give a url or a client".into())),
        };
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let con = client.get_connection_manager_with_config(config).await?;
        let server = client.get_connection_info().addr().to_string();
        Ok((Conn::Manager(con), Source::Single(client), server))
    }

    /// Connects and builds the queue.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a name with `{` or `}` (the queue's hash tag) or a zero lease;
    /// [`Error::Redis`] if the server cannot be reached.
    pub async fn build(self) -> Result<RedisQueue<T>, Error> {
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "queue name {:?} must be non-empty and contain no braces",
                self.name
            )));
        }
        if self.lease < Duration::from_millis(10) {
            return Err(Error::Config("the lease must last at least 10 ms".into()));
        }
        let (mut con, source, server) = self.connect().await?;
        let persistence = if self.check_persistence {
            let persistence = Persistence::read(&mut con).await;
            persistence::warn_once(&server, &persistence);
            Some(persistence)
        } else {
            None
        };
        let renew_every = self
            .renew_every
            .unwrap_or(self.lease / 3)
            .max(Duration::from_millis(1));
        Ok(RedisQueue {
            inner: Arc::new(Inner {
                keys: Keys::new(&self.prefix, &self.name),
                name: self.name,
                source,
                con,
                blocking: Mutex::new(Vec::new()),
                lease: self.lease,
                renew_every,
                auto_renew: self.auto_renew,
                rate_limit: self.rate_limit,
                poll: self.poll.max(Duration::from_millis(1)),
                response_timeout: self.response_timeout,
                max_stalls: self.max_stalls,
                mutations: self.mutations,
                persistence,
            }),
            _item: PhantomData,
        })
    }
}

/// What every handle and lease of one queue share.
pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) keys: Keys,
    source: Source,
    /// Commands (multiplexed, reconnecting).
    pub(crate) con: Conn,
    /// Idle connections for blocking waits, which must not stall the shared one.
    blocking: Mutex<Vec<Conn>>,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) auto_renew: bool,
    rate_limit: RateLimit,
    poll: Duration,
    response_timeout: Duration,
    max_stalls: u32,
    /// [`Mutation`] bits, passed to the fenced scripts; 0 outside the fault tests.
    pub(crate) mutations: u32,
    persistence: Option<Persistence>,
}

impl Inner {
    /// An invocation of `script` with the queue's keys.
    pub(crate) fn invocation<'a>(&'a self, script: &'a Script) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in &self.keys.all {
            invocation.key(key.as_str());
        }
        invocation
    }

    /// An `EVALSHA` of `script` with the queue's keys, for pipelines.
    pub(crate) fn evalsha(&self, script: &Script) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(self.keys.all.len());
        for key in &self.keys.all {
            cmd.arg(key.as_str());
        }
        cmd
    }

    /// Runs `calls` (script, arguments) as one pipeline of `EVALSHA`s, in one round trip.
    /// Each call is atomic on its own. A call the server answered with `NOSCRIPT` (its script
    /// cache was emptied, say by a restart) did not run; it is run again on its own, which
    /// loads the script, after the calls that did run.
    pub(crate) async fn pipeline(
        &self,
        calls: &[(&Script, Vec<String>)],
    ) -> Result<Vec<Value>, Error> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (script, args) in calls {
            let mut cmd = self.evalsha(script);
            for arg in args {
                cmd.arg(arg.as_str());
            }
            pipe.add_command(cmd);
        }
        let mut con = self.con.clone();
        let mut replies: Vec<Value> = pipe.query_async(&mut con).await?;
        for (reply, (script, args)) in replies.iter_mut().zip(calls) {
            let Value::ServerError(error) = reply else {
                continue;
            };
            if error.kind() != Some(redis::ServerErrorKind::NoScript) {
                return Err(Error::Redis(error.clone().into()));
            }
            let mut invocation = self.invocation(script);
            for arg in args {
                invocation.arg(arg.as_str());
            }
            *reply = invocation.invoke_async(&mut con).await?;
        }
        Ok(replies)
    }

    /// `renew`: `Ok(false)` if the lease is no longer this holder's.
    pub(crate) async fn renew(&self, raw: &str, token: u64) -> Result<bool, Error> {
        let renewed: i64 = self
            .invocation(&SCRIPTS.renew)
            .arg(raw)
            .arg(token)
            .arg(micros(self.lease))
            .arg(self.mutations)
            .invoke_async(&mut self.con.clone())
            .await?;
        Ok(renewed == 1)
    }

    /// `done`, retried on connection errors while the lease could still be ours.
    pub(crate) async fn done(&self, raw: &str, token: u64) -> Result<(), Error> {
        let give_up = Instant::now() + self.lease + self.response_timeout;
        let mut failed = false;
        loop {
            let outcome: Result<i64, redis::RedisError> = self
                .invocation(&SCRIPTS.done)
                .arg(raw)
                .arg(token)
                .arg(self.mutations)
                .invoke_async(&mut self.con.clone())
                .await;
            match outcome {
                Ok(1) | Ok(2) => return Ok(()),
                Ok(_) if failed => return Err(Error::OutcomeUnknown),
                Ok(_) => return Err(Error::LeaseLost),
                Err(e) => {
                    let e = Error::from(e);
                    if !e.is_connection() || Instant::now() >= give_up {
                        return Err(if failed { Error::OutcomeUnknown } else { e });
                    }
                    failed = true;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Moves an item that cannot be deserialized to the dead-letter list.
    async fn dead_letter(&self, raw: &str, token: u64, error: &str) -> Result<(), Error> {
        let _: i64 = self
            .invocation(&SCRIPTS.dead_letter)
            .arg(raw)
            .arg(token)
            .arg(error)
            .invoke_async(&mut self.con.clone())
            .await?;
        Ok(())
    }

    /// A connection for a blocking wait.
    async fn blocking_connection(&self) -> Result<Conn, Error> {
        if let Some(con) = self
            .blocking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
        {
            return Ok(con);
        }
        match &self.source {
            Source::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.response_timeout))
                    .set_response_timeout(Some(self.poll + self.response_timeout));
                Ok(Conn::Multiplexed(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            #[cfg(feature = "cluster")]
            Source::Cluster { blocking } => {
                Ok(Conn::Cluster(blocking.get_async_connection().await?))
            }
        }
    }

    /// Waits until a getter is woken (an add, a shut down, more work) or `wait` passes.
    async fn wait(&self, wait: Duration) -> Result<(), Error> {
        let mut con = self.blocking_connection().await?;
        let seconds = wait.as_secs_f64().max(0.001);
        let _: Value = redis::cmd("BZPOPMIN")
            .arg(self.keys.marker())
            .arg(format!("{seconds:.3}"))
            .query_async(&mut con)
            .await?;
        // Only a connection that answered goes back to the pool.
        self.blocking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(con);
        Ok(())
    }
}

/// A work queue on Redis with client-go's rules, shared by every process that opens it.
///
/// Every operation is one server-side script, so the rules hold across processes and
/// machines exactly as they hold across threads for [`workqueue::WorkQueue`]:
///
/// - **Fair**: items come out in the order they were added.
/// - **Stingy**: an item added many times before it is handed out is processed once, and never
///   by two live workers at once; re-added while processing, it is handed out again after the
///   holder is done.
/// - **Delayed adds**: the earliest ready time wins.
/// - **Rate-limited retries**, with the failure counts and the token bucket on the server.
/// - **Shutdown**: adds are ignored, queued items are still handed out, then `get` returns
///   `None`.
///
/// Items are serialized with `serde_json`; the serialized form is the item's identity, so
/// equal items must serialize to the same text (true for strings, numbers and structs; not
/// for maps with a random order).
///
/// Unlike the in-memory queue, a [`Lease`] here expires: it lasts
/// [`lease_duration`](Builder::lease_duration) on the server's clock and is renewed while
/// held. A worker that dies or stalls past its lease loses the item to another worker; its
/// fencing token then makes the server refuse its `done` (see [`Lease`]).
///
/// `RedisQueue` is a cheap handle: clones share connections.
///
/// # Examples
///
/// ```no_run
/// use workqueue_redis::RedisQueue;
///
/// # async fn run() -> Result<(), workqueue_redis::Error> {
/// let queue: RedisQueue<String> = RedisQueue::connect("redis://127.0.0.1:6379", "pods").await?;
/// queue.add("default/web-0".to_string()).await?;
/// while let Some(lease) = queue.get().await? {
///     println!("reconciling {}", *lease);
///     lease.done().await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisQueue<T> {
    pub(crate) inner: Arc<Inner>,
    _item: PhantomData<fn() -> T>,
}

impl<T> Clone for RedisQueue<T> {
    fn clone(&self) -> Self {
        RedisQueue {
            inner: self.inner.clone(),
            _item: PhantomData,
        }
    }
}

impl<T> fmt::Debug for RedisQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisQueue")
            .field("name", &self.inner.name)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

/// How late the server may time out a blocked client (one tick of its default `hz 10`).
const SERVER_TICK: Duration = Duration::from_millis(100);

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX / 2)
        .min(u64::MAX / 2)
}

fn array(value: Value) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(values) => Ok(values),
        other => Err(Error::Protocol(format!("expected an array, got {other:?}"))),
    }
}

fn int(value: &Value) -> Result<i64, Error> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map(|f| f as i64)
            .ok_or_else(|| Error::Protocol(format!("expected a number, got {value:?}"))),
        other => Err(Error::Protocol(format!("expected a number, got {other:?}"))),
    }
}

fn string(value: Value) -> Result<String, Error> {
    match value {
        Value::BulkString(bytes) => {
            String::from_utf8(bytes).map_err(|e| Error::Protocol(e.to_string()))
        }
        Value::SimpleString(s) => Ok(s),
        other => Err(Error::Protocol(format!("expected a string, got {other:?}"))),
    }
}

/// One attempt of `get`.
enum Attempt<T> {
    Leased(Lease<T>),
    ShutDown,
    /// Nothing ready; something may be due after this long.
    Empty(Option<Duration>),
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
        Builder {
            name: name.into(),
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
            max_stalls: 0,
            mutations: 0,
            _item: PhantomData,
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The server's persistence settings as read at start (`None` if the check was turned
    /// off). See [`Persistence::problems`].
    pub fn persistence(&self) -> Option<&Persistence> {
        self.inner.persistence.as_ref()
    }

    fn encode(item: &T) -> Result<String, Error> {
        serde_json::to_string(item).map_err(Error::Serialize)
    }

    /// Marks `item` as needing processing: client-go's `Add`.
    ///
    /// A new item joins the tail; an item already queued stays where it is; an item waiting
    /// for a delay becomes ready now (once); an item being processed is queued again when its
    /// lease ends; after [`shut_down`](Self::shut_down) adds are ignored.
    ///
    /// # Errors
    ///
    /// A connection error leaves it unknown whether the add was applied; adding again is
    /// harmless.
    pub async fn add(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        let raw = Self::encode(item.borrow())?;
        let value: Value = self
            .inner
            .invocation(&SCRIPTS.add)
            .arg(raw)
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        Added::parse(value, Some(Duration::ZERO))
    }

    /// Adds `item` once `delay` has passed on the server's clock: client-go's `AddAfter`.
    ///
    /// A zero delay adds at once. For an item already waiting for a delay the earlier ready
    /// time wins; an item already queued stays queued once.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_after(&self, item: impl Borrow<T>, delay: Duration) -> Result<Added, Error> {
        let raw = Self::encode(item.borrow())?;
        let value: Value = self
            .inner
            .invocation(&SCRIPTS.add_after)
            .arg(raw)
            .arg(micros(delay))
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        Added::parse(value, Some(delay))
    }

    /// Adds `item` after the delay the queue's [`RateLimit`] gives it: client-go's
    /// `AddRateLimited`. The item's failure count goes up by one (even after shut down, as in
    /// client-go); [`forget`](Self::forget) resets it.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_rate_limited(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        let raw = Self::encode(item.borrow())?;
        let limit = &self.inner.rate_limit;
        let (qps, burst) = limit.bucket().unwrap_or((0.0, 0));
        let value: Value = self
            .inner
            .invocation(&SCRIPTS.add_rate_limited)
            .arg(raw)
            .arg(micros(limit.base_delay()))
            .arg(micros(limit.max_delay()))
            .arg(qps)
            .arg(burst)
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        Added::parse(value, None)
    }

    /// Resets the failure count of `item`: client-go's `Forget`. Call it when processing
    /// succeeded.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn forget(&self, item: impl Borrow<T>) -> Result<(), Error> {
        let raw = Self::encode(item.borrow())?;
        let _: i64 = redis::cmd("HDEL")
            .arg(self.inner.keys.fail())
            .arg(raw)
            .query_async(&mut self.inner.con.clone())
            .await?;
        Ok(())
    }

    /// How many times `item` was rate limited since it was last forgotten: client-go's
    /// `NumRequeues`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn num_requeues(&self, item: impl Borrow<T>) -> Result<usize, Error> {
        let raw = Self::encode(item.borrow())?;
        let count: Option<u64> = redis::cmd("HGET")
            .arg(self.inner.keys.fail())
            .arg(raw)
            .query_async(&mut self.inner.con.clone())
            .await?;
        Ok(count.unwrap_or(0) as usize)
    }

    async fn sizes(&self) -> Result<(usize, usize, usize), Error> {
        let sizes: (usize, usize, usize) = self
            .inner
            .invocation(&SCRIPTS.len)
            .arg(self.inner.max_stalls)
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        Ok(sizes)
    }

    /// The number of items ready to hand out now (not delayed ones, not the ones being
    /// processed): client-go's `Len`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.0)
    }

    /// Whether no item is ready to hand out now.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The number of items waiting for a delay.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn delayed_len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.1)
    }

    /// The number of items under a lease, in every process.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn processing_len(&self) -> Result<usize, Error> {
        Ok(self.sizes().await?.2)
    }

    /// Reads the answer of the `get` script; `None` if the item was moved to the dead letters.
    async fn interpret(&self, value: Value, started: Instant) -> Result<Option<Attempt<T>>, Error> {
        let mut parts = array(value)?.into_iter();
        let tag = parts.next().as_ref().map(int).transpose()?;
        match tag {
            Some(1) => {
                let raw = string(parts.next().unwrap_or(Value::Nil))?;
                let token = int(&parts.next().unwrap_or(Value::Nil))?.max(0) as u64;
                match serde_json::from_str::<T>(&raw) {
                    Ok(item) => Ok(Some(Attempt::Leased(Lease::new(
                        self.inner.clone(),
                        item,
                        raw,
                        token,
                        started,
                    )))),
                    Err(e) => {
                        let error = e.to_string();
                        tracing::warn!(
                            queue = %self.inner.name,
                            item = %raw,
                            %error,
                            "workqueue-redis: an item cannot be deserialized; moved to the dead-letter list"
                        );
                        self.inner.dead_letter(&raw, token, &error).await?;
                        Ok(None)
                    }
                }
            }
            Some(2) => Ok(Some(Attempt::ShutDown)),
            Some(0) => {
                let wait = parts.next().as_ref().map(int).transpose()?.unwrap_or(-1);
                let wait = (wait >= 0).then(|| Duration::from_micros(wait as u64));
                Ok(Some(Attempt::Empty(wait)))
            }
            _ => Err(Error::Protocol("get: unknown reply".into())),
        }
    }

    async fn attempt(&self) -> Result<Attempt<T>, Error> {
        loop {
            let started = Instant::now();
            let value: Value = self
                .inner
                .invocation(&SCRIPTS.get)
                .arg(micros(self.inner.lease))
                .arg(self.inner.max_stalls)
                .invoke_async(&mut self.inner.con.clone())
                .await?;
            if let Some(attempt) = self.interpret(value, started).await? {
                return Ok(attempt);
            }
        }
    }

    /// Adds every item, as [`add`](Self::add) does one by one, in one round trip (a pipeline of
    /// the `add` script: each add is still atomic on its own, and they apply in order).
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add); on an error, any prefix of the adds may have been applied.
    pub async fn add_all<I>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator,
        I::Item: Borrow<T>,
    {
        self.add_all_after(items.into_iter().map(|item| (item, Duration::ZERO)))
            .await
    }

    /// Adds every item after its delay, as [`add_after`](Self::add_after) does one by one, in
    /// one round trip.
    ///
    /// # Errors
    ///
    /// As for [`add_all`](Self::add_all).
    pub async fn add_all_after<I, B>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, Duration)>,
        B: Borrow<T>,
    {
        let mut calls = Vec::new();
        let mut delays = Vec::new();
        for (item, delay) in items {
            let raw = Self::encode(item.borrow())?;
            calls.push((&SCRIPTS.add_after, vec![raw, micros(delay).to_string()]));
            delays.push(delay);
        }
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let values = self.inner.pipeline(&calls).await?;
        values
            .into_iter()
            .zip(delays)
            .map(|(value, delay)| Added::parse(value, Some(delay)))
            .collect()
    }

    /// Marks `lease`'s item done and hands out the next ready item, in one round trip (a
    /// pipeline of `done` then `get`, each atomic on its own). The first result is the `done`'s
    /// (see [`Lease::done`]); the second is the next lease, or `None` if nothing was ready
    /// (call [`get`](Self::get) to wait) or the queue is shut down.
    ///
    /// # Errors
    ///
    /// A failure to talk to the server (then whether the `done` applied is unknown, and a lease
    /// the `get` may have taken is reclaimed when it expires).
    pub async fn done_and_get(
        &self,
        lease: Lease<T>,
    ) -> Result<(Result<(), Error>, Option<Lease<T>>), Error> {
        let (raw, token) = lease.finish();
        let started = Instant::now();
        let calls = [
            (
                &SCRIPTS.done,
                vec![raw, token.to_string(), self.inner.mutations.to_string()],
            ),
            (
                &SCRIPTS.get,
                vec![
                    micros(self.inner.lease).to_string(),
                    self.inner.max_stalls.to_string(),
                ],
            ),
        ];
        let mut replies = self.inner.pipeline(&calls).await?.into_iter();
        let (done, next) = match (replies.next(), replies.next()) {
            (Some(done), Some(next)) => (int(&done)?, next),
            _ => return Err(Error::Protocol("done_and_get: short reply".into())),
        };
        let done = if done >= 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        };
        let next = match self.interpret(next, started).await? {
            Some(Attempt::Leased(lease)) => Some(lease),
            _ => None,
        };
        Ok((done, next))
    }

    /// Waits for the next item and hands it out under a [`Lease`]: client-go's `Get`.
    ///
    /// Returns `Ok(None)` once the queue is shut down and has nothing ready. Promotes delayed
    /// items that are due and reclaims expired leases of dead workers first. While nothing is
    /// ready it blocks on the server (`BZPOPMIN` on a wake-up marker, on a connection of its
    /// own), so an add in any process wakes one waiting getter.
    ///
    /// Connection errors are retried (with a warning) until the server answers again: a
    /// worker loop rides out a server restart.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses no item: an item leased by a call whose answer never arrived
    /// is reclaimed when that lease expires.
    ///
    /// # Errors
    ///
    /// Errors other than connection errors (for example a server refusing scripts).
    pub async fn get(&self) -> Result<Option<Lease<T>>, Error> {
        let mut backoff = Duration::from_millis(50);
        loop {
            let outcome = match self.attempt().await {
                Ok(Attempt::Leased(lease)) => return Ok(Some(lease)),
                Ok(Attempt::ShutDown) => return Ok(None),
                Ok(Attempt::Empty(wait)) => {
                    let wait = wait.map_or(self.inner.poll, |w| w.min(self.inner.poll));
                    // The server times blocked clients out on its cron tick (10 Hz by
                    // default), so a blocking wait can overshoot by up to ~100 ms. Block for
                    // all but the last tick, and sleep the rest here, on a precise timer.
                    if wait > SERVER_TICK {
                        self.inner.wait(wait - SERVER_TICK).await
                    } else {
                        tokio::time::sleep(wait).await;
                        Ok(())
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => backoff = Duration::from_millis(50),
                Err(e) if e.is_connection() => {
                    tracing::warn!(queue = %self.inner.name, error = %e, "workqueue-redis: get is retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands out the next item if one is ready now, without waiting.
    ///
    /// # Errors
    ///
    /// The outer error is a failure to talk to the server; the inner one is
    /// [`TryGetError::Empty`] or [`TryGetError::ShutDown`].
    pub async fn try_get(&self) -> Result<Result<Lease<T>, TryGetError>, Error> {
        Ok(match self.attempt().await? {
            Attempt::Leased(lease) => Ok(lease),
            Attempt::ShutDown => Err(TryGetError::ShutDown),
            Attempt::Empty(_) => Err(TryGetError::Empty),
        })
    }

    /// Shuts the queue down for every process: client-go's `ShutDown`. Adds are ignored from
    /// now on, delayed items are dropped, queued items are still handed out and then `get`
    /// returns `None`; blocked getters wake. The flag stays until [`delete`](Self::delete).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn shut_down(&self) -> Result<(), Error> {
        let _: i64 = self
            .inner
            .invocation(&SCRIPTS.shut_down)
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        Ok(())
    }

    /// Shuts the queue down, then waits until no item is under a lease in any process:
    /// client-go's `ShutDownWithDrain`. Leases of dead workers end when they expire.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.shut_down().await?;
        while self.processing_len().await? > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Whether the queue is shut down: client-go's `ShuttingDown`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_shutting_down(&self) -> Result<bool, Error> {
        let exists: bool = redis::cmd("EXISTS")
            .arg(self.inner.keys.shut())
            .query_async(&mut self.inner.con.clone())
            .await?;
        Ok(exists)
    }

    /// A snapshot of the queue for operators (see [`Stats`]), listing at most `limit`
    /// in-flight items and failure counts.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn stats(&self, limit: usize) -> Result<Stats, Error> {
        crate::stats::read(&self.inner, limit).await
    }

    /// The dead letters: items that could not be deserialized, oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        crate::stats::dead_letters(&self.inner, limit).await
    }

    /// Deletes every key of the queue: its items, leases, failure counts, dead letters and
    /// shut-down flag. Workers holding leases will find them lost.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn delete(&self) -> Result<(), Error> {
        let mut cmd = redis::cmd("DEL");
        for key in &self.inner.keys.all {
            cmd.arg(key.as_str());
        }
        let _: i64 = cmd.query_async(&mut self.inner.con.clone()).await?;
        Ok(())
    }
}
