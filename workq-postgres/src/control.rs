//! The fleet's switches of one queue, for every process at once: shut down and resume
//! ([`PgQueue::shut_down_fleet`]), pause and resume ([`PgQueue::pause`]). Each is a flag on
//! the queue's row; a change wakes every getter in every process.

use serde::Serialize;
use serde::de::DeserializeOwned;

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
