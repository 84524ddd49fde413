//! Waiting for work: one blocking wait on the server per handle (`BZPOPMIN` on the queue's
//! wake-up marker), shared by the handle's getters, and the local wake-ups it sends them.
//!
//! A [`Waiter`] owns all of it: the connections for the blocking wait and the wake-up state.
//! It knows nothing else of the handle: the command connection (which a `READONLY` may
//! replace) is asked for when it is needed, through the closure its callers give.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Value};

use crate::connection::{Conn, Source};
use crate::error::Error;

/// One handle's waiting for work: one blocking wait on the server at a time, shared by all of
/// its getters, so a getter that is cancelled costs no connection and no wake-up; and the
/// local wake-ups of those getters.
pub(crate) struct Waiter {
    /// Where the connections for blocking waits come from.
    source: Source,
    /// Idle connections for blocking waits, which must not stall the command connection.
    blocking: Mutex<Vec<Conn>>,
    /// The queue's wake-up marker key.
    marker: String,
    /// The longest one blocking wait lasts.
    poll: Duration,
    /// How long a call waits for the server's answer (on top of `poll` for a blocking wait).
    response_timeout: Duration,
    /// A generation count; every wake-up bumps it.
    tx: tokio::sync::watch::Sender<u64>,
    /// Getters inside [`RedisQueue::get`](crate::RedisQueue::get): a wake-up popped with none
    /// left is passed on.
    waiting: AtomicUsize,
    /// Whether the waiting task runs.
    running: AtomicBool,
}

impl Waiter {
    /// A waiter for the queue whose wake-up marker is `marker`, opening its connections from
    /// `source`.
    pub(crate) fn new(
        source: Source,
        marker: String,
        poll: Duration,
        response_timeout: Duration,
    ) -> Self {
        Waiter {
            source,
            blocking: Mutex::new(Vec::new()),
            marker,
            poll,
            response_timeout,
            tx: tokio::sync::watch::channel(0).0,
            waiting: AtomicUsize::new(0),
            running: AtomicBool::new(false),
        }
    }

    /// Wakes every local getter (and drain).
    pub(crate) fn wake_all(&self) {
        self.tx.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A receiver of the wake-ups from now on.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Counts a getter in [`Waiter::waiting`] while it lives.
pub(crate) struct Waiting<'a>(&'a Waiter);

impl<'a> Waiting<'a> {
    pub(crate) fn new(waiter: &'a Waiter) -> Self {
        waiter.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(waiter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Set while a getter that was woken has not yet looked at the queue: if it is cancelled
/// then, the wake-up is passed on to another getter (in any process), on the command
/// connection `commands` gives.
pub(crate) struct Owed<'a, F: Fn() -> Conn> {
    waiter: &'a Waiter,
    commands: F,
    owed: bool,
}

impl<'a, F: Fn() -> Conn> Owed<'a, F> {
    /// Nothing owed yet.
    pub(crate) fn new(waiter: &'a Waiter, commands: F) -> Self {
        Owed {
            waiter,
            commands,
            owed: false,
        }
    }

    /// Whether a wake-up is owed: set when one arrives, cleared once the queue was looked at.
    pub(crate) fn set(&mut self, owed: bool) {
        self.owed = owed;
    }
}

impl<F: Fn() -> Conn> Drop for Owed<'_, F> {
    fn drop(&mut self) {
        if self.owed {
            self.waiter.pass_on_wake(&self.commands);
        }
    }
}

impl Waiter {
    /// Puts the wake-up marker back for another getter, in the background, on the command
    /// connection `commands` gives.
    fn pass_on_wake(&self, commands: impl FnOnce() -> Conn) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut con = commands();
        let marker = self.marker.clone();
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
                    .set_response_timeout(Some(self.poll.saturating_add(self.response_timeout)));
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

    /// Marks the waiting task as running: `true` if it was not, and the caller then runs
    /// [`wait_loop`](Self::wait_loop) (on a task of its own).
    pub(crate) fn start(&self) -> bool {
        self.running
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The waiting task: blocks on the wake-up marker (`BZPOPMIN`, on a connection of its own)
    /// while any getter of this handle waits, and wakes them all when it pops it. A wake-up
    /// popped when no getter is left is put back for the getters of other handles, on the
    /// command connection `commands` gives.
    pub(crate) async fn wait_loop(&self, commands: impl Fn() -> Conn) {
        let mut con: Option<Conn> = None;
        let seconds = format!("{:.3}", self.poll.as_secs_f64().max(0.001));
        loop {
            if self.waiting.load(Ordering::SeqCst) == 0 {
                self.running.store(false, Ordering::SeqCst);
                if self.waiting.load(Ordering::SeqCst) == 0
                    || self
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
                        self.wake_all();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let reply: redis::RedisResult<Value> = redis::cmd("BZPOPMIN")
                .arg(self.marker.as_str())
                .arg(seconds.as_str())
                .query_async(&mut c)
                .await;
            match reply {
                Ok(Value::Nil) => con = Some(c),
                Ok(_) => {
                    con = Some(c);
                    if self.waiting.load(Ordering::SeqCst) == 0 {
                        self.pass_on_wake(&commands);
                    } else {
                        self.wake_all();
                    }
                }
                Err(_) => {
                    self.wake_all();
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
