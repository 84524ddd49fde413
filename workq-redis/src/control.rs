//! The switches of one queue for every process: the pause ([`pause`](RedisQueue::pause):
//! `get` stops handing out items, adds are still taken), the fleet shutdown
//! ([`shut_down_fleet`](RedisQueue::shut_down_fleet): client-go's `ShutDown` applied to the
//! shared queue), and flow control's settings as the server keeps them
//! ([`flow_limits`](RedisQueue::flow_limits),
//! [`clear_flow_control`](RedisQueue::clear_flow_control); see `flow.rs`). A handle's own
//! shutdown is in `queue.rs`.
//!
//! The pause flag is the field `paused` of the queue's `meta` hash (`prefix:{name}:meta`), so
//! it needs no new key and lives in the queue's cluster slot; `get.lua` checks it first.

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::flow::FlowLimits;

use crate::error::Error;
use crate::flow::{self, parse_limits};
use crate::queue::RedisQueue;
use crate::scripts::SCRIPTS;

/// Index of the `meta` hash in the queue's keys (see `scripts.rs`).
const META: usize = 13;
/// Index of the wake-up marker in the queue's keys.
const MARKER: usize = 9;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// Pauses the queue for every process until [`resume`](Self::resume): `get` hands out
    /// nothing (it waits, or `try_get` finds nothing), while adds, delays, renewals and dones
    /// go on as usual. Items already leased stay with their holders. Returns whether the queue
    /// was running. A paused queue that is also shut down for the fleet ends its getters.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn pause(&self) -> Result<bool, Error> {
        let added: i64 = self
            .inner
            .call("pause", |mut con| async move {
                redis::cmd("HSET")
                    .arg(&self.inner.keys.all[META])
                    .arg("paused")
                    .arg(1)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(added == 1)
    }

    /// Ends a [`pause`](Self::pause) and wakes a blocked getter. Returns whether the queue was
    /// paused.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn resume(&self) -> Result<bool, Error> {
        let (removed, _): (i64, i64) = self
            .inner
            .call("resume", |mut con| async move {
                redis::pipe()
                    .atomic()
                    .cmd("HDEL")
                    .arg(&self.inner.keys.all[META])
                    .arg("paused")
                    .cmd("ZADD")
                    .arg(&self.inner.keys.all[MARKER])
                    .arg(0)
                    .arg("m")
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(removed == 1)
    }

    /// Whether the queue is paused ([`pause`](Self::pause)).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn is_paused(&self) -> Result<bool, Error> {
        self.inner
            .call("is_paused", |mut con| async move {
                redis::cmd("HEXISTS")
                    .arg(&self.inner.keys.all[META])
                    .arg("paused")
                    .query_async(&mut con)
                    .await
            })
            .await
    }

    /// Shuts the queue down for every process, until [`resume_fleet`](Self::resume_fleet):
    /// client-go's `ShutDown` applied to the shared queue. Adds from every process are ignored,
    /// delayed items wait (they are kept, and come due after the resume), queued items are
    /// still handed out, and then every `get` returns `None`; blocked getters wake. Use it to
    /// stop a whole fleet (`wq redis shutdown`); a process that only stops itself calls
    /// [`shut_down`](Self::shut_down). Returns whether the queue was running.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn shut_down_fleet(&self) -> Result<bool, Error> {
        let was_running: i64 = self
            .inner
            .call("shut_down_fleet", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.shut_down)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(was_running == 1)
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

    /// The queue's flow control settings as every process applies them (the last handle
    /// built with settings wrote them), or `None` if it has none.
    ///
    /// # Errors
    ///
    /// A connection error, or settings this crate cannot read.
    pub async fn flow_limits(&self) -> Result<Option<FlowLimits>, Error> {
        let keys = &self.inner.keys;
        let json = self
            .inner
            .call("flow_limits", |mut con| async move {
                flow::read(&mut con, keys).await
            })
            .await?;
        json.map(|json| parse_limits(&json)).transpose()
    }

    /// Takes flow control off the queue, for every process: the ready items go back to the
    /// plain ready lists of their priorities in the order they became ready (each group's own
    /// order kept, so an item handed back stays first in its group), and every flow control
    /// key is deleted, so the queue works as one built without flow control from the next
    /// call on. Returns whether it had flow control.
    ///
    /// Handles built with flow settings keep their group function but their adds' groups
    /// are ignored, and a handle built with settings afterwards sets them again. One script
    /// run, which sorts and moves every ready item: O(items log items), once. An operator's
    /// action: it deletes keys (`DEL`), which docs/redis.md's worker's ACL rules leave out.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn clear_flow_control(&self) -> Result<bool, Error> {
        let had: i64 = self
            .inner
            .call("clear_flow_control", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.flow_clear)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(had == 1)
    }
}
