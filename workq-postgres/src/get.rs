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
use workq::{DoneMany, TryGet};

use crate::error::Error;
use crate::inner::pause_after;
use crate::key::{Claim, key_of};
use crate::lease::Lease;
use crate::queue::PgQueue;
use crate::trace::{LeaseLinks, LinkColumns};
use crate::units::{deadline_after, int, micros};

/// The rows `workqueue_get` returns (after `done` outcomes for `workqueue_step`): kind,
/// items, keys, tokens, priorities, the wait until the next due item, and the version of the
/// queue's flow settings (read by the calls that sweep).
type GetRow = (
    i32,
    Option<Vec<String>>,
    Option<Vec<Vec<u8>>>,
    Option<Vec<i64>>,
    Option<Vec<i32>>,
    Option<i64>,
    Option<i64>,
    Option<Vec<Option<String>>>,
    Option<Vec<Option<i32>>>,
);

/// The row `workqueue_step` returns: the `done` outcomes, then [`GetRow`].
type DoneGetRow = (
    Vec<i32>,
    i32,
    Option<Vec<String>>,
    Option<Vec<Vec<u8>>>,
    Option<Vec<i64>>,
    Option<Vec<i32>>,
    Option<i64>,
    Option<i64>,
    Option<Vec<Option<String>>>,
    Option<Vec<Option<i32>>>,
);

/// A get (`workqueue_get`), with the version of the queue's flow settings when it sweeps: a
/// look at a setting another process may have changed, at most once per sweep interval, in
/// the statement the get sends anyway.
fn get_sql(sweep: bool) -> &'static str {
    if sweep {
        "SELECT g.kind, g.items, g.keys, g.tokens, g.priorities, g.wait_us,
                (SELECT s.flow_version FROM workqueue_queues s WHERE s.id = $1),
                g.item_links, g.item_drops
         FROM workqueue_get($1, $2, $3, $4, $5, $6) g"
    } else {
        "SELECT kind, items, keys, tokens, priorities, wait_us, NULL::bigint, item_links,
                item_drops
         FROM workqueue_get($1, $2, $3, $4, $5, $6)"
    }
}

/// A worker's step (`workqueue_step`), with the version of the queue's flow settings when it
/// sweeps (as [`get_sql`]).
fn step_sql(sweep: bool) -> &'static str {
    if sweep {
        "SELECT g.done, g.kind, g.items, g.keys, g.tokens, g.priorities, g.wait_us,
                (SELECT s.flow_version FROM workqueue_queues s WHERE s.id = $1),
                g.item_links, g.item_drops
         FROM workqueue_step($1, $2, $3, $4, $5, $6, $7, $8, $9) g"
    } else {
        "SELECT done, kind, items, keys, tokens, priorities, wait_us, NULL::bigint, item_links,
                item_drops
         FROM workqueue_step($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    }
}

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

/// What [`PgQueue::done_and_get_many`] answers: each lease's `done`, and the leases handed
/// out.
type Stepped<T> = DoneMany<Lease<T>, Error>;

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
        let deadline = deadline_after(self.inner.retry_deadline);
        loop {
            if self.is_closed() {
                return Ok(Attempt::ShutDown);
            }
            let sweep = self.inner.sweep_due();
            let started = Instant::now();
            let (kind, items, keys, tokens, priorities, wait, flow_version, links, drops): GetRow =
                self.inner
                    .call_until("get", deadline, || {
                        sqlx::query_as(get_sql(sweep))
                            .bind(self.inner.id)
                            .bind(int(max))
                            .bind(micros(self.inner.lease))
                            .bind(sweep)
                            .bind(int(self.inner.max_stalls))
                            .bind(int(self.inner.dead_letter_cap))
                            .fetch_one(&self.inner.pool)
                    })
                    .await?;
            self.inner.saw_flow_version(flow_version);
            match kind {
                1 => {
                    let leases = self
                        .leased(items, keys, tokens, priorities, (links, drops), started)
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
        links: LinkColumns,
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
                    LeaseLinks::read(&links, i),
                )),
                Err(error) => buried.push((raw, claim, error.to_string())),
            }
        }
        for (raw, claim, reason) in buried {
            tracing::warn!(queue = %self.inner.name, item = %raw, %reason,
                "workq-postgres: an item cannot be deserialized; moved to the dead letters");
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
    /// worker's step from one item to the next in one call of `workqueue_step`, so one
    /// round trip and one commit instead of a `done` and a `get`. With `forget`, the item's
    /// failures are forgotten too (client-go's `Forget` after a success), only if the `done`
    /// is accepted: a holder whose lease was lost changes nothing, not even the failure count
    /// the item's new holder may be counting on.
    ///
    /// The `done` follows [`Lease::done`]'s rules: fenced by the lease's token, and an item
    /// re-added while processing is queued again (and may be the one handed out). The next
    /// item is handed out only when the `done` was accepted, and only while this handle is
    /// not shut down (then it is a plain `done`). `Ok(None)`: nothing was ready; call
    /// [`get`](Self::get) to wait for the next item. When another transaction holds the
    /// item's row, the step hands out the next item without waiting, and the `done` then
    /// waits for the row, as [`Lease::done`] would (the lease is renewed meanwhile).
    ///
    /// # Errors
    ///
    /// As for [`Lease::done`]. When the connection is lost during the call, the `done` is
    /// retried alone, as [`Lease::done`] retries it; a next lease the lost call may have
    /// taken is never seen, and is handed out again once it expires. A call the server rolled
    /// back (a lock or statement timeout, a serialization failure, a deadlock) is sent again
    /// until the retry deadline.
    pub async fn done_and_get(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        let DoneMany { done, next } = self.step(vec![(lease, forget)], 1, Skipped::Wait).await?;
        done.into_iter().next().unwrap_or(Ok(()))?;
        Ok(next.into_iter().next())
    }

    /// Marks every lease done (after forgetting its item's failures when its flag is `true`,
    /// as [`Lease::done`] after [`forget`](Self::forget) would) and hands out up to `max`
    /// ready items, in one statement and one commit: a batched worker loop, which pays one
    /// round trip for many items. With no leases it is a
    /// [`try_get_many`](Self::try_get_many). [`workq::Queue::done_and_next_many`] is this
    /// call.
    ///
    /// The items handed out are leased from the moment of the call, and their leases are
    /// renewed while held as any lease is. [`DoneMany::done`] has the outcome of each
    /// lease's `done`; nothing is handed out when every `done` was refused (a stale holder
    /// takes no more work).
    ///
    /// The step waits for no row: a lease whose item's row (or failure row, for a forget)
    /// another transaction holds is left out of it, and its `done` is settled on its own in
    /// the background, waiting for that row alone, with the lease renewed until the `done`
    /// is committed. Its outcome is then `Ok(())` while its lease is running (nobody can take
    /// the item from it meanwhile), [`Error::OutcomeUnknown`] if the lease has expired (the
    /// row's holder may be a sweep taking it back). A [drain](Self::shut_down_with_drain)
    /// waits for such a `done`.
    ///
    /// # Errors
    ///
    /// As for [`done_and_get`](Self::done_and_get).
    pub async fn done_and_get_many(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> Result<DoneMany<Lease<T>, Error>, Error> {
        self.step(leases, max, Skipped::Background).await
    }

    /// A step, in a task of its own: a caller that stops waiting loses nothing (the dones
    /// are settled, and the leases it would have received are released).
    async fn step(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
        skipped: Skipped,
    ) -> Result<Stepped<T>, Error> {
        if self.is_closed() || self.inner.faults.any() {
            return self.plain_dones(leases, max).await;
        }
        let (tx, rx) = oneshot::channel();
        let queue = self.clone();
        tokio::spawn(async move {
            let reply = queue.step_owned(leases, max, skipped).await;
            let _ = tx.send(reply);
        });
        rx.await
            .map_err(|_| Error::Protocol("the done task stopped".into()))?
    }

    /// A plain done of each lease, then a look for the next items: a shut-down handle's step
    /// (it takes nothing more), and the fault tests' mutations (which go through the
    /// single-lease path).
    async fn plain_dones(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> Result<Stepped<T>, Error> {
        let mut done = Vec::with_capacity(leases.len());
        for (mut lease, forget) in leases {
            let claim = lease.finish_for_call();
            done.push(self.inner.finish(claim, false, forget).await);
        }
        let refused = !done.is_empty() && done.iter().all(Result::is_err);
        let next = if self.is_closed() || refused {
            Vec::new()
        } else {
            self.try_get_many(max).await?
        };
        Ok(DoneMany { done, next })
    }

    /// The step itself. The leases are renewed until their outcome is known: through a step
    /// the server rolled back and sends again, and through the settling of a `done` on its
    /// own.
    async fn step_owned(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
        skipped: Skipped,
    ) -> Result<Stepped<T>, Error> {
        let claims: Vec<(Claim, bool)> = leases.iter().map(|(l, f)| (l.claim(), *f)).collect();
        let deadline = deadline_after(self.inner.retry_deadline);
        let mut backoff = Duration::from_millis(20);
        let mut warned = false;
        let (codes, row, started) = loop {
            let started = Instant::now();
            let error = match self.step_call(&claims, max).await {
                Ok((codes, row)) => break (codes, row, started),
                Err(error) => error,
            };
            if error.is_rolled_back() && Instant::now() < deadline {
                // Nothing was applied: the same step again, its leases renewed meanwhile.
                if !warned {
                    tracing::warn!(queue = %self.inner.name, %error,
                        "workq-postgres: a step was rolled back; sending it again");
                    warned = true;
                }
                tokio::time::sleep(pause_after(&error, backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            if error.is_transient() {
                // The step may have been applied (the connection failed), or certainly was
                // not (rolled back until the deadline): each done is settled on its own.
                let unsure = !error.is_rolled_back();
                let done = self.settle_each(leases, unsure).await;
                return Ok(DoneMany {
                    done,
                    next: Vec::new(),
                });
            }
            for (mut lease, _) in leases {
                lease.finish_for_call();
            }
            return Err(error);
        };
        if codes.len() != leases.len() {
            return Err(Error::Protocol(format!(
                "{} outcomes for {} leases",
                codes.len(),
                leases.len()
            )));
        }
        let mut done = Vec::with_capacity(leases.len());
        let mut waiting = Vec::new();
        for (i, ((mut lease, forget), code)) in leases.into_iter().zip(codes).enumerate() {
            match code {
                1 | 2 => {
                    lease.finish_for_call();
                    done.push(Ok(()));
                }
                // Another transaction holds the item's row: this done is settled on its own.
                3 | 4 => {
                    done.push(if code == 3 {
                        Ok(())
                    } else {
                        Err(Error::OutcomeUnknown)
                    });
                    match skipped {
                        Skipped::Wait => waiting.push((i, lease, forget)),
                        Skipped::Background => {
                            let queue = self.clone();
                            tokio::spawn(async move {
                                if let Err(error) = queue.settle(lease, forget, false).await {
                                    tracing::warn!(queue = %queue.inner.name, %error,
                                        "workq-postgres: a done that waited for its row failed; the item is handed out again once its lease expires");
                                }
                            });
                        }
                    }
                }
                _ => {
                    lease.finish_for_call();
                    done.push(Err(Error::LeaseLost));
                }
            }
        }
        for (i, lease, forget) in waiting {
            done[i] = self.settle(lease, forget, false).await;
        }
        let (_, items, keys, tokens, priorities, _, _, links, drops) = row;
        let next = match self
            .leased(items, keys, tokens, priorities, (links, drops), started)
            .await
        {
            Ok(next) => next,
            Err(error) => {
                // The dones are committed; the leases taken are released (dropped).
                tracing::warn!(queue = %self.inner.name, %error,
                    "workq-postgres: the items a step handed out could not be taken");
                Vec::new()
            }
        };
        Ok(DoneMany { done, next })
    }

    /// Settles one lease's `done` on its own (after its forget), waiting for its row, retried
    /// as [`Lease::done`] is; the lease is renewed until the outcome is known. `unsure`: an
    /// earlier call may have applied it (a lease found gone is then
    /// [`Error::OutcomeUnknown`]).
    async fn settle(&self, mut lease: Lease<T>, forget: bool, unsure: bool) -> Result<(), Error> {
        let outcome = self
            .inner
            .finish_from(lease.claim(), false, forget, unsure)
            .await;
        lease.finish_for_call();
        outcome
    }

    /// [`settle`](Self::settle) of every lease, at once.
    async fn settle_each(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        unsure: bool,
    ) -> Vec<Result<(), Error>> {
        let mut settling = tokio::task::JoinSet::new();
        let n = leases.len();
        for (i, (lease, forget)) in leases.into_iter().enumerate() {
            let queue = self.clone();
            settling.spawn(async move { (i, queue.settle(lease, forget, unsure).await) });
        }
        let mut done: Vec<Option<Result<(), Error>>> = (0..n).map(|_| None).collect();
        while let Some(joined) = settling.join_next().await {
            if let Ok((i, outcome)) = joined {
                done[i] = Some(outcome);
            }
        }
        done.into_iter()
            .map(|d| d.unwrap_or(Err(Error::OutcomeUnknown)))
            .collect()
    }

    /// One call of `workqueue_step`: the outcome of each done, and what it handed out.
    async fn step_call(
        &self,
        claims: &[(Claim, bool)],
        max: usize,
    ) -> Result<(Vec<i32>, GetRow), Error> {
        let keys: Vec<&[u8]> = claims.iter().map(|(c, _)| c.key.as_slice()).collect();
        let tokens: Vec<i64> = claims.iter().map(|(c, _)| c.token).collect();
        let forgets: Vec<bool> = claims.iter().map(|&(_, f)| f).collect();
        let sweep = self.inner.sweep_due();
        let (
            done,
            kind,
            items,
            next_keys,
            next_tokens,
            priorities,
            wait,
            flow_version,
            links,
            drops,
        ): DoneGetRow = sqlx::query_as(step_sql(sweep))
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
        self.inner.saw_flow_version(flow_version);
        let row = if kind == 1 {
            (
                kind,
                items,
                next_keys,
                next_tokens,
                priorities,
                wait,
                flow_version,
                links,
                drops,
            )
        } else {
            (kind, None, None, None, None, wait, flow_version, None, None)
        };
        Ok((done, row))
    }
}

/// What a step does with a `done` whose row another transaction holds.
#[derive(Debug, Clone, Copy)]
enum Skipped {
    /// Waits for it (one worker's own step: its outcome is the answer).
    Wait,
    /// Settles it in the background (a batch of workers' steps, which must not wait).
    Background,
}

/// A wait in microseconds from the database, at least one.
fn positive_micros(us: i64) -> Duration {
    Duration::from_micros(us.max(1).unsigned_abs())
}
