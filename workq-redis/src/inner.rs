//! [`Inner`]: what every handle and lease of one queue share, and the calls that wait out
//! transient server states.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManagerConfig;
use redis::{Script, ScriptInvocation, Value};

use crate::connection::{Conn, Source};
use crate::error::{Error, Transient};
use crate::faults::Faults;
use crate::flow::FlowSide;
use crate::persistence::Persistence;
use crate::rate_limit::RateLimit;
use crate::scripts::{Keys, SCRIPTS};
use crate::units::{deadline, from_now, micros};
use crate::wait::Waiter;

/// What every handle and lease of one queue share.
pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) keys: Keys,
    pub(crate) source: Source,
    /// Commands (multiplexed, reconnecting); replaced after a `READONLY`.
    pub(crate) con: RwLock<Conn>,
    /// The configuration `con` was made with, for a reconnect.
    pub(crate) client_config: ConnectionManagerConfig,
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
    /// The fault tests' deliberate bugs (none without the feature `fault-injection`).
    pub(crate) faults: Faults,
    pub(crate) persistence: Option<Persistence>,
    /// This handle (and its clones) is shut down: no more gets or adds here.
    pub(crate) shut: AtomicBool,
    /// The queue's name is in the index of queue names (or registering was tried): done at
    /// build, or for a handle a `RedisAdmin` made, at its first add.
    pub(crate) registered: AtomicBool,
    /// Leases handed out by this handle that are not finished yet.
    pub(crate) leases_out: AtomicUsize,
    /// The blocking wait this handle's getters share, and their wake-ups.
    pub(crate) wake: Waiter,
    /// What this handle knows of the queue's flow control settings.
    pub(crate) flow: FlowSide,
}

impl Inner {
    /// The command connection.
    pub(crate) fn con(&self) -> Conn {
        self.con.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the command connection (after `READONLY`: the server became a replica, and a
    /// new connection may reach the new primary).
    pub(crate) async fn reconnect(&self) {
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
                tracing::warn!(queue = %self.name, %error, "workq-redis: reconnect failed");
            }
        }
    }

    /// Runs `op` on the command connection, waiting out transient server states (see
    /// [`Builder::retry_deadline`](crate::Builder::retry_deadline)) until `deadline`.
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
                tracing::warn!(queue = %self.name, op = what, %error, "workq-redis: retrying");
                warned = true;
            }
            if transient == Transient::ReadOnly {
                self.reconnect().await;
            }
            // The last attempt is made at the deadline.
            tokio::time::sleep(backoff.min(deadline.saturating_duration_since(now))).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// [`call_until`](Self::call_until) the queue's retry deadline from now.
    pub(crate) async fn call<R, F, Fut>(&self, what: &'static str, op: F) -> Result<R, Error>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<R>>,
    {
        self.call_until(what, from_now(self.retry_deadline), op)
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
        let token = self.token_for(raw, token).await;
        let renewed: i64 = self
            .call_until("renew", deadline, |mut con| async move {
                self.invocation(&SCRIPTS.renew)
                    .arg(raw)
                    .arg(token)
                    .arg(micros(self.lease))
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(renewed == 1)
    }

    /// `done` (or `release`), retried through transient states while the lease could still
    /// be ours.
    pub(crate) async fn finish(&self, raw: &str, token: u64, release: bool) -> Result<(), Error> {
        let give_up = self.settle_deadline();
        let script = if release {
            &SCRIPTS.release
        } else {
            &SCRIPTS.done
        };
        let token = self.token_for(raw, token).await;
        if !release {
            self.before_done(raw, token).await;
        }
        // Whether an attempt may have been applied without our seeing the answer.
        let mut unsure = false;
        let mut backoff = Duration::from_millis(20);
        loop {
            let outcome: Result<i64, redis::RedisError> = self
                .invocation(script)
                .arg(raw)
                .arg(token)
                .invoke_async(&mut self.con())
                .await;
            match outcome {
                Ok(1 | 2) => return Ok(()),
                Ok(_) if unsure => return Err(Error::OutcomeUnknown),
                Ok(_) => return Err(Error::LeaseLost),
                Err(e) => {
                    let e = Error::from(e);
                    let transient = Transient::of(&e);
                    if transient.is_none() || from_now(backoff) >= give_up {
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

    /// The token a holder of `raw` with `token` sends (see [`Faults::token_for`]).
    pub(crate) async fn token_for(&self, raw: &str, token: u64) -> u64 {
        self.faults
            .token_for(|| self.con(), &self.keys, raw, token)
            .await
    }

    /// What comes before a `done` with `token` (see [`Faults::before_done`]).
    pub(crate) async fn before_done(&self, raw: &str, token: u64) {
        self.faults
            .before_done(|| self.con(), &self.keys, raw, token)
            .await;
    }

    /// Starts the waiting task of this handle's getters unless it runs (see
    /// [`Waiter::wait_loop`]); the task holds the handle while it runs, and takes the command
    /// connection from it.
    pub(crate) fn ensure_waiter(self: &Arc<Self>) {
        if self.wake.start() {
            let inner = self.clone();
            tokio::spawn(async move { inner.wake.wait_loop(|| inner.con()).await });
        }
    }

    /// Until when a call that ends a lease (a `done`, a release, a step's dones, a retry)
    /// keeps retrying through transient states: while the lease may still be valid, and at
    /// least the retry deadline.
    pub(crate) fn settle_deadline(&self) -> Instant {
        deadline(
            Instant::now(),
            self.lease
                .max(self.retry_deadline)
                .saturating_add(self.response_timeout),
        )
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
}
