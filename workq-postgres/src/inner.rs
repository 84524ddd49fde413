//! [`Inner`]: what a queue handle's clones and its leases share, and the call-and-retry loop
//! every statement goes through.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::watch;
use workq::flow::FlowLimits;

use crate::error::Error;
use crate::faults::Faults;
use crate::key::Claim;
use crate::units::{FOREVER, deadline_after, int, micros};
use crate::wait::{Registration, Wakeups};

/// What every handle and lease of one queue share.
pub(crate) struct Inner {
    pub(crate) name: String,
    /// The queue's row in `workqueue_queues`.
    pub(crate) id: i32,
    pub(crate) pool: PgPool,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) base_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) bucket: Option<(f64, u32)>,
    pub(crate) poll: Duration,
    /// How often a get first takes back expired leases (see [`Inner::sweep_due`]).
    pub(crate) sweep_every: Duration,
    /// When the last sweep was asked for, in milliseconds since `epoch`.
    pub(crate) swept_at: AtomicU64,
    pub(crate) epoch: Instant,
    pub(crate) max_stalls: u32,
    pub(crate) max_hold: Duration,
    pub(crate) dead_letter_cap: usize,
    pub(crate) retry_deadline: Duration,
    /// The fault tests' deliberate bugs; none outside them.
    pub(crate) faults: Faults,
    /// This handle (and its clones) is shut down: no more gets or adds here.
    pub(crate) shut: AtomicBool,
    /// Leases handed out by this handle that are not finished yet.
    pub(crate) leases_out: AtomicUsize,
    pub(crate) wake: Arc<Wakeups>,
    /// This handle's place on the process's `LISTEN` connection, if it listens.
    pub(crate) _registration: Option<Registration>,
    /// The flow control settings this handle was built with, which it writes at build if the
    /// stored ones differ (see `flow.rs`); `None` for a handle built without any (it follows
    /// the stored ones, writing and comparing nothing) and for the handles of
    /// [`PgAdmin`](crate::PgAdmin).
    pub(crate) flow: Option<FlowLimits>,
    /// The version of the queue's flow settings this handle last wrote or compared.
    pub(crate) flow_seen: AtomicI64,
    /// The automatic renewals on their way, one per lease (see [`Inner::renewal`]).
    pub(crate) renewing: Mutex<HashMap<Claim, Renewing>>,
    /// This `Inner` itself, for the tasks it starts.
    pub(crate) me: Weak<Inner>,
}

/// The answer of a renewal on its way, once it has one: when it was sent, and whether the
/// lease was still this holder's (or why the renewal failed).
pub(crate) type Renewing = watch::Receiver<Option<(Instant, Result<bool, String>)>>;

/// How long to wait before sending a failed call again: nothing after a lock or statement
/// timeout (the wait was the pause; a couple of milliseconds keep a tiny timeout from
/// hammering the server), the backoff after anything else.
pub(crate) fn pause_after(error: &Error, backoff: Duration) -> Duration {
    if error.waited() {
        Duration::from_millis(2)
    } else {
        backoff
    }
}

impl Inner {
    /// Runs `op` until it succeeds, fails for good, or the retry deadline passes: a lost
    /// connection or a restarting server is waited out with backoff.
    pub(crate) async fn call_until<R, F, Fut>(
        &self,
        what: &'static str,
        deadline: Instant,
        mut op: F,
    ) -> Result<R, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, sqlx::Error>>,
    {
        let mut backoff = Duration::from_millis(20);
        let mut warned = false;
        loop {
            let error = match op().await {
                Ok(reply) => return Ok(reply),
                Err(e) => Error::from(e),
            };
            let now = Instant::now();
            if !error.is_transient() || now >= deadline {
                return Err(error);
            }
            if !warned {
                tracing::warn!(queue = %self.name, op = what, %error, "workq-postgres: retrying");
                warned = true;
            }
            tokio::time::sleep(
                pause_after(&error, backoff).min(deadline.saturating_duration_since(now)),
            )
            .await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// [`call_until`](Self::call_until) the retry deadline from now.
    pub(crate) async fn call<R, F, Fut>(&self, what: &'static str, op: F) -> Result<R, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, sqlx::Error>>,
    {
        self.call_until(what, deadline_after(self.retry_deadline), op)
            .await
    }

    /// The token bucket as `workqueue_add` takes it: the interval of one rate-limited add in
    /// microseconds (0: no bucket) and the burst.
    pub(crate) fn bucket(&self) -> (i64, i32) {
        self.bucket.map_or((0, 0), |(qps, burst)| {
            let interval = Duration::try_from_secs_f64(1.0 / qps).unwrap_or(FOREVER);
            (micros(interval).max(1), int(burst))
        })
    }

    /// Whether this get should first take back expired leases: at most once per
    /// [`sweep_every`](Self::sweep_every) per handle. Leases' deadlines are not indexed (so
    /// that renewals are HOT updates), so the sweep reads the queue's leased rows, a number
    /// bounded by the workers, not by the backlog.
    pub(crate) fn sweep_due(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let every = u64::try_from(self.sweep_every.as_millis()).unwrap_or(u64::MAX);
        let last = self.swept_at.load(Ordering::Relaxed);
        now.saturating_sub(last) >= every
            && self
                .swept_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// How long until the next sweep is due.
    pub(crate) fn until_sweep(&self) -> Duration {
        let now = self.epoch.elapsed();
        let next = Duration::from_millis(self.swept_at.load(Ordering::Relaxed))
            .saturating_add(self.sweep_every);
        next.saturating_sub(now)
    }

    /// The automatic renewal of `claim`'s lease that is on its way, or a new one: one per
    /// lease at a time. A renewal that waits for the item's row, which another transaction
    /// holds, keeps waiting in a task of its own, however often the lease asks again: so a
    /// locked row ties up one connection, not one per renewal interval, and the waiting
    /// renewal keeps the item's place (a sweep skips a row that someone holds or waits for)
    /// until it renews the lease the moment the row is free.
    pub(crate) fn renewal(&self, claim: Claim) -> Option<Renewing> {
        let mut renewing = self.renewing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(on_its_way) = renewing.get(&claim) {
            return Some(on_its_way.clone());
        }
        let me = self.me.upgrade()?;
        let (answer, on_its_way) = watch::channel(None);
        renewing.insert(claim, on_its_way.clone());
        drop(renewing);
        tokio::spawn(async move {
            let sent = Instant::now();
            let held = me
                .renew(claim, deadline_after(me.lease))
                .await
                .map_err(|e| e.to_string());
            let _ = answer.send(Some((sent, held)));
            me.renewing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&claim);
        });
        Some(on_its_way)
    }

    /// Whether the item's row still carries `claim`'s lease, read without waiting for any lock
    /// (the last committed version).
    pub(crate) async fn still_holds(&self, claim: Claim) -> Result<bool, Error> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM workqueue_items
                            WHERE queue = $1 AND key = $2 AND token = $3)",
        )
        .bind(self.id)
        .bind(claim.key.as_slice())
        .bind(claim.token)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Renews a lease: `Ok(false)` if it is no longer this holder's. `workqueue_renew` waits
    /// for the item's row as long as another transaction holds it (whatever the session's
    /// `lock_timeout`), under the item's lease lock, so that no sweep takes the lease back
    /// meanwhile. The deadline is not in any index, so the update can be HOT.
    pub(crate) async fn renew(&self, claim: Claim, deadline: Instant) -> Result<bool, Error> {
        let token = self.faults.token_for(&self.pool, self.id, claim).await;
        self.call_until("renew", deadline, || {
            sqlx::query_scalar("SELECT workqueue_renew($1, $2, $3, $4)")
                .bind(self.id)
                .bind(claim.key.as_slice())
                .bind(token)
                .bind(micros(self.lease))
                .fetch_one(&self.pool)
        })
        .await
    }

    /// `done` (or a release), retried through a lost connection, or a call the server rolled
    /// back (a lock or statement timeout, a serialization failure, a deadlock), while the lease
    /// could still be ours. A done waits for the item's row if another transaction holds it,
    /// under the item's lease lock (`workqueue_finish`): no sweep takes the lease back while
    /// it waits. With `forget`, the item's failures are forgotten too, only if the done is accepted.
    pub(crate) async fn finish(
        &self,
        claim: Claim,
        release: bool,
        forget: bool,
    ) -> Result<(), Error> {
        self.finish_from(claim, release, forget, false).await
    }

    /// [`finish`](Self::finish), `unsure` already when an earlier call that may have ended
    /// the lease lost its answer with the connection: a lease found gone is then
    /// [`Error::OutcomeUnknown`], not lost.
    pub(crate) async fn finish_from(
        &self,
        claim: Claim,
        release: bool,
        forget: bool,
        mut unsure: bool,
    ) -> Result<(), Error> {
        let give_up = deadline_after(self.lease.max(self.retry_deadline));
        let mut backoff = Duration::from_millis(20);
        let token = self.faults.token_for(&self.pool, self.id, claim).await;
        if !release {
            if self.faults.done_unleased(&self.pool, self.id, claim).await {
                return Ok(());
            }
            self.faults.before_done(&self.pool, self.id, claim).await;
        }
        loop {
            let outcome: Result<i32, sqlx::Error> =
                sqlx::query_scalar("SELECT workqueue_finish($1, $2, $3, $4, $5)")
                    .bind(self.id)
                    .bind(claim.key.as_slice())
                    .bind(token)
                    .bind(release)
                    .bind(forget)
                    .fetch_one(&self.pool)
                    .await;
            match outcome {
                Ok(1 | 2) => return Ok(()),
                Ok(_) if unsure => return Err(Error::OutcomeUnknown),
                Ok(_) => return Err(Error::LeaseLost),
                Err(e) => {
                    let e = Error::from(e);
                    let pause = pause_after(&e, backoff);
                    if !e.is_transient()
                        || give_up.saturating_duration_since(Instant::now()) <= pause
                    {
                        return Err(if unsure { Error::OutcomeUnknown } else { e });
                    }
                    if !e.is_rolled_back() {
                        // The commit may have been lost with the answer, or may not. (A call
                        // the server rolled back changed nothing.)
                        unsure = true;
                    }
                    tokio::time::sleep(pause).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// A lease of this handle was handed out.
    pub(crate) fn lease_started(&self) {
        self.leases_out.fetch_add(1, Ordering::SeqCst);
    }

    /// A lease of this handle ended: a drain may be waiting for the last one.
    pub(crate) fn lease_ended(&self) {
        if self.leases_out.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake.wake_drains();
        }
    }
}
