//! The wall clock a runner reads, and how it waits for an instant of it: the system's, or a
//! [`Clock`]'s monotonic time laid over a wall time given for its "now" (a
//! [`FakeClock`](crate::clock::FakeClock) in tests, which moves only when stepped, so that
//! nothing sleeps).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::clock::{Clock, ClockListener};

/// The longest a runner sleeps on the system clock before it reads the clock again: a wall
/// clock stepped by NTP, or a host that slept, is noticed within it.
const LONGEST_SLEEP: Duration = Duration::from_secs(30);

/// A runner's wall clock.
#[derive(Clone)]
pub(crate) enum Wall {
    /// [`SystemTime::now`].
    System,
    /// `wall + (clock.now() - at)`.
    Mapped(Arc<Mapped>),
}

/// A [`Clock`] laid over the wall time it was given.
pub(crate) struct Mapped {
    clock: Arc<dyn Clock>,
    /// The clock's time when `wall` was given.
    at: Instant,
    /// The wall time at `at`.
    wall: SystemTime,
    /// Counts the clock's steps, when it tells of them ([`Clock::subscribe`]); `None` for a
    /// clock that moves on its own, which is slept on instead.
    steps: Option<watch::Receiver<u64>>,
    /// Keeps alive the callback the clock holds weakly.
    _callback: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Wall {
    /// `clock`'s time, read as the wall time `now` at this moment.
    pub(crate) fn mapped(clock: Arc<dyn Clock>, now: SystemTime) -> Self {
        let (tx, rx) = watch::channel(0_u64);
        let callback: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            tx.send_modify(|steps| *steps = steps.wrapping_add(1));
        });
        let subscribed = clock.subscribe(ClockListener::new(Arc::downgrade(&callback)));
        let at = clock.now();
        Wall::Mapped(Arc::new(Mapped {
            clock,
            at,
            wall: now,
            steps: subscribed.then_some(rx),
            _callback: subscribed.then_some(callback),
        }))
    }

    /// The wall time now.
    pub(crate) fn now(&self) -> SystemTime {
        match self {
            Wall::System => SystemTime::now(),
            Wall::Mapped(m) => m.wall + m.clock.now().saturating_duration_since(m.at),
        }
    }

    /// Waits until the wall time is `target` or later. Cancel safe.
    pub(crate) async fn until(&self, target: SystemTime) {
        match self {
            Wall::Mapped(m) if m.steps.is_some() => {
                let mut steps = m.steps.clone().expect("checked");
                loop {
                    // Marked seen before the clock is read: a step after the read is a
                    // change `changed` reports.
                    steps.borrow_and_update();
                    if self.now() >= target {
                        return;
                    }
                    if steps.changed().await.is_err() {
                        // The clock is gone: it will never move again.
                        std::future::pending::<()>().await;
                    }
                }
            }
            _ => loop {
                let now = self.now();
                let Ok(left) = target.duration_since(now) else {
                    return;
                };
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(LONGEST_SLEEP)).await;
            },
        }
    }
}

impl fmt::Debug for Wall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wall::System => f.write_str("System"),
            Wall::Mapped(m) => f
                .debug_struct("Mapped")
                .field("now", &self.now())
                .field("stepped", &m.steps.is_some())
                .finish(),
        }
    }
}
