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

use crate::clock::saturating_add;

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
    /// A lease handed out by a call sent at `sent`, lasting `lease` on the server (a lease too
    /// long for the clock to count is valid as far ahead as it counts).
    pub fn new(sent: Instant, lease: Duration) -> Self {
        LeaseClock {
            lost: AtomicBool::new(false),
            valid_until: Mutex::new(saturating_add(sent, margin(lease))),
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
        let until = saturating_add(sent, margin(lease));
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

/// Renews a lease every `every` until it is lost (the server refused a renewal) or `stop`
/// (the maximum hold) passes; a failed or slow renewal is tried again after a quarter of
/// `every`. `renew` gets the deadline of its attempt (transient failures may be retried
/// until then).
///
/// A lease past the deadline this process knows of is still renewed: only the server can
/// say whether it is lost, and it refuses a renewal of a lease that is another holder's.
/// A lease handed out by a call that waited longer than the lease (a server paused, then
/// answering) is past that deadline on arrival, yet the server's lease runs from its
/// answer; taken as lost, it was never renewed, and expired while its holder worked.
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
        if clock.lost.load(Ordering::Acquire) {
            return RenewalEnd::Lost;
        }
        if Instant::now() >= stop {
            return RenewalEnd::MaxHold;
        }
        let limit = every.max(Duration::from_millis(100));
        let retry_soon = (every / 4).max(Duration::from_millis(10));
        match tokio::time::timeout(limit, renew(saturating_add(Instant::now(), limit))).await {
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
                // `Duration::MAX` (or any hold too long to count): renewed for as long as
                // it is held.
                let stop = saturating_add(sent, backend.max_hold());
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{Held, LeaseBackend, LeaseClock, Renewal, RenewalEnd, renew_while_held};

    #[test]
    fn a_lease_too_long_to_count_is_valid_as_far_as_the_clock_counts() {
        let now = Instant::now();
        let clock = LeaseClock::new(now, Duration::MAX);
        assert!(!clock.is_lost());
        assert!(clock.valid_until() > now + Duration::from_secs(365 * 24 * 3600));
        clock.renewed(Instant::now(), Duration::MAX);
        assert!(!clock.is_lost());
    }

    /// A renewal period too long to count: the first renewal (once the paused clock reaches
    /// it) gets a deadline as far as the clock counts, not a panic.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_period_too_long_to_count_renews_without_a_panic() {
        let clock = Arc::new(LeaseClock::new(Instant::now(), Duration::from_secs(3600)));
        let deadlines = Arc::new(Mutex::new(Vec::new()));
        let seen = deadlines.clone();
        let end = renew_while_held(
            clock,
            Duration::MAX,
            Instant::now() + Duration::from_secs(365 * 24 * 3600),
            move |deadline| {
                seen.lock().unwrap().push(deadline);
                async { Renewal::Lost }
            },
        )
        .await;
        assert_eq!(end, RenewalEnd::Lost);
        assert_eq!(deadlines.lock().unwrap().len(), 1);
    }

    /// A backend that counts renewals.
    struct Counting {
        max_hold: Duration,
        renewals: AtomicUsize,
    }

    impl LeaseBackend for Counting {
        type Token = u64;
        fn lease(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn renew_every(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn auto_renew(&self) -> bool {
            true
        }
        fn max_hold(&self) -> Duration {
            self.max_hold
        }
        async fn renew(
            &self,
            _raw: &str,
            _token: u64,
            clock: &LeaseClock,
            _deadline: Instant,
        ) -> Renewal {
            self.renewals.fetch_add(1, Ordering::Relaxed);
            clock.renewed(Instant::now(), self.lease());
            Renewal::Renewed
        }
        fn held_too_long(&self, _raw: &str) {}
        async fn release_dropped(self: Arc<Self>, _raw: String, _token: u64) {}
        fn lease_started(&self) {}
        fn lease_ended(&self) {}
    }

    /// A lease handed out by a call that waited longer than the lease (a paused server
    /// answering late) is past its deadline here on arrival: it is renewed all the same,
    /// and valid again once the server accepts. It was taken as lost and never renewed,
    /// and the server's lease, which runs from its answer, expired while it was held.
    #[tokio::test(start_paused = true)]
    async fn a_lease_past_its_deadline_on_arrival_is_still_renewed() {
        let backend = Arc::new(Counting {
            max_hold: Duration::MAX,
            renewals: AtomicUsize::new(0),
        });
        let sent = Instant::now() - Duration::from_secs(2);
        let mut held = Held::new(backend.clone(), "item".to_owned(), 1, sent);
        assert!(held.clock().is_lost(), "past its deadline on arrival");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(
            backend.renewals.load(Ordering::Relaxed) >= 3,
            "renewed {} times",
            backend.renewals.load(Ordering::Relaxed)
        );
        assert!(!held.clock().is_lost(), "valid once renewed");
        held.finish();
    }

    /// `max_hold(Duration::MAX)` means "renew for as long as it is held": the renewal task
    /// renews (it panicked computing its stop, and the lease expired while held).
    #[tokio::test(start_paused = true)]
    async fn a_maximum_hold_too_long_to_count_keeps_renewing() {
        let backend = Arc::new(Counting {
            max_hold: Duration::MAX,
            renewals: AtomicUsize::new(0),
        });
        let mut held = Held::new(backend.clone(), "item".to_owned(), 1, Instant::now());
        tokio::time::sleep(Duration::from_millis(550)).await;
        assert!(
            backend.renewals.load(Ordering::Relaxed) >= 5,
            "renewed {} times",
            backend.renewals.load(Ordering::Relaxed)
        );
        held.finish();
    }
}
