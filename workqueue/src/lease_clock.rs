//! What a lease on a shared backend needs on this side of the network, whatever the backend:
//! until when this process may count on it ([`LeaseClock`]), and the task that renews it
//! while held ([`renew_while_held`]). The Redis and PostgreSQL backends build their leases on
//! it; it is not part of the queue's API and may change with them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

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
