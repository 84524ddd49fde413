//! Hand-outs: `get`, `try_get`, and a worker's step from its items to the next ones
//! (`done_and_get`, `done_and_get_many`).
//!
//! A get is one call of `workqueue_get`: expired leases are taken back (at most once per
//! sweep interval per handle), due delayed items join the ready order at their due time, then
//! the first ready rows (highest priority, then the moment they became ready) are claimed with
//! `FOR UPDATE SKIP LOCKED`, so getters never wait for each other.
//!
//! The call runs in a task of its own, so that a caller that stops waiting (a dropped
//! future, a timeout around `get`) loses nothing: leases it would have received are released
//! at once, not left to expire.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use workqueue::TryGet;

use crate::error::Error;
use crate::lease::Lease;
use crate::queue::{Claim, PgQueue, int, key_of, micros};

/// The rows `workqueue_get` returns (after `done` outcomes for `workqueue_done_get`): kind,
/// items, keys, tokens, priorities, and the wait until the next due item.
type GetRow = (
    i32,
    Option<Vec<String>>,
    Option<Vec<Vec<u8>>>,
    Option<Vec<i64>>,
    Option<Vec<i32>>,
    Option<i64>,
);

/// The row `workqueue_done_get` returns: the `done` outcomes, then [`GetRow`].
type DoneGetRow = (
    Vec<i32>,
    i32,
    Option<Vec<String>>,
    Option<Vec<Vec<u8>>>,
    Option<Vec<i64>>,
    Option<Vec<i32>>,
    Option<i64>,
);

/// What one look at the queue found.
pub(crate) enum Attempt<T> {
    /// Items handed out, in the queue's order.
    Leased(Vec<Lease<T>>),
    /// The queue, or this handle, is shut down and nothing is ready.
    ShutDown,
    /// Nothing ready (or the queue is paused); the time until the next delayed item is due,
    /// if any and if nobody holds a ready row.
    Empty(Option<Duration>),
}

/// The outcome of [`PgQueue::done_and_get_many`].
#[derive(Debug)]
#[non_exhaustive]
pub struct DoneAndGetMany<T> {
    /// The outcome of each lease's `done`, in the order the leases were given (see
    /// [`Lease::done`]).
    pub done: Vec<Result<(), Error>>,
    /// The leases handed out, in the queue's order: none when nothing was ready, when every
    /// `done` was refused, or when the handle is shut down.
    pub next: Vec<Lease<T>>,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Waits for the next item and hands it out under a [`Lease`]: client-go's `Get`.
    /// `Ok(None)` once this handle is shut down, or the queue is and has nothing ready.
    ///
    /// Getters wake on the queue's `NOTIFY`s (as many as items became ready), and look again
    /// when a delayed item is due and at least every [`poll_interval`](crate::Builder::poll_interval);
    /// a getter waiting on an empty queue costs one query per poll interval. Cancel safe: a
    /// dropped future loses no item.
    ///
    /// # Errors
    ///
    /// A database error that outlasted the retry deadline.
    pub async fn get(&self) -> Result<Option<Lease<T>>, Error> {
        loop {
            // Enabled before the look, so that a wake-up during it is kept.
            let notified = self.inner.wake.items();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.attempt_detached(1).await? {
                Attempt::Leased(mut leases) => {
                    if let Some(lease) = leases.pop() {
                        return Ok(Some(lease));
                    }
                }
                Attempt::ShutDown => return Ok(None),
                Attempt::Empty(wait) => {
                    let wait = wait
                        .map_or(self.inner.poll, |w| w.min(self.inner.poll))
                        .min(self.inner.until_sweep())
                        .max(Duration::from_millis(1));
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One look at the queue without waiting: client-go has no such call, the in-memory
    /// queue's `try_get` does. [`TryGet::Leased`], [`TryGet::Empty`] or
    /// [`TryGet::ShutDown`]; [`TryGet::into_result`] gives the in-memory queue's shape.
    ///
    /// # Errors
    ///
    /// As for [`get`](Self::get).
    pub async fn try_get(&self) -> Result<TryGet<Lease<T>>, Error> {
        Ok(match self.attempt_detached(1).await? {
            Attempt::Leased(mut leases) => leases.pop().map_or(TryGet::Empty, TryGet::Leased),
            Attempt::ShutDown => TryGet::ShutDown,
            Attempt::Empty(_) => TryGet::Empty,
        })
    }

    /// Hands out up to `max` ready items without waiting, in the queue's order, in one
    /// statement: for a worker that takes a batch at a time. Empty when nothing is ready, the
    /// queue is paused, or this handle (or the queue) is shut down and nothing is ready.
    ///
    /// # Errors
    ///
    /// As for [`get`](Self::get).
    pub async fn try_get_many(&self, max: usize) -> Result<Vec<Lease<T>>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        Ok(match self.attempt_detached(max).await? {
            Attempt::Leased(leases) => leases,
            Attempt::ShutDown | Attempt::Empty(_) => Vec::new(),
        })
    }

    /// [`attempt`](Self::attempt) in a task of its own: if the caller stops waiting, the
    /// leases it would have received are dropped, and so released, at once.
    async fn attempt_detached(&self, max: usize) -> Result<Attempt<T>, Error> {
        let (tx, rx) = oneshot::channel();
        let queue = self.clone();
        tokio::spawn(async move {
            let attempt = queue.attempt(max).await;
            // A caller that has gone drops what it would have received here.
            let _ = tx.send(attempt);
        });
        rx.await
            .map_err(|_| Error::Protocol("the get task stopped".into()))?
    }

    /// Calls `workqueue_get` until it hands out items that deserialize, finds nothing, or the
    /// queue is shut down.
    async fn attempt(&self, max: usize) -> Result<Attempt<T>, Error> {
        let deadline = Instant::now() + self.inner.retry_deadline;
        loop {
            if self.is_closed() {
                return Ok(Attempt::ShutDown);
            }
            let sweep = self.inner.sweep_due();
            let started = Instant::now();
            let (kind, items, keys, tokens, priorities, wait): GetRow = self
                .inner
                .call_until("get", deadline, || {
                    sqlx::query_as(
                        "SELECT kind, items, keys, tokens, priorities, wait_us
                         FROM workqueue_get($1, $2, $3, $4, $5, $6)",
                    )
                    .bind(self.inner.id)
                    .bind(int(max))
                    .bind(micros(self.inner.lease))
                    .bind(sweep)
                    .bind(int(self.inner.max_stalls))
                    .bind(int(self.inner.dead_letter_cap))
                    .fetch_one(&self.inner.pool)
                })
                .await?;
            match kind {
                1 => {
                    let leases = self
                        .leased(items, keys, tokens, priorities, started)
                        .await?;
                    if !leases.is_empty() {
                        return Ok(Attempt::Leased(leases));
                    }
                    // Every item handed out was a dead letter: look again.
                }
                2 => return Ok(Attempt::ShutDown),
                _ => return Ok(Attempt::Empty(wait.map(positive_micros))),
            }
        }
    }

    /// The leases of the items a call handed out; an item whose text does not deserialize
    /// moves to the dead letters instead.
    async fn leased(
        &self,
        items: Option<Vec<String>>,
        keys: Option<Vec<Vec<u8>>>,
        tokens: Option<Vec<i64>>,
        priorities: Option<Vec<i32>>,
        started: Instant,
    ) -> Result<Vec<Lease<T>>, Error> {
        let (items, keys, tokens) = (
            items.unwrap_or_default(),
            keys.unwrap_or_default(),
            tokens.unwrap_or_default(),
        );
        let priorities = priorities.unwrap_or_default();
        if keys.len() != items.len() || tokens.len() != items.len() {
            return Err(Error::Protocol(format!(
                "{} items with {} keys and {} tokens",
                items.len(),
                keys.len(),
                tokens.len()
            )));
        }
        let mut leases = Vec::with_capacity(items.len());
        let mut buried = Vec::new();
        for (i, ((raw, key), token)) in items.into_iter().zip(keys).zip(tokens).enumerate() {
            let claim = Claim {
                key: key_of(&key)?,
                token,
            };
            match serde_json::from_str::<T>(&raw) {
                Ok(value) => leases.push(Lease::new(
                    self.inner.clone(),
                    value,
                    raw,
                    claim,
                    priorities.get(i).copied().unwrap_or(0),
                    started,
                )),
                Err(error) => buried.push((raw, claim, error.to_string())),
            }
        }
        for (raw, claim, reason) in buried {
            tracing::warn!(queue = %self.inner.name, item = %raw, %reason,
                "workqueue-postgres: an item cannot be deserialized; moved to the dead letters");
            self.bury(claim, &reason).await?;
        }
        Ok(leases)
    }

    /// Moves a leased item to the dead letters (if the lease is still `claim`'s).
    async fn bury(&self, claim: Claim, reason: &str) -> Result<(), Error> {
        self.inner
            .call("dead letter", || {
                sqlx::query(
                    "SELECT workqueue_bury($1, $2, $3, $4, 0) FROM workqueue_items
                     WHERE queue = $1 AND key = $2 AND token = $5",
                )
                .bind(self.inner.id)
                .bind(claim.key.as_slice())
                .bind(reason)
                .bind(int(self.inner.dead_letter_cap))
                .bind(claim.token)
                .execute(&self.inner.pool)
            })
            .await?;
        Ok(())
    }

    /// Marks `lease` done and hands out the next ready item, if any, without waiting: a
    /// worker's step from one item to the next in one call of `workqueue_done_get`, so one
    /// round trip and one commit instead of a `done` and a `get`. With `forget`, the item's
    /// failures are forgotten too (client-go's `Forget` after a success), only if the `done`
    /// is accepted: a holder whose lease was lost changes nothing, not even the failure count
    /// the item's new holder may be counting on.
    ///
    /// The `done` follows [`Lease::done`]'s rules: fenced by the lease's token, and an item
    /// re-added while processing is queued again (and may be the one handed out). The next
    /// item is handed out only when the `done` was accepted, and only while this handle is
    /// not shut down (then it is a plain `done`). `Ok(None)`: nothing was ready; call
    /// [`get`](Self::get) to wait for the next item.
    ///
    /// # Errors
    ///
    /// As for [`Lease::done`]. When the connection is lost during the call, the `done` is
    /// retried alone, as [`Lease::done`] retries it; a next lease the lost call may have
    /// taken is never seen, and is handed out again once it expires.
    pub async fn done_and_get(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        let DoneAndGetMany { done, next } = self
            .done_and_get_many_with(vec![(lease, forget)], 1)
            .await?;
        done.into_iter().next().unwrap_or(Ok(()))?;
        Ok(next.into_iter().next())
    }

    /// Marks every lease done and hands out up to `max` ready items, in one statement and one
    /// commit: a batched worker loop, which pays one round trip for many items. With no
    /// leases it is a [`try_get_many`](Self::try_get_many).
    ///
    /// The items handed out are leased from the moment of the call, and their leases are
    /// renewed while held as any lease is. [`DoneAndGetMany::done`] has the outcome of each
    /// lease's `done`; nothing is handed out when every `done` was refused (a stale holder
    /// takes no more work).
    ///
    /// # Errors
    ///
    /// As for [`done_and_get`](Self::done_and_get).
    pub async fn done_and_get_many(
        &self,
        leases: Vec<Lease<T>>,
        max: usize,
    ) -> Result<DoneAndGetMany<T>, Error> {
        self.done_and_get_many_with(leases.into_iter().map(|l| (l, false)).collect(), max)
            .await
    }

    /// [`done_and_get_many`](Self::done_and_get_many), each lease with its `forget`.
    pub(crate) async fn done_and_get_many_with(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> Result<DoneAndGetMany<T>, Error> {
        // The leases count as out (for a drain) until they are dropped at the end.
        let mut leases = leases;
        let claims: Vec<(Claim, bool)> = leases
            .iter_mut()
            .map(|(lease, forget)| (lease.finish_for_call(), *forget))
            .collect();
        if self.is_closed() || self.inner.faults.any() {
            // A plain done of each (the test mutations go through the single-lease path).
            let mut done = Vec::with_capacity(claims.len());
            for &(claim, forget) in &claims {
                done.push(self.inner.finish(claim, false, forget).await);
            }
            let refused = !done.is_empty() && done.iter().all(Result::is_err);
            let next = if self.is_closed() || refused {
                Vec::new()
            } else {
                self.try_get_many(max).await?
            };
            return Ok(DoneAndGetMany { done, next });
        }
        let (tx, rx) = oneshot::channel();
        let queue = self.clone();
        let sent = claims.clone();
        tokio::spawn(async move {
            let reply = queue.done_get_call(&sent, max).await;
            let _ = tx.send(reply);
        });
        let reply = rx
            .await
            .map_err(|_| Error::Protocol("the done task stopped".into()))?;
        drop(leases);
        match reply {
            Ok(settled) => Ok(settled),
            Err(error) if error.is_connection() => {
                // The call may or may not have committed: settle each done on its own.
                let mut done = Vec::with_capacity(claims.len());
                for &(claim, forget) in &claims {
                    done.push(self.inner.finish_from(claim, false, forget, true).await);
                }
                Ok(DoneAndGetMany {
                    done,
                    next: Vec::new(),
                })
            }
            Err(error) => Err(error),
        }
    }

    /// One call of `workqueue_done_get`.
    async fn done_get_call(
        &self,
        claims: &[(Claim, bool)],
        max: usize,
    ) -> Result<DoneAndGetMany<T>, Error> {
        let keys: Vec<&[u8]> = claims.iter().map(|(c, _)| c.key.as_slice()).collect();
        let tokens: Vec<i64> = claims.iter().map(|(c, _)| c.token).collect();
        let forgets: Vec<bool> = claims.iter().map(|&(_, f)| f).collect();
        let sweep = self.inner.sweep_due();
        let started = Instant::now();
        let (done, kind, items, next_keys, next_tokens, priorities, _wait): DoneGetRow =
            sqlx::query_as(
                "SELECT done, kind, items, keys, tokens, priorities, wait_us
                 FROM workqueue_done_get($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(self.inner.id)
            .bind(&keys)
            .bind(&tokens)
            .bind(&forgets)
            .bind(int(max))
            .bind(micros(self.inner.lease))
            .bind(sweep)
            .bind(int(self.inner.max_stalls))
            .bind(int(self.inner.dead_letter_cap))
            .fetch_one(&self.inner.pool)
            .await?;
        let done = done
            .into_iter()
            .map(|d| match d {
                1 | 2 => Ok(()),
                _ => Err(Error::LeaseLost),
            })
            .collect();
        let next = if kind == 1 {
            self.leased(items, next_keys, next_tokens, priorities, started)
                .await?
        } else {
            Vec::new()
        };
        Ok(DoneAndGetMany { done, next })
    }
}

/// A wait in microseconds from the database, at least one.
fn positive_micros(us: i64) -> Duration {
    Duration::from_micros(us.max(1).unsigned_abs())
}
