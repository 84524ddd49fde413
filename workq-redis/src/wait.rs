//! Waiting for work: one blocking wait on the server per handle (`BZPOPMIN` on the queue's
//! wake-up marker), shared by the handle's getters, and the local wake-ups it sends them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Value};

use crate::connection::{Conn, Source};
use crate::error::Error;
use crate::inner::Inner;

/// Local wake-ups of one handle's getters: one blocking wait on the server at a time, shared
/// by all of them, so a getter that is cancelled costs no connection and no wake-up.
pub(crate) struct Wakeups {
    /// A generation count; every wake-up bumps it.
    tx: tokio::sync::watch::Sender<u64>,
    /// Getters inside [`RedisQueue::get`](crate::RedisQueue::get): a wake-up popped with none
    /// left is passed on.
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

    /// A receiver of the wake-ups from now on.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Counts a getter in [`Wakeups::waiting`] while it lives.
pub(crate) struct Waiting<'a>(&'a Wakeups);

impl<'a> Waiting<'a> {
    pub(crate) fn new(wake: &'a Wakeups) -> Self {
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
pub(crate) struct Owed<'a> {
    inner: &'a Arc<Inner>,
    owed: bool,
}

impl<'a> Owed<'a> {
    /// Nothing owed yet.
    pub(crate) fn new(inner: &'a Arc<Inner>) -> Self {
        Owed { inner, owed: false }
    }

    /// Whether a wake-up is owed: set when one arrives, cleared once the queue was looked at.
    pub(crate) fn set(&mut self, owed: bool) {
        self.owed = owed;
    }
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        if self.owed {
            self.inner.pass_on_wake();
        }
    }
}

impl Inner {
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

    /// Starts the waiting task unless it runs.
    pub(crate) fn ensure_waiter(self: &Arc<Self>) {
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
