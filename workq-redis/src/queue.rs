//! [`RedisQueue`]: the handle every operation goes through, and what it needs everywhere: its
//! name, its own shutdown ([`shut_down`](RedisQueue::shut_down), which touches no server) and
//! the deletion of the queue.
//!
//! The operations live beside it, one file per kind: the constructors with the options
//! (`builder.rs`), adds and a failed item's retry (`add.rs`), getters (`get.rs`), leases
//! (`lease.rs`), the switches for every process, pause and fleet shutdown (`control.rs`),
//! sizes, stats and counters (`stats.rs`), one item (`inspect.rs`) and dead letters
//! (`dead_letter.rs`). What every handle and lease of a queue share is `Inner` (`inner.rs`);
//! the blocking wait its getters share is in `wait.rs`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::flow::GroupFn;

use crate::error::Error;
use crate::inner::Inner;
use crate::persistence::Persistence;
use crate::scripts::{Keys, SCRIPTS};

/// A work queue on Redis with client-go's rules, shared by every process that opens it.
///
/// Every operation is one server-side script, so the rules hold across processes and
/// machines exactly as they hold across threads for [`workq::WorkQueue`]:
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
/// Unlike the in-memory queue, a [`Lease`](crate::Lease) here expires: it lasts
/// [`lease_duration`](crate::Builder::lease_duration) on the server's clock and is renewed while
/// held. A worker that dies or stalls past its lease loses the item to another worker; its
/// fencing token then makes the server refuse its `done` (see [`Lease`](crate::Lease)).
///
/// `RedisQueue` is a cheap handle: clones share connections.
///
/// # Examples
///
/// ```no_run
/// use workq_redis::RedisQueue;
///
/// # async fn run() -> Result<(), workq_redis::Error> {
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
    /// The group function of flow control, if the handle was built with one: it runs at
    /// every add, and the group's name goes with the add (see `flow.rs`).
    pub(crate) group: Option<GroupFn<T>>,
    pub(crate) _item: PhantomData<fn() -> T>,
}

impl<T> Clone for RedisQueue<T> {
    fn clone(&self) -> Self {
        RedisQueue {
            inner: self.inner.clone(),
            group: self.group.clone(),
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

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The server's persistence settings as read at start (`None` if the check was turned
    /// off); on a cluster, those of the primary of the queue's slot. See
    /// [`Persistence::problems`]. The handle reads them again while it lives and logs a
    /// change ([`Builder::settings_check_interval`](crate::Builder::settings_check_interval)).
    pub fn persistence(&self) -> Option<&Persistence> {
        self.inner.persistence.as_ref()
    }

    /// Whether this handle (or a clone of it) was shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.shut.load(Ordering::SeqCst)
    }

    /// Shuts this handle (and its clones) down: client-go's `ShutDown`, for this process's
    /// share of the queue. Its `get`s return `None` from now on (waiting ones wake), its adds
    /// are ignored, and its leases can still be renewed, finished or released. Other
    /// processes, and other handles built separately, go on: the queue on the server is not
    /// touched (this makes no round trip), so the next deployment picks it up as it is. To
    /// stop every process, see [`shut_down_fleet`](Self::shut_down_fleet).
    pub fn shut_down(&self) {
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
        self.shut_down();
        let mut rx = self.inner.wake.subscribe();
        while self.inner.leases_out.load(Ordering::SeqCst) > 0 {
            // A lease ending wakes this; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
        Ok(())
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

    /// Registers the queue's name in the index of queue names if this handle has not (a
    /// handle a `RedisAdmin` made, at its first add): a queue that holds items is listed
    /// whoever made it. A failure is logged, once; the add goes on.
    pub(crate) async fn register_once(&self) {
        if self.inner.registered.swap(true, Ordering::Relaxed) {
            return;
        }
        let index = Keys::index(self.inner.keys.prefix());
        let index = index.as_str();
        let added: Result<i64, Error> = self
            .inner
            .call("register", |mut con| async move {
                redis::cmd("SADD")
                    .arg(index)
                    .arg(self.inner.name.as_str())
                    .query_async(&mut con)
                    .await
            })
            .await;
        if let Err(e) = added {
            tracing::warn!(
                queue = %self.inner.name,
                error = %e,
                "workq-redis: the queue could not register in the index of queue names; \
                 operators' listings miss it until a handle is built again"
            );
        }
    }

    /// Deletes every key of the queue: its items (at every priority), leases, failure counts,
    /// dead letters, shut-down flag and flow control (settings, groups, rings, buckets), and
    /// takes its name out of the index of queue names
    /// that operators' listings read. Workers holding leases will find them lost; a handle
    /// built afterwards registers the name again.
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
        let index = Keys::index(self.inner.keys.prefix());
        let index = index.as_str();
        let _: i64 = self
            .inner
            .call("delete", |mut con| async move {
                redis::cmd("SREM")
                    .arg(index)
                    .arg(self.inner.name.as_str())
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }
}
