//! What a lease on a shared backend needs on this side of the network, whatever the backend:
//! until when this process may count on it ([`LeaseClock`]), the task that renews it while
//! held ([`renew_while_held`]), and its release when dropped ([`Held`], over a
//! [`LeaseBackend`]). The Redis and PostgreSQL backends build their leases on
//! it; it is not part of the queue's API and may change with them.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The part of a lease this process counts on: the lease, minus 5 % for the difference
/// between this host's clock rate and the server's.
pub fn margin(lease: Duration) -> Duration {
    lease - lease / 20
}

/// Until when a lease is surely valid by this process's monotonic clock, and whether the
/// server refused it.
#[derive(Debug)]
pub struct LeaseClock {
    /// Set when the server refused a renewal.
    lost: AtomicBool,
    /// The send time of the last call that set the server's deadline, plus the margin.
    valid_until: Mutex<Instant>,
    /// Wakes [`lost`](Self::lost) waiters.
    notify: Notify,
}

impl LeaseClock {
    /// A lease handed out by a call sent at `sent`, lasting `lease` on the server.
    pub fn new(sent: Instant, lease: Duration) -> Self {
        LeaseClock {
            lost: AtomicBool::new(false),
            valid_until: Mutex::new(sent + margin(lease)),
            notify: Notify::new(),
        }
    }

    /// Until when the lease is surely valid.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal sent at `sent` was accepted: the lease is valid `lease` (less the margin)
    /// from then.
    pub fn renewed(&self, sent: Instant, lease: Duration) {
        let until = sent + margin(lease);
        let mut valid = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        if until > *valid {
            *valid = until;
        }
        drop(valid);
        self.notify.notify_waiters();
    }

    /// The server refused the lease: it is another holder's, or nobody's.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether the lease is (or may be) lost: refused, or past the deadline this process
    /// knows of.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) || Instant::now() >= self.valid_until()
    }

    /// Completes when the lease is lost; never while it is renewed.
    pub fn lost(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let clock = self.clone();
        async move {
            loop {
                let notified = clock.notify.notified();
                if clock.is_lost() {
                    return;
                }
                let until = clock.valid_until();
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(until.into()) => {}
                }
            }
        }
    }
}

/// The answer to one renewal.
#[derive(Debug)]
pub enum Renewal {
    /// Accepted; the backend has called [`LeaseClock::renewed`].
    Renewed,
    /// Refused: the lease is gone; the backend has called [`LeaseClock::lose`].
    Lost,
    /// The call failed (the backend logs it): tried again sooner.
    Failed,
}

/// Why [`renew_while_held`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalEnd {
    /// The lease was lost.
    Lost,
    /// The maximum hold time passed: the lease now expires on the server.
    MaxHold,
}

/// Renews a lease every `every` until it is lost or `stop` (the maximum hold) passes; a
/// failed or slow renewal is tried again after a quarter of `every`. `renew` gets the
/// deadline of its attempt (transient failures may be retried until then).
pub async fn renew_while_held<F, Fut>(
    clock: Arc<LeaseClock>,
    every: Duration,
    stop: Instant,
    mut renew: F,
) -> RenewalEnd
where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = Renewal>,
{
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        if clock.is_lost() {
            clock.lose();
            return RenewalEnd::Lost;
        }
        if Instant::now() >= stop {
            return RenewalEnd::MaxHold;
        }
        let limit = every.max(Duration::from_millis(100));
        let retry_soon = (every / 4).max(Duration::from_millis(10));
        match tokio::time::timeout(limit, renew(Instant::now() + limit)).await {
            Ok(Renewal::Renewed) => wait = every,
            Ok(Renewal::Lost) => return RenewalEnd::Lost,
            Ok(Renewal::Failed) | Err(_) => wait = retry_soon,
        }
    }
}

/// What a shared backend tells [`Held`] about itself: its lease settings, and how it renews
/// and releases a lease.
pub trait LeaseBackend: Send + Sync + 'static {
    /// A lease's fencing token.
    type Token: Copy + fmt::Debug + Send + Sync + 'static;
    /// How long a lease lasts on the server.
    fn lease(&self) -> Duration;
    /// How often a held lease is renewed.
    fn renew_every(&self) -> Duration;
    /// Whether held leases renew themselves.
    fn auto_renew(&self) -> bool;
    /// The longest a lease is renewed automatically.
    fn max_hold(&self) -> Duration;
    /// Renews the lease of `raw` held with `token`, trying until `deadline`; calls
    /// [`LeaseClock::renewed`] or [`LeaseClock::lose`] on `clock` and logs a failure.
    fn renew(
        &self,
        raw: &str,
        token: Self::Token,
        clock: &LeaseClock,
        deadline: Instant,
    ) -> impl Future<Output = Renewal> + Send;
    /// Logs that a lease reached the maximum hold time.
    fn held_too_long(&self, raw: &str);
    /// Releases a lease dropped without `done` (in the background; logs a failure).
    fn release_dropped(
        self: Arc<Self>,
        raw: String,
        token: Self::Token,
    ) -> impl Future<Output = ()> + Send;
    /// A lease was handed out (for a drain).
    fn lease_started(&self);
    /// A lease ended (for a drain).
    fn lease_ended(&self);
}

/// The part of a backend's lease that does not depend on the backend: the item's stored
/// form and token, its [`LeaseClock`], the renewal task, and the release of a lease dropped
/// without `done`, on the runtime it was handed out on (without one, the lease expires on
/// the server as after a crash).
pub struct Held<B: LeaseBackend> {
    backend: Arc<B>,
    raw: String,
    token: B::Token,
    clock: Arc<LeaseClock>,
    renewer: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Handle>,
    finished: bool,
}

impl<B: LeaseBackend> Held<B> {
    /// A lease of `raw` with `token`, handed out by a call sent at `sent`; starts renewing it
    /// if the backend says so.
    pub fn new(backend: Arc<B>, raw: String, token: B::Token, sent: Instant) -> Self {
        let clock = Arc::new(LeaseClock::new(sent, backend.lease()));
        let renewer = backend.auto_renew().then(|| {
            let (backend, raw, clock) = (backend.clone(), raw.clone(), clock.clone());
            tokio::spawn(async move {
                let stop = sent + backend.max_hold();
                let end =
                    renew_while_held(clock.clone(), backend.renew_every(), stop, |deadline| {
                        let (backend, raw, clock) = (&backend, &raw, &clock);
                        async move { backend.renew(raw, token, clock, deadline).await }
                    })
                    .await;
                if end == RenewalEnd::MaxHold {
                    backend.held_too_long(&raw);
                }
            })
        });
        backend.lease_started();
        Held {
            backend,
            raw,
            token,
            clock,
            renewer,
            runtime: tokio::runtime::Handle::try_current().ok(),
            finished: false,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The item as stored.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The fencing token.
    pub fn token(&self) -> B::Token {
        self.token
    }

    /// The lease's clock.
    pub fn clock(&self) -> &Arc<LeaseClock> {
        &self.clock
    }

    /// Stops renewing; the lease is ended by the caller (done, release or abandon), so a
    /// drop sends nothing.
    pub fn finish(&mut self) {
        self.finished = true;
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }

    /// [`finish`](Self::finish), and takes the stored item.
    pub fn take_raw(&mut self) -> String {
        self.finish();
        std::mem::take(&mut self.raw)
    }
}

impl<B: LeaseBackend> Drop for Held<B> {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if self.finished {
            self.backend.lease_ended();
            return;
        }
        let runtime = self
            .runtime
            .take()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(runtime) => {
                let backend = self.backend.clone();
                let raw = std::mem::take(&mut self.raw);
                let token = self.token;
                // A runtime that is shutting down drops the task (and so the release): the
                // lease then expires as after a crash.
                runtime.spawn(async move {
                    backend.clone().release_dropped(raw, token).await;
                    backend.lease_ended();
                });
            }
            None => self.backend.lease_ended(),
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for Held<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("raw", &self.raw)
            .field("token", &self.token)
            .field("lost", &self.clock.is_lost())
            .finish_non_exhaustive()
    }
}
