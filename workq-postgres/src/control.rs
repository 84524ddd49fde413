//! The fleet's switches of one queue, for every process at once: shut down and resume
//! ([`PgQueue::shut_down_fleet`]), pause and resume ([`PgQueue::pause`]), each a flag on the
//! queue's row whose change wakes every getter in every process; and flow control's settings
//! as the database keeps them ([`PgQueue::flow_limits`], [`PgQueue::clear_flow_control`]; see
//! `flow.rs`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::flow::FlowLimits;

use crate::error::Error;
use crate::queue::PgQueue;
use crate::wait::channel;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Shuts the queue down for every process: client-go's `ShutDown` of the shared queue.
    /// Adds are ignored, ready items are still handed out, delayed ones wait (in the
    /// database) for [`resume_fleet`](Self::resume_fleet). Returns whether the queue was
    /// running.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn shut_down_fleet(&self) -> Result<bool, Error> {
        self.set_flag("shut_down", true).await
    }

    /// Undoes [`shut_down_fleet`](Self::shut_down_fleet); `Ok(true)` if the queue was shut
    /// down.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn resume_fleet(&self) -> Result<bool, Error> {
        self.set_flag("shut_down", false).await
    }

    /// Whether the queue is shut down for every process ([`shut_down_fleet`](Self::shut_down_fleet)).
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn is_fleet_shut_down(&self) -> Result<bool, Error> {
        self.flag("shut_down").await
    }

    /// Pauses the queue for every process until [`resume`](Self::resume): gets hand out
    /// nothing (they wait, or `try_get` finds nothing), while adds, delays, renewals and
    /// `done`s go on as usual. Items already leased stay with their holders. Returns whether
    /// the queue was running. A paused queue that is also shut down for the fleet ends its
    /// getters.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn pause(&self) -> Result<bool, Error> {
        self.set_flag("paused", true).await
    }

    /// Ends a [`pause`](Self::pause) and wakes the waiting getters. Returns whether the queue
    /// was paused.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn resume(&self) -> Result<bool, Error> {
        self.set_flag("paused", false).await
    }

    /// Whether the queue is paused ([`pause`](Self::pause)).
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn is_paused(&self) -> Result<bool, Error> {
        self.flag("paused").await
    }

    /// The queue's flow control settings as every process applies them (the last handle
    /// built with settings wrote them), or `None` if it has none.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn flow_limits(&self) -> Result<Option<FlowLimits>, Error> {
        let (limits, _) = self
            .inner
            .call("flow_limits", || {
                crate::flow::read(&self.inner.pool, self.inner.id)
            })
            .await?;
        Ok((!limits.is_empty()).then_some(limits))
    }

    /// Takes flow control off the queue, for every process: the settings go, the ready items
    /// are handed out in the queue's order again (priority, then the time each became ready),
    /// and the groups are forgotten once their leases out have ended. Returns whether it had
    /// flow control.
    ///
    /// Handles built with flow settings keep their group function (each item's group stays in
    /// its row, and is its group again if flow control comes back on), and a handle built with
    /// settings afterwards sets them again. One call, which reads the queue's groups once. It
    /// writes the settings as a build with settings does: the worker's grants of docs/postgres.md
    /// allow it, the operator's do not.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn clear_flow_control(&self) -> Result<bool, Error> {
        let had = self
            .inner
            .call("clear_flow_control", || {
                crate::flow::clear(&self.inner.pool, self.inner.id)
            })
            .await?;
        Ok(had)
    }

    /// Sets the queue's flag `column` to `on` and wakes every getter in every process (they
    /// look at the queue again); whether it changed.
    async fn set_flag(&self, column: &'static str, on: bool) -> Result<bool, Error> {
        let sql = format!(
            "WITH old AS (SELECT {column} AS was FROM workqueue_queues WHERE id = $1 FOR UPDATE),
                  set AS (UPDATE workqueue_queues SET {column} = $2 WHERE id = $1)
             SELECT was, pg_notify($3, '{wake}') IS NOT NULL FROM old",
            wake = i32::MAX
        );
        let (was, _): (bool, bool) = self
            .inner
            .call("set a flag", || {
                sqlx::query_as(&sql)
                    .bind(self.inner.id)
                    .bind(on)
                    .bind(channel(self.inner.id))
                    .fetch_one(&self.inner.pool)
            })
            .await?;
        Ok(was != on)
    }

    async fn flag(&self, column: &'static str) -> Result<bool, Error> {
        let sql = format!("SELECT {column} FROM workqueue_queues WHERE id = $1");
        let on: Option<bool> = self
            .inner
            .call("read a flag", || {
                sqlx::query_scalar(&sql)
                    .bind(self.inner.id)
                    .fetch_optional(&self.inner.pool)
            })
            .await?;
        Ok(on == Some(true))
    }
}
