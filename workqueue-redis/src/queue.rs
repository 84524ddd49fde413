//! [`RedisQueue`] and its [`Builder`].

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManagerConfig;
use redis::{AsyncConnectionConfig, Script, ScriptInvocation, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workqueue::{AddOptions, TryGetError};

use crate::builder::Builder;
use crate::connection::{Conn, Source};
use crate::error::{Error, Transient};
use crate::lease::Lease;
use crate::persistence::Persistence;
use crate::rate_limit::RateLimit;
use crate::reply::{self, AddReply, DoneReply, GetReply};
use crate::scripts::{Keys, SCRIPTS};
use crate::stats::{DeadLetter, Stats};

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
    /// Reads an add script's reply; `delay` is the caller's, if it chose one.
    fn parse(value: Value, delay: Option<Duration>) -> Result<Self, Error> {
        let reply: AddReply = reply::parse("add", value)?;
        Ok(Added {
            kind: reply.kind,
            seq: reply.seq,
            delay: delay.or(reply.delay).unwrap_or(Duration::ZERO),
        })
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
    pub(crate) fn bit(self) -> u32 {
        match self {
            Mutation::NoFencing => 1,
            Mutation::NoDirtyRequeue => 2,
        }
    }
}

/// Local wake-ups of one handle's getters: one blocking wait on the server at a time, shared
/// by all of them, so a getter that is cancelled costs no connection and no wake-up.
pub(crate) struct Wakeups {
    /// A generation count; every wake-up bumps it.
    tx: tokio::sync::watch::Sender<u64>,
    /// Getters inside [`RedisQueue::get`]: a wake-up popped with none left is passed on.
    waiting: AtomicUsize,
    /// Whether the waiting task runs.
    running: AtomicBool,
}

impl Wakeups {
    pub(crate) fn new() -> Self {
        Wakeups {
            tx: tokio::sync::watch::channel(0).0,
            waiting: AtomicUsize::new(0),
            running: AtomicBool::new(false),
        }
    }

    /// Wakes every local getter (and drain).
    pub(crate) fn wake_all(&self) {
        self.tx.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// Counts a getter in [`Wakeups::waiting`] while it lives.
struct Waiting<'a>(&'a Wakeups);

impl<'a> Waiting<'a> {
    fn new(wake: &'a Wakeups) -> Self {
        wake.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(wake)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Set while a getter that was woken has not yet looked at the queue: if it is cancelled
/// then, the wake-up is passed on to another getter (in any process).
struct Owed<'a> {
    inner: &'a Arc<Inner>,
    owed: bool,
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        if self.owed {
            self.inner.pass_on_wake();
        }
    }
}

/// What every handle and lease of one queue share.
pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) keys: Keys,
    pub(crate) source: Source,
    /// Commands (multiplexed, reconnecting); replaced after a `READONLY`.
    pub(crate) con: RwLock<Conn>,
    /// The configuration `con` was made with, for a reconnect.
    pub(crate) client_config: ConnectionManagerConfig,
    /// Idle connections for blocking waits, which must not stall the shared one.
    pub(crate) blocking: Mutex<Vec<Conn>>,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) rate_limit: RateLimit,
    pub(crate) poll: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) max_stalls: u32,
    pub(crate) max_hold: Duration,
    pub(crate) dead_letter_cap: usize,
    pub(crate) retry_deadline: Duration,
    /// [`Mutation`] bits, passed to the fenced scripts; 0 outside the fault tests.
    pub(crate) mutations: u32,
    pub(crate) persistence: Option<Persistence>,
    /// This handle (and its clones) is shut down: no more gets or adds here.
    pub(crate) shut: AtomicBool,
    /// Leases handed out by this handle that are not finished yet.
    pub(crate) leases_out: AtomicUsize,
    pub(crate) wake: Wakeups,
}

impl Inner {
    /// The command connection.
    pub(crate) fn con(&self) -> Conn {
        self.con.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the command connection (after `READONLY`: the server became a replica, and a
    /// new connection may reach the new primary).
    async fn reconnect(&self) {
        #[allow(
            irrefutable_let_patterns,
            reason = "refutable with the cluster feature"
        )]
        let Source::Single(client) = &self.source else {
            // The cluster client follows failovers by itself.
            return;
        };
        match client
            .get_connection_manager_with_config(self.client_config.clone())
            .await
        {
            Ok(con) => {
                *self.con.write().unwrap_or_else(|e| e.into_inner()) = Conn::Manager(con);
            }
            Err(error) => {
                tracing::warn!(queue = %self.name, %error, "workqueue-redis: reconnect failed");
            }
        }
    }

    /// Runs `op` on the command connection, waiting out transient server states (see
    /// [`Builder::retry_deadline`]) until `deadline`.
    pub(crate) async fn call_until<R, F, Fut>(
        &self,
        what: &'static str,
        deadline: Instant,
        mut op: F,
    ) -> Result<R, Error>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<R>>,
    {
        let mut backoff = Duration::from_millis(20);
        let mut warned = false;
        loop {
            let error = match op(self.con()).await {
                Ok(reply) => return Ok(reply),
                Err(e) => Error::from(e),
            };
            let Some(transient) = Transient::of(&error) else {
                return Err(error);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(error);
            }
            if !warned {
                tracing::warn!(queue = %self.name, op = what, %error, "workqueue-redis: retrying");
                warned = true;
            }
            if transient == Transient::ReadOnly {
                self.reconnect().await;
            }
            // The last attempt is made at the deadline.
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// [`call_until`](Self::call_until) the queue's retry deadline from now.
    pub(crate) async fn call<R, F, Fut>(&self, what: &'static str, op: F) -> Result<R, Error>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<R>>,
    {
        self.call_until(what, Instant::now() + self.retry_deadline, op)
            .await
    }

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
        let mut con = self.con();
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

    /// `renew`: `Ok(false)` if the lease is no longer this holder's. Waits out transient
    /// states until `deadline`.
    pub(crate) async fn renew(
        &self,
        raw: &str,
        token: u64,
        deadline: Instant,
    ) -> Result<bool, Error> {
        let renewed: i64 = self
            .call_until("renew", deadline, |mut con| async move {
                self.invocation(&SCRIPTS.renew)
                    .arg(raw)
                    .arg(token)
                    .arg(micros(self.lease))
                    .arg(self.mutations)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(renewed == 1)
    }

    /// `done` (or `release`), retried through transient states while the lease could still
    /// be ours.
    pub(crate) async fn finish(&self, raw: &str, token: u64, release: bool) -> Result<(), Error> {
        let give_up = Instant::now() + self.lease.max(self.retry_deadline) + self.response_timeout;
        let script = if release {
            &SCRIPTS.release
        } else {
            &SCRIPTS.done
        };
        // Whether an attempt may have been applied without our seeing the answer.
        let mut unsure = false;
        let mut backoff = Duration::from_millis(20);
        loop {
            let outcome: Result<i64, redis::RedisError> = self
                .invocation(script)
                .arg(raw)
                .arg(token)
                .arg(self.mutations)
                .invoke_async(&mut self.con())
                .await;
            match outcome {
                Ok(1) | Ok(2) => return Ok(()),
                Ok(_) if unsure => return Err(Error::OutcomeUnknown),
                Ok(_) => return Err(Error::LeaseLost),
                Err(e) => {
                    let e = Error::from(e);
                    let transient = Transient::of(&e);
                    if transient.is_none() || Instant::now() + backoff >= give_up {
                        return Err(if unsure { Error::OutcomeUnknown } else { e });
                    }
                    if transient == Some(Transient::Connection) {
                        unsure = true;
                    }
                    if transient == Some(Transient::ReadOnly) {
                        self.reconnect().await;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Moves an item that cannot be deserialized to the dead-letter list.
    async fn dead_letter(&self, raw: &[u8], token: u64, error: &str) -> Result<(), Error> {
        let _: i64 = self
            .call("dead letter", |mut con| async move {
                self.invocation(&SCRIPTS.dead_letter)
                    .arg(raw)
                    .arg(token)
                    .arg(error)
                    .arg(self.dead_letter_cap)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }

    /// A lease of this handle was handed out.
    pub(crate) fn lease_started(&self) {
        self.leases_out.fetch_add(1, Ordering::SeqCst);
    }

    /// A lease of this handle was finished (done, released or abandoned).
    pub(crate) fn lease_ended(&self) {
        if self.leases_out.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake.wake_all();
        }
    }

    /// Puts the wake-up marker back for another getter, in the background.
    fn pass_on_wake(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut con = self.con();
        let marker = self.keys.marker().to_owned();
        runtime.spawn(async move {
            let _: redis::RedisResult<Value> = redis::cmd("ZADD")
                .arg(marker)
                .arg(0)
                .arg("m")
                .query_async(&mut con)
                .await;
        });
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

    /// Starts the waiting task unless it runs.
    fn ensure_waiter(self: &Arc<Self>) {
        if self
            .wake
            .running
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let inner = self.clone();
            tokio::spawn(async move { inner.wait_loop().await });
        }
    }

    /// The waiting task: blocks on the wake-up marker (`BZPOPMIN`, on a connection of its own)
    /// while any getter of this handle waits, and wakes them all when it pops it. A wake-up
    /// popped when no getter is left is put back for the getters of other handles.
    async fn wait_loop(self: Arc<Self>) {
        let mut con: Option<Conn> = None;
        let seconds = format!("{:.3}", self.poll.as_secs_f64().max(0.001));
        loop {
            if self.wake.waiting.load(Ordering::SeqCst) == 0 {
                self.wake.running.store(false, Ordering::SeqCst);
                if self.wake.waiting.load(Ordering::SeqCst) == 0
                    || self
                        .wake
                        .running
                        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err()
                {
                    break;
                }
            }
            let mut c = match con.take() {
                Some(c) => c,
                None => match self.blocking_connection().await {
                    Ok(c) => c,
                    Err(_) => {
                        // Let the getters meet the error (and back off) themselves.
                        self.wake.wake_all();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let reply: redis::RedisResult<Value> = redis::cmd("BZPOPMIN")
                .arg(self.keys.marker())
                .arg(seconds.as_str())
                .query_async(&mut c)
                .await;
            match reply {
                Ok(Value::Nil) => con = Some(c),
                Ok(_) => {
                    con = Some(c);
                    if self.wake.waiting.load(Ordering::SeqCst) == 0 {
                        self.pass_on_wake();
                    } else {
                        self.wake.wake_all();
                    }
                }
                Err(_) => {
                    self.wake.wake_all();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if let Some(c) = con {
            self.blocking
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c);
        }
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
    pub(crate) _item: PhantomData<fn() -> T>,
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

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX / 2)
        .min(u64::MAX / 2)
}

/// The priority argument of the add scripts: empty when none was given.
fn priority_arg(priority: Option<i32>) -> String {
    priority.map_or_else(String::new, |p| p.to_string())
}

/// One attempt of `get`.
enum Attempt<T> {
    Leased(Lease<T>),
    ShutDown,
    /// Nothing ready; something may be due after this long.
    Empty(Option<Duration>),
}

/// The reply of an add that this handle ignored because it is shut down.
const IGNORED: Added = Added {
    kind: AddKind::Ignored,
    seq: 0,
    delay: Duration::ZERO,
};

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
    /// lease ends; after [`shut_down`](Self::shut_down) (of this handle) or
    /// [`shut_down_fleet`](Self::shut_down_fleet) adds are ignored.
    ///
    /// # Errors
    ///
    /// A connection error (after the [retry deadline](Builder::retry_deadline)) leaves it
    /// unknown whether the add was applied; adding again is harmless. A full server
    /// (`maxmemory` under `noeviction`) refuses adds at once with an `OOM` error.
    pub async fn add(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_now(item.borrow(), None).await
    }

    /// Adds `item` as `options` ask: at once, after a delay, rate limited (with a delay too,
    /// the shorter one wins), and with a priority: the in-memory queue's
    /// [`add_with`](workqueue::WorkQueue::add_with), with its rules across processes.
    ///
    /// Higher priorities are handed out first, in add order within a priority. A re-add can
    /// raise a queued or delayed item's priority (a raised item goes behind the items already
    /// waiting at its new priority), never lower it; without a priority a new item gets 0 and a
    /// known one keeps its own. An item re-added while processing is queued when its lease
    /// ends with the highest priority its re-adds gave since it was handed out (0 if none
    /// gave one); a released or reclaimed item goes back to the head of the higher of that
    /// and the priority it was handed out with. [`Lease::priority`] tells a worker the
    /// priority of what it holds.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_with(
        &self,
        item: impl Borrow<T>,
        options: AddOptions,
    ) -> Result<Added, Error> {
        let item = item.borrow();
        let priority = options.requested_priority();
        if options.is_rate_limited() {
            self.add_limited(item, options.delay(), priority).await
        } else if options.delay().is_zero() {
            self.add_now(item, priority).await
        } else {
            self.add_delayed(item, options.delay(), priority).await
        }
    }

    /// The `add` script, with a priority or none.
    async fn add_now(&self, item: &T, priority: Option<i32>) -> Result<Added, Error> {
        if self.is_closed() {
            return Ok(IGNORED);
        }
        let raw = Self::encode(item.borrow())?;
        let raw = &raw;
        let value: Value = self
            .inner
            .call("add", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.add)
                    .arg(raw)
                    .arg(priority_arg(priority))
                    .invoke_async(&mut con)
                    .await
            })
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
        self.add_delayed(item.borrow(), delay, None).await
    }

    /// The `add_after` script, with a priority or none.
    async fn add_delayed(
        &self,
        item: &T,
        delay: Duration,
        priority: Option<i32>,
    ) -> Result<Added, Error> {
        if self.is_closed() {
            return Ok(IGNORED);
        }
        let raw = Self::encode(item.borrow())?;
        let raw = &raw;
        let value: Value = self
            .inner
            .call("add_after", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.add_after)
                    .arg(raw)
                    .arg(micros(delay))
                    .arg(priority_arg(priority))
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Added::parse(value, Some(delay))
    }

    /// Adds `item` after the delay the queue's [`RateLimit`] gives it: client-go's
    /// `AddRateLimited`. The item's failure count goes up by one (even after a fleet-wide shut
    /// down, as in client-go); [`forget`](Self::forget) resets it.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add); a retry after a connection error may count a failure twice.
    pub async fn add_rate_limited(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_limited(item.borrow(), Duration::ZERO, None).await
    }

    /// The `add_rate_limited` script: the limiter's delay, or `after` if that is shorter (zero:
    /// no delay of the caller's), with a priority or none.
    async fn add_limited(
        &self,
        item: &T,
        after: Duration,
        priority: Option<i32>,
    ) -> Result<Added, Error> {
        if self.is_closed() {
            return Ok(IGNORED);
        }
        let raw = Self::encode(item.borrow())?;
        let raw = &raw;
        let limit = &self.inner.rate_limit;
        let (qps, burst) = limit.bucket().unwrap_or((0.0, 0));
        let value: Value = self
            .inner
            .call("add_rate_limited", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.add_rate_limited)
                    .arg(raw)
                    .arg(micros(limit.base_delay()))
                    .arg(micros(limit.max_delay()))
                    .arg(qps)
                    .arg(burst)
                    .arg(micros(after))
                    .arg(priority_arg(priority))
                    .invoke_async(&mut con)
                    .await
            })
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
        let raw = &raw;
        let _: i64 = self
            .inner
            .call("forget", |mut con| async move {
                redis::cmd("HDEL")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .query_async(&mut con)
                    .await
            })
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
        let raw = &raw;
        let count: Option<u64> = self
            .inner
            .call("num_requeues", |mut con| async move {
                redis::cmd("HGET")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(count.unwrap_or(0) as usize)
    }

    async fn sizes(&self) -> Result<(usize, usize, usize), Error> {
        self.inner
            .call("len", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.len)
                    .arg(self.inner.max_stalls)
                    .arg(self.inner.dead_letter_cap)
                    .invoke_async(&mut con)
                    .await
            })
            .await
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

    /// Whether this handle (or a clone of it) was shut down.
    fn is_closed(&self) -> bool {
        self.inner.shut.load(Ordering::SeqCst)
    }

    /// Reads the answer of the `get` script; `None` if the item was moved to the dead letters.
    async fn interpret(&self, value: Value, started: Instant) -> Result<Option<Attempt<T>>, Error> {
        match reply::parse("get", value)? {
            GetReply::Leased {
                raw,
                token,
                priority,
            } => {
                let decoded = match String::from_utf8(raw) {
                    Ok(text) => serde_json::from_str::<T>(&text)
                        .map(|item| (item, text.clone()))
                        .map_err(|e| (text.into_bytes(), e.to_string())),
                    Err(e) => {
                        let error =
                            format!("the stored item is not valid UTF-8: {}", e.utf8_error());
                        Err((e.into_bytes(), error))
                    }
                };
                match decoded {
                    Ok((item, text)) => Ok(Some(Attempt::Leased(Lease::new(
                        self.inner.clone(),
                        item,
                        text,
                        token,
                        priority,
                        started,
                    )))),
                    Err((raw, error)) => {
                        tracing::warn!(
                            queue = %self.inner.name,
                            item = %String::from_utf8_lossy(&raw),
                            %error,
                            "workqueue-redis: an item cannot be deserialized; moved to the dead-letter list"
                        );
                        self.inner.dead_letter(&raw, token, &error).await?;
                        Ok(None)
                    }
                }
            }
            GetReply::ShutDown => Ok(Some(Attempt::ShutDown)),
            GetReply::Empty(wait) => Ok(Some(Attempt::Empty(wait))),
        }
    }

    /// One look at the queue (the `get` script), until `deadline` for transient states.
    async fn attempt(&self, deadline: Instant) -> Result<Attempt<T>, Error> {
        loop {
            if self.is_closed() {
                return Ok(Attempt::ShutDown);
            }
            let started = Instant::now();
            let value: Value = self
                .inner
                .call_until("get", deadline, |mut con| async move {
                    self.inner
                        .invocation(&SCRIPTS.get)
                        .arg(micros(self.inner.lease))
                        .arg(self.inner.max_stalls)
                        .arg(self.inner.dead_letter_cap)
                        .invoke_async(&mut con)
                        .await
                })
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
        let mut args = Vec::new();
        let mut delays = Vec::new();
        for (item, delay) in items {
            args.extend([
                Self::encode(item.borrow())?,
                micros(delay).to_string(),
                String::new(),
            ]);
            delays.push(delay);
        }
        // `add_many` runs a chunk of adds per call: one script run instead of one per add,
        // short enough (a few milliseconds) not to hold up the server's other clients.
        let calls: Vec<_> = args
            .chunks(3 * ADD_MANY_CHUNK)
            .map(|chunk| (&SCRIPTS.add_many, chunk.to_vec()))
            .collect();
        if self.is_closed() {
            return Ok(delays.iter().map(|_| IGNORED).collect());
        }
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + self.inner.retry_deadline;
        let mut backoff = Duration::from_millis(20);
        let values = loop {
            match self.inner.pipeline(&calls).await {
                // Only a refusal (nothing ran) is retried: after a connection error some adds
                // may have applied, and the caller decides.
                Err(e)
                    if Transient::of(&e) == Some(Transient::Refused)
                        && Instant::now() + backoff < deadline =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                other => break other?,
            }
        };
        let mut replies = Vec::with_capacity(delays.len());
        for value in values {
            match value {
                Value::Array(chunk) => replies.extend(chunk),
                other => {
                    return Err(Error::Protocol(format!(
                        "add_many: expected an array of replies, got {other:?}"
                    )));
                }
            }
        }
        if replies.len() != delays.len() {
            return Err(Error::Protocol(format!(
                "add_many: {} replies to {} adds",
                replies.len(),
                delays.len()
            )));
        }
        replies
            .into_iter()
            .zip(delays)
            .map(|(value, delay)| Added::parse(value, Some(delay)))
            .collect()
    }

    /// Marks `lease`'s item done and hands out the next ready item, in one round trip (a
    /// pipeline of `done` then `get`, each atomic on its own). The first result is the `done`'s
    /// (see [`Lease::done`]); the second is the next lease, or `None` if nothing was ready
    /// (call [`get`](Self::get) to wait) or the queue (or this handle) is shut down.
    ///
    /// # Errors
    ///
    /// A failure to talk to the server (then whether the `done` applied is unknown, and a lease
    /// the `get` may have taken is reclaimed when it expires).
    pub async fn done_and_get(
        &self,
        lease: Lease<T>,
    ) -> Result<(Result<(), Error>, Option<Lease<T>>), Error> {
        // Counts as out until the done is through, for a drain.
        self.inner.lease_started();
        let _out = LeaseOut(&self.inner);
        let (raw, token) = lease.finish();
        if self.is_closed() {
            return Ok((self.inner.finish(&raw, token, false).await, None));
        }
        let started = Instant::now();
        let call = [(
            &SCRIPTS.done_get,
            vec![
                raw,
                token.to_string(),
                self.inner.mutations.to_string(),
                micros(self.inner.lease).to_string(),
                self.inner.max_stalls.to_string(),
                self.inner.dead_letter_cap.to_string(),
            ],
        )];
        let reply = self.inner.pipeline(&call).await?.pop();
        let [done, next] = match reply {
            Some(Value::Array(parts)) => <[Value; 2]>::try_from(parts).map_err(|parts| {
                Error::Protocol(format!("done_get: expected two replies, got {parts:?}"))
            })?,
            other => {
                return Err(Error::Protocol(format!(
                    "done_get: expected two replies, got {other:?}"
                )));
            }
        };
        let done = reply::parse::<DoneReply>("done", done)?.0;
        let done = if done { Ok(()) } else { Err(Error::LeaseLost) };
        let next = match self.interpret(next, started).await? {
            Some(Attempt::Leased(lease)) => Some(lease),
            _ => None,
        };
        Ok((done, next))
    }

    /// Waits for the next item and hands it out under a [`Lease`]: client-go's `Get`.
    ///
    /// Returns `Ok(None)` once this handle is shut down ([`shut_down`](Self::shut_down)), or
    /// the queue is shut down for every process ([`shut_down_fleet`](Self::shut_down_fleet))
    /// and has nothing ready. Promotes delayed items that are due and reclaims expired leases
    /// of dead workers first. While nothing is ready it waits for a wake-up from the server
    /// (one `BZPOPMIN` on a wake-up marker per handle, shared by its getters, on a
    /// connection of its own), so an add in any process wakes a waiting getter.
    ///
    /// Transient server states (a lost connection, a restart, `LOADING`, `BUSY`, `TRYAGAIN`,
    /// `MASTERDOWN`, `READONLY`) are waited out with backoff for up to the
    /// [retry deadline](Builder::retry_deadline), counted from the server's last answer: a
    /// worker loop rides out a server restart.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses no item and costs nothing: the shared wait goes on for the
    /// other getters (or ends), a wake-up this getter received but did not use is passed on,
    /// and an item leased by a call whose answer never arrived is reclaimed when that lease
    /// expires.
    ///
    /// # Errors
    ///
    /// Errors that are not transient (for example a server refusing scripts), and transient
    /// ones that outlast the retry deadline.
    pub async fn get(&self) -> Result<Option<Lease<T>>, Error> {
        let _waiting = Waiting::new(&self.inner.wake);
        let mut rx = self.inner.wake.tx.subscribe();
        let mut owed = Owed {
            inner: &self.inner,
            owed: false,
        };
        loop {
            rx.borrow_and_update();
            let deadline = Instant::now() + self.inner.retry_deadline;
            let attempt = self.attempt(deadline).await;
            owed.owed = false;
            match attempt? {
                Attempt::Leased(lease) => return Ok(Some(lease)),
                Attempt::ShutDown => return Ok(None),
                Attempt::Empty(wait) => {
                    let wait = wait.map_or(self.inner.poll, |w| w.min(self.inner.poll));
                    self.inner.ensure_waiter();
                    tokio::select! {
                        changed = rx.changed() => {
                            owed.owed = changed.is_ok();
                        }
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Hands out the next item if one is ready now, without waiting.
    ///
    /// # Errors
    ///
    /// The outer error is a failure to talk to the server (after the retry deadline); the
    /// inner one is [`TryGetError::Empty`] or [`TryGetError::ShutDown`].
    pub async fn try_get(&self) -> Result<Result<Lease<T>, TryGetError>, Error> {
        let deadline = Instant::now() + self.inner.retry_deadline;
        Ok(match self.attempt(deadline).await? {
            Attempt::Leased(lease) => Ok(lease),
            Attempt::ShutDown => Err(TryGetError::ShutDown),
            Attempt::Empty(_) => Err(TryGetError::Empty),
        })
    }

    /// Shuts this handle (and its clones) down: client-go's `ShutDown`, for this process's
    /// share of the queue. Its `get`s return `None` from now on (waiting ones wake), its adds
    /// are ignored, and its leases can still be renewed, finished or released. Other
    /// processes, and other handles built separately, go on: the queue on the server is not
    /// touched, so the next deployment picks it up as it is. To stop every process, see
    /// [`shut_down_fleet`](Self::shut_down_fleet).
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps the signature of the other operations.
    pub async fn shut_down(&self) -> Result<(), Error> {
        self.close();
        Ok(())
    }

    /// What [`shut_down`](Self::shut_down) does, synchronously: it touches no server.
    pub(crate) fn close(&self) {
        self.inner.shut.store(true, Ordering::SeqCst);
        self.inner.wake.wake_all();
    }

    /// Shuts this handle down ([`shut_down`](Self::shut_down)), then waits until every lease
    /// it handed out is finished (done, released or dropped): client-go's
    /// `ShutDownWithDrain`, for this process's share.
    ///
    /// # Errors
    ///
    /// None today.
    pub async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.shut_down().await?;
        let mut rx = self.inner.wake.tx.subscribe();
        while self.inner.leases_out.load(Ordering::SeqCst) > 0 {
            // A lease ending wakes this; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
        Ok(())
    }

    /// Shuts the queue down for every process, until [`resume_fleet`](Self::resume_fleet):
    /// client-go's `ShutDown` applied to the shared queue. Adds from every process are ignored,
    /// delayed items wait (they are kept, and come due after the resume), queued items are
    /// still handed out, and then every `get` returns `None`; blocked getters wake. Use it to
    /// stop a whole fleet (`wq redis shutdown`); a process that only stops itself calls
    /// [`shut_down`](Self::shut_down).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn shut_down_fleet(&self) -> Result<(), Error> {
        let _: i64 = self
            .inner
            .call("shut_down_fleet", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.shut_down)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Ends a [`shut_down_fleet`](Self::shut_down_fleet): adds count again and delayed items
    /// come due. Returns whether the queue was shut down. Handles shut down with
    /// [`shut_down`](Self::shut_down) stay shut down.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn resume_fleet(&self) -> Result<bool, Error> {
        let was: i64 = self
            .inner
            .call("resume_fleet", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.resume)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(was == 1)
    }

    /// Whether the queue is shut down for every process ([`shut_down_fleet`](Self::shut_down_fleet)).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_fleet_shut_down(&self) -> Result<bool, Error> {
        self.inner
            .call("is_fleet_shut_down", |mut con| async move {
                redis::cmd("EXISTS")
                    .arg(self.inner.keys.shut())
                    .query_async(&mut con)
                    .await
            })
            .await
    }

    /// Whether this handle is shut down, or the queue for every process: client-go's
    /// `ShuttingDown`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_shutting_down(&self) -> Result<bool, Error> {
        if self.is_closed() {
            return Ok(true);
        }
        self.is_fleet_shut_down().await
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

    /// The dead letters, oldest first, at most `limit`: items that could not be deserialized
    /// (or were not valid UTF-8), and items whose workers kept dying
    /// ([`max_stalls`](Builder::max_stalls)).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        crate::stats::dead_letters(&self.inner, limit).await
    }

    /// Moves one dead letter back to the queue as a fresh item (no failures, no stalls), as an
    /// add would. Returns `false` if it is no longer among the dead letters.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        let entry = letter.entry.as_slice();
        let n: i64 = self
            .inner
            .call("requeue_dead_letter", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_requeue)
                    .arg(entry)
                    .arg(1)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// Moves every dead letter back to the queue, oldest first, as
    /// [`requeue_dead_letter`](Self::requeue_dead_letter) does. Returns how many.
    ///
    /// # Errors
    ///
    /// A connection error; the dead letters moved until then stay moved.
    pub async fn requeue_dead_letters(&self) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            let n: usize = self
                .inner
                .call("requeue_dead_letters", |mut con| async move {
                    self.inner
                        .invocation(&SCRIPTS.dead_requeue)
                        .arg("")
                        .arg(DEAD_BATCH)
                        .invoke_async(&mut con)
                        .await
                })
                .await?;
            total += n;
            if n < DEAD_BATCH {
                return Ok(total);
            }
        }
    }

    /// Deletes every dead letter. Returns how many there were.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn purge_dead_letters(&self) -> Result<usize, Error> {
        self.inner
            .call("purge_dead_letters", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_purge)
                    .invoke_async(&mut con)
                    .await
            })
            .await
    }

    /// Deletes every key of the queue: its items (at every priority), leases, failure counts,
    /// dead letters and shut-down flag. Workers holding leases will find them lost.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn delete(&self) -> Result<(), Error> {
        let _: i64 = self
            .inner
            .call("delete", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.delete)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }
}

/// How many dead letters one call of `requeue_dead_letters` moves (keeps each script short).
const DEAD_BATCH: usize = 500;

/// Adds per run of the `add_many` script: about a millisecond of the server's time.
const ADD_MANY_CHUNK: usize = 200;

/// Ends a lease count taken by `done_and_get` when dropped.
struct LeaseOut<'a>(&'a Inner);

impl Drop for LeaseOut<'_> {
    fn drop(&mut self) {
        self.0.lease_ended();
    }
}
