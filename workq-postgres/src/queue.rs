//! [`PgQueue`]: the queue's handle. Its methods live beside what they do (adds in `add.rs`,
//! hand-outs in `get.rs`, ...); here: its name and pool, the shut down of one handle, and the
//! deletion of the queue's contents.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use workq::flow::GroupFn;

use crate::error::Error;
use crate::inner::Inner;

/// A work queue with client-go's rules, kept in PostgreSQL and shared by any number of
/// processes. Cheap to clone: clones are one handle.
///
/// See the [crate documentation](crate) for the rules, transactional enqueue and crashes.
pub struct PgQueue<T> {
    pub(crate) inner: Arc<Inner>,
    /// The group function, which names each added item's group (flow control); `None`
    /// without one, and on the handles of [`PgAdmin`](crate::PgAdmin).
    pub(crate) group: Option<GroupFn<T>>,
    pub(crate) _item: PhantomData<fn() -> T>,
}

impl<T> Clone for PgQueue<T> {
    fn clone(&self) -> Self {
        PgQueue {
            inner: self.inner.clone(),
            group: self.group.clone(),
            _item: PhantomData,
        }
    }
}

impl<T> fmt::Debug for PgQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgQueue")
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The pool the queue uses: begin the transactions of a transactional enqueue on it.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Shuts this handle (and its clones) down: its adds are ignored and its getters return
    /// `None`. The queue goes on for the other processes; see
    /// [`shut_down_fleet`](Self::shut_down_fleet).
    pub fn shut_down(&self) {
        self.inner.shut.store(true, Ordering::SeqCst);
        self.inner.wake.wake_all();
        self.inner.wake.wake_drains();
    }

    /// Shuts this handle down, then waits until no lease it handed out is held: client-go's
    /// `ShutDownWithDrain`.
    ///
    /// # Errors
    ///
    /// None today; the signature leaves room for a backend's failure.
    pub async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.shut_down();
        loop {
            let drained = self.inner.wake.drained();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.inner.leases_out.load(Ordering::SeqCst) == 0 {
                return Ok(());
            }
            // A lease ending wakes this; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(Duration::from_millis(500), drained).await;
        }
    }

    /// Whether this handle, or the queue for everyone, is shut down: client-go's
    /// `ShuttingDown`.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn is_shutting_down(&self) -> Result<bool, Error> {
        if self.is_closed() {
            return Ok(true);
        }
        self.is_fleet_shut_down().await
    }

    /// Deletes the whole queue's contents from the database: items, leases, failure counts,
    /// dead letters, its shut-down and pause state, its token bucket and its flow control
    /// (settings, groups, their counts of leases and their buckets, the hand-out bucket), in
    /// one transaction. Leases still held are lost (their `done` is refused); this handle and
    /// its clones stay usable on the empty queue, and a handle built with flow settings
    /// afterwards sets them again.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn delete(&self) -> Result<(), Error> {
        self.inner
            .call("delete", || async move {
                let mut tx = self.inner.pool.begin().await?;
                for sql in [
                    "DELETE FROM workqueue_items WHERE queue = $1",
                    "DELETE FROM workqueue_failures WHERE queue = $1",
                    "DELETE FROM workqueue_dead WHERE queue = $1",
                    "UPDATE workqueue_queues SET shut_down = false, paused = false,
                        bucket_tat = NULL, dead_dropped = 0 WHERE id = $1",
                ] {
                    sqlx::query(sql)
                        .bind(self.inner.id)
                        .execute(&mut *tx)
                        .await?;
                }
                // Flow control's tables, for a queue that ever had flow settings (a role
                // granted only the tables of older versions deletes a queue that had none).
                let had_flow: bool = sqlx::query_scalar(
                    "SELECT coalesce((SELECT flow_version > 0 FROM workqueue_queues
                                      WHERE id = $1), false)",
                )
                .bind(self.inner.id)
                .fetch_one(&mut *tx)
                .await?;
                if had_flow {
                    for sql in [
                        "SELECT workqueue_flow_clear($1)",
                        "UPDATE workqueue_flow SET in_flight = 0, tat = 'epoch' WHERE queue = $1",
                        "DELETE FROM workqueue_groups WHERE queue = $1",
                        "DELETE FROM workqueue_arrivals WHERE queue = $1",
                    ] {
                        sqlx::query(sql)
                            .bind(self.inner.id)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                tx.commit().await
            })
            .await?;
        Ok(())
    }

    /// A handle of item type `T` on the queue `inner` serves.
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        PgQueue {
            inner,
            group: None,
            _item: PhantomData,
        }
    }

    /// The item's JSON text, as the queue stores it.
    pub(crate) fn encode(item: &T) -> Result<String, Error> {
        serde_json::to_string(item).map_err(Error::Serialize)
    }

    /// Whether this handle (and its clones) is shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.shut.load(Ordering::SeqCst)
    }
}
