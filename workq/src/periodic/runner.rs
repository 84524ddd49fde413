//! [`Periodic`]: the task that takes a schedule's ticks on a queue, and its
//! [`PeriodicHandle`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::record::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};
use super::schedule::Schedule;
use super::wall::Wall;
use crate::clock::Clock;
use crate::rate_limiter::jitter::{bits53, random_seed};
use crate::{AddOptions, Queue};

/// The longest schedule name (bytes): a name is a key on the server.
const MAX_NAME_LEN: usize = 200;

/// The first wait after a backend's failure; doubled after each, up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The longest wait between two attempts after a backend's failure.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// What a runner that starts does about the latest tick due before it started (see the
/// [module documentation](super#catch-up-at-most-one-missed-tick)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CatchUp {
    /// Take the latest tick due at or before the start, once, if no runner took it nor a
    /// later one and it is later than the schedule's [`since`](ScheduleInfo::since); the
    /// ticks before it are skipped.
    #[default]
    LastMissed,
    /// Take only the ticks that come due while the runner runs.
    Skip,
}

/// What one runner did so far ([`PeriodicHandle::status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerStatus {
    /// The schedule's record as the runner registered it; `None` until it did (the
    /// runner retries a backend's failure).
    pub registered: Option<ScheduleInfo>,
    /// The latest tick this runner settled, whatever the outcome.
    pub last_tick: Option<SystemTime>,
    /// What the queue answered for it.
    pub last_outcome: Option<TickOutcome>,
    /// The tick the runner waits for; `None` while it has none (before it registers, after
    /// it stops, or when the schedule never fires again).
    pub next_tick: Option<SystemTime>,
    /// Ticks this runner took with an add ([`TickOutcome::Added`]).
    pub added: u64,
    /// Ticks another runner (or this one before) had taken ([`TickOutcome::AlreadyTaken`]).
    pub already_taken: u64,
    /// Ticks taken without an add because the schedule was paused ([`TickOutcome::Paused`]).
    pub paused: u64,
    /// A backend's failures (each retried, or given up once the tick after was due).
    pub errors: u64,
    /// The runner stopped: [`PeriodicHandle::stop`], a dropped handle, a shut down queue
    /// ([`TickOutcome::ShutDown`]), or a schedule with no tick left.
    pub stopped: bool,
}

/// A periodic schedule's runner, before it starts: a [`Schedule`], a queue, and how to make
/// the item of a tick. [`spawn`](Self::spawn) starts it on tokio. See the
/// [module documentation](super).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use workq::WorkQueue;
/// use workq::clock::FakeClock;
/// use workq::periodic::{Periodic, Schedule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = FakeClock::new();
/// let queue: WorkQueue<String> = WorkQueue::builder().name("doc-reports").build();
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000); // :00 UTC
/// let runner = Periodic::new(
///     queue.clone(),
///     "hourly-report",
///     Schedule::every(Duration::from_secs(3600)),
///     |tick| format!("report/{}", tick.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()),
/// )
/// .clock(clock.clone(), start)
/// .spawn();
///
/// runner.wait_for(|s| s.next_tick.is_some()).await; // registered: waits for 09:00
/// clock.step(Duration::from_secs(3600));
/// runner.wait_for(|s| s.added == 1).await;
/// assert_eq!(*queue.try_get().unwrap(), "report/1800003600");
/// runner.stop().await;
/// # }
/// ```
pub struct Periodic<Q: Queue> {
    queue: Q,
    name: String,
    schedule: Schedule,
    make: Arc<dyn Fn(SystemTime) -> Q::Item + Send + Sync>,
    options: AddOptions,
    jitter: Duration,
    catch_up: CatchUp,
    wall: Wall,
}

impl<Q: Queue> Periodic<Q> {
    /// A runner of the schedule named `name` (unique within `queue`; every process of a
    /// fleet gives its runner of this schedule the same name) that adds `item(tick)` to
    /// `queue` at each tick of `schedule`.
    ///
    /// # Panics
    ///
    /// If `name` is empty or longer than 200 bytes.
    pub fn new(
        queue: Q,
        name: impl Into<String>,
        schedule: Schedule,
        item: impl Fn(SystemTime) -> Q::Item + Send + Sync + 'static,
    ) -> Self {
        let name = name.into();
        assert!(
            !name.is_empty() && name.len() <= MAX_NAME_LEN,
            "a periodic schedule's name must have 1 to {MAX_NAME_LEN} bytes, got {name:?}"
        );
        Periodic {
            queue,
            name,
            schedule,
            make: Arc::new(item),
            options: AddOptions::default(),
            jitter: Duration::ZERO,
            catch_up: CatchUp::default(),
            wall: Wall::System,
        }
    }

    /// Adds each tick's item with `options`' delay and priority; the default adds it now
    /// with the item's priority. Rate limiting is not applied to a tick's add (the schedule
    /// is its own pace, and a server adds the item in the step that takes the tick): a
    /// [`rate_limited`](AddOptions::rate_limited) flag is dropped.
    #[must_use]
    pub fn add_options(mut self, options: AddOptions) -> Self {
        let mut kept = AddOptions::default().after(options.delay());
        if let Some(priority) = options.requested_priority() {
            kept = kept.priority(priority);
        }
        self.options = kept;
        self
    }

    /// Claims each tick after a random span in `[0, jitter)` (see the
    /// [module documentation](super#jitter)), cut short of the tick after: any length is
    /// taken, `Duration::MAX` included. Zero (the default) claims at the tick.
    #[must_use]
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// What to do about a tick missed before the runner started; [`CatchUp::LastMissed`]
    /// by default.
    #[must_use]
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Reads time from `clock` instead of the system: the wall time is `now` at this call,
    /// and moves as `clock` does. For tests on a [`FakeClock`](crate::clock::FakeClock),
    /// which moves only when stepped. A test waits for the runner to register (its
    /// [`RunnerStatus::next_tick`] is set) before it steps the clock: a runner that starts
    /// after a step starts from the stepped time, whose ticks it does not catch up.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock, now: SystemTime) -> Self {
        self.wall = Wall::mapped(Arc::new(clock), now);
        self
    }

    /// Starts the runner as a tokio task; it runs until [`PeriodicHandle::stop`], until the
    /// handle is dropped, or until the queue is shut down.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(self) -> PeriodicHandle<Q> {
        let (status_tx, status) = watch::channel(RunnerStatus::default());
        let (stop, stop_rx) = watch::channel(false);
        let queue = self.queue.clone();
        let name = self.name.clone();
        let wall = self.wall.clone();
        let task = tokio::spawn(self.run(stop_rx, status_tx));
        PeriodicHandle {
            queue,
            name,
            wall,
            status,
            stop,
            task: Some(task),
        }
    }

    /// The runner's loop: registers, catches up, then takes each tick as it comes due.
    async fn run(self, mut stop: watch::Receiver<bool>, status: watch::Sender<RunnerStatus>) {
        let run = async {
            let spec = self.schedule.to_string();
            let now = self.wall.now();
            let update =
                ScheduleUpdate::register(&self.name, &spec, self.schedule.next_after(now), now);
            let info = self
                .retry(None, &status, || self.queue.upsert_schedule(update.clone()))
                .await?;
            tracing::debug!(queue = ?self.queue.name(), schedule = %self.name, %spec, "periodic schedule registered");
            status.send_modify(|s| s.registered = Some(info.clone()));

            let mut cursor = now;
            if self.catch_up == CatchUp::LastMissed
                && let Some(missed) = self.schedule.last_at_or_before(now)
                && missed > info.since
                && info.last_tick.is_none_or(|last| last < missed)
            {
                tracing::debug!(schedule = %self.name, tick = ?missed, "periodic tick missed: caught up");
                if self.claim(&spec, missed, &status).await == Some(TickOutcome::ShutDown) {
                    return None::<()>;
                }
            }
            loop {
                let next = self.schedule.next_after(cursor)?;
                status.send_modify(|s| s.next_tick = Some(next));
                // The jitter is cut short of the tick after (a jitter of any length, up to
                // `Duration::MAX`, claims each tick before the next is due).
                let jitter = match self.schedule.next_after(next) {
                    Some(after) => self.jitter.min(
                        after
                            .duration_since(next)
                            .unwrap_or_default()
                            .saturating_sub(Duration::from_millis(1)),
                    ),
                    None => self.jitter,
                };
                let at = next.checked_add(draw(jitter)).unwrap_or(next);
                self.wall.until(at).await;
                // Woken late, past later ticks (a host suspended, a stalled executor): the
                // latest tick due as of the jittered wait's end is taken, those before it
                // skipped (at most one missed tick). Lateness is counted from the end of the
                // jitter, so that a jitter alone never skips a tick.
                let late = self
                    .wall
                    .now()
                    .checked_sub(at.duration_since(next).unwrap_or_default())
                    .unwrap_or(next);
                let tick = self
                    .schedule
                    .last_at_or_before(late)
                    .filter(|t| *t > next)
                    .unwrap_or(next);
                if self.claim(&spec, tick, &status).await == Some(TickOutcome::ShutDown) {
                    return None;
                }
                cursor = tick;
            }
        };
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => {}
            _ = run => {}
        }
        status.send_modify(|s| {
            s.next_tick = None;
            s.stopped = true;
        });
    }

    /// Takes `tick`, retrying a backend's failure until the tick after it is due; answers
    /// the outcome, or `None` when the failures outlasted the tick.
    async fn claim(
        &self,
        spec: &str,
        tick: SystemTime,
        status: &watch::Sender<RunnerStatus>,
    ) -> Option<TickOutcome> {
        let following = self.schedule.next_after(tick);
        let claim = TickClaim::new(&self.name, spec, tick, following, self.wall.now());
        let outcome = self
            .retry(following, status, || {
                let mut claim = claim.clone();
                claim.now = self.wall.now();
                self.queue
                    .add_on_tick(claim, (self.make)(tick), self.options)
            })
            .await;
        if let Some(outcome) = outcome {
            tracing::debug!(queue = ?self.queue.name(), schedule = %self.name, ?tick, ?outcome, "periodic tick");
            status.send_modify(|s| {
                s.last_tick = Some(tick);
                s.last_outcome = Some(outcome);
                match outcome {
                    TickOutcome::Added => s.added += 1,
                    TickOutcome::AlreadyTaken => s.already_taken += 1,
                    TickOutcome::Paused => s.paused += 1,
                    TickOutcome::ShutDown => {}
                }
            });
        } else {
            tracing::warn!(queue = ?self.queue.name(), schedule = %self.name, ?tick, "periodic tick given up: the backend failed until the next tick was due");
        }
        outcome
    }

    /// Calls `call` until it answers, waiting [`FIRST_RETRY`] doubling to [`MAX_RETRY`]
    /// after each failure; `None` once the wall clock passes `until`.
    async fn retry<T, F, Fut>(
        &self,
        until: Option<SystemTime>,
        status: &watch::Sender<RunnerStatus>,
        mut call: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Q::Error>>,
    {
        let mut wait = FIRST_RETRY;
        loop {
            match call().await {
                Ok(answer) => return Some(answer),
                Err(error) => {
                    status.send_modify(|s| s.errors += 1);
                    tracing::warn!(queue = ?self.queue.name(), schedule = %self.name, %error, "periodic schedule: the backend failed; retrying");
                }
            }
            let now = self.wall.now();
            if until.is_some_and(|until| now >= until) {
                return None;
            }
            let mut at = now + wait;
            if let Some(until) = until {
                at = at.min(until);
            }
            self.wall.until(at).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
    }
}

/// A span drawn evenly from `[0, jitter)` (any `jitter`, `Duration::MAX` included).
fn draw(jitter: Duration) -> Duration {
    if jitter.is_zero() {
        return Duration::ZERO;
    }
    static STATE: std::sync::LazyLock<AtomicU64> =
        std::sync::LazyLock::new(|| AtomicU64::new(random_seed()));
    let fraction = bits53(&STATE) as f64 / (1_u64 << 53) as f64;
    Duration::try_from_secs_f64(jitter.as_secs_f64() * fraction)
        .map_or(jitter, |drawn| drawn.min(jitter))
}

impl<Q: Queue> fmt::Debug for Periodic<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Periodic")
            .field("queue", &self.queue.name())
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("options", &self.options)
            .field("jitter", &self.jitter)
            .field("catch_up", &self.catch_up)
            .field("wall", &self.wall)
            .finish()
    }
}

/// A running [`Periodic`]: its status, and the schedule's switches for the whole fleet.
/// Dropping it stops the runner (as [`stop`](Self::stop) does, without waiting).
pub struct PeriodicHandle<Q: Queue> {
    queue: Q,
    name: String,
    wall: Wall,
    status: watch::Receiver<RunnerStatus>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl<Q: Queue> PeriodicHandle<Q> {
    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What this runner did so far.
    pub fn status(&self) -> RunnerStatus {
        self.status.borrow().clone()
    }

    /// Waits until this runner's status satisfies `done` (checked at once, then at each
    /// change), and answers it; answers the last status if the runner stops first without
    /// satisfying it.
    pub async fn wait_for(&self, mut done: impl FnMut(&RunnerStatus) -> bool) -> RunnerStatus {
        let mut status = self.status.clone();
        match status
            .wait_for(|s| done(s) || s.stopped)
            .await
            .map(|s| s.clone())
        {
            Ok(s) => s,
            Err(_) => status.borrow().clone(),
        }
    }

    /// The schedule's record as the queue keeps it for every process.
    ///
    /// # Errors
    ///
    /// A backend's failure.
    pub async fn info(&self) -> Result<ScheduleInfo, Q::Error> {
        self.queue
            .upsert_schedule(ScheduleUpdate::read(&self.name, self.wall.now()))
            .await
    }

    /// Pauses the schedule for every process: its ticks are taken without an add until it
    /// resumes. Answers the record.
    ///
    /// # Errors
    ///
    /// A backend's failure (the pause may or may not have applied; pausing again is
    /// harmless).
    pub async fn pause(&self) -> Result<ScheduleInfo, Q::Error> {
        self.queue
            .upsert_schedule(ScheduleUpdate::pause(&self.name, true, self.wall.now()))
            .await
    }

    /// Resumes the schedule for every process; the ticks skipped while it was paused are
    /// never caught up. Answers the record.
    ///
    /// # Errors
    ///
    /// A backend's failure (resuming again is harmless).
    pub async fn resume(&self) -> Result<ScheduleInfo, Q::Error> {
        self.queue
            .upsert_schedule(ScheduleUpdate::pause(&self.name, false, self.wall.now()))
            .await
    }

    /// Stops the runner and waits for its task to end. A claim on its way to the server is
    /// dropped: it applied or it did not, and either way another runner (or this schedule's
    /// next start) takes the tick at most once.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl<Q: Queue> Drop for PeriodicHandle<Q> {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl<Q: Queue> fmt::Debug for PeriodicHandle<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeriodicHandle")
            .field("queue", &self.queue.name())
            .field("name", &self.name)
            .field("status", &*self.status.borrow())
            .finish()
    }
}
