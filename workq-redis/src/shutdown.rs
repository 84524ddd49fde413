//! Shutting down: one handle ([`shut_down`](RedisQueue::shut_down)) or the queue for every
//! process ([`shut_down_fleet`](RedisQueue::shut_down_fleet)).

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::queue::RedisQueue;
use crate::scripts::SCRIPTS;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
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
        let mut rx = self.inner.wake.subscribe();
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
}
