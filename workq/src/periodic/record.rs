//! What a queue keeps of each periodic schedule for the whole fleet ([`ScheduleInfo`]), and
//! what a runner asks of it ([`ScheduleUpdate`], [`TickClaim`], [`TickOutcome`]): the types
//! of the [`Queue`](crate::Queue) hooks [`upsert_schedule`](crate::Queue::upsert_schedule)
//! and [`add_on_tick`](crate::Queue::add_on_tick).
//!
//! Every instant here is a runner's wall clock, as the runner sent it: a backend stores the
//! instants it is given and compares them, and never reads its own clock for them, so that
//! every process of a fleet agrees on what a tick is (a tick is a time the schedule names,
//! the same for everyone), whatever the server's clock says.

use std::time::SystemTime;

/// One schedule of a queue, as the queue keeps it for every process: what
/// [`Admin::schedules`](crate::admin::Admin::schedules) lists, and what a runner reads when
/// it starts.
///
/// A schedule is known by its name within its queue: two runners of one name on one queue
/// are the same schedule (the replicas of one program), and take each tick once between
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The schedule's name, unique within its queue.
    pub name: String,
    /// How it runs, for people: `every 5m`, `cron 0 3 * * * (Europe/Paris)`.
    pub spec: String,
    /// Ticks at or before this instant are never caught up: when a runner first registered
    /// the schedule, or when it was last resumed.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "since_ms", with = "crate::admin::serde_helpers::unix_ms")
    )]
    pub since: SystemTime,
    /// The latest tick taken (its item added, or skipped while paused); `None` before the
    /// first.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "last_tick_ms",
            with = "crate::admin::serde_helpers::opt_unix_ms",
            default
        )
    )]
    pub last_tick: Option<SystemTime>,
    /// The next tick, as the last runner that wrote the record computed it; `None` when it
    /// was not told (or the schedule never fires again).
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "next_tick_ms",
            with = "crate::admin::serde_helpers::opt_unix_ms",
            default
        )
    )]
    pub next_tick: Option<SystemTime>,
    /// Paused for every process: its ticks are skipped (never caught up) until it resumes.
    pub paused: bool,
}

impl ScheduleInfo {
    /// A schedule named `name`, registered at `since`, that never ticked, running, with no
    /// spec and no next tick: a backend sets the rest.
    pub fn new(name: impl Into<String>, since: SystemTime) -> Self {
        ScheduleInfo {
            name: name.into(),
            spec: String::new(),
            since,
            last_tick: None,
            next_tick: None,
            paused: false,
        }
    }

    /// The time zone a cron schedule is evaluated in, as its [`spec`](Self::spec) names it
    /// (`Europe/Paris` in `cron 30 2 * * * (Europe/Paris)`, `UTC` for a cron schedule made
    /// without one); `None` for an interval (`every 5m`), whose ticks are multiples of its
    /// period since the Unix epoch whatever the zone, or a spec that names none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use workq::periodic::ScheduleInfo;
    ///
    /// let mut nightly = ScheduleInfo::new("nightly", SystemTime::UNIX_EPOCH);
    /// nightly.spec = "cron 30 2 * * * (Europe/Paris)".to_owned();
    /// assert_eq!(nightly.time_zone(), Some("Europe/Paris"));
    /// nightly.spec = "every 1h offset 15m".to_owned();
    /// assert_eq!(nightly.time_zone(), None);
    /// ```
    pub fn time_zone(&self) -> Option<&str> {
        let zone = self
            .spec
            .strip_prefix("cron ")?
            .strip_suffix(')')?
            .rsplit_once(" (")?
            .1;
        (!zone.is_empty()).then_some(zone)
    }
}

/// What [`Queue::upsert_schedule`](crate::Queue::upsert_schedule) writes: a schedule's record
/// is created if it is missing (with [`since`](ScheduleInfo::since) = `now`), then each field
/// given here is set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleUpdate {
    /// The schedule.
    pub name: String,
    /// Its spec, if it is to be set (a runner sets it when it starts).
    pub spec: Option<String>,
    /// Its next tick, if it is to be set.
    pub next_tick: Option<SystemTime>,
    /// Pause (`true`) or resume (`false`) it for every process, if set. A resume of a paused
    /// schedule moves [`since`](ScheduleInfo::since) to `now`, so the ticks skipped while it
    /// was paused are not caught up.
    pub paused: Option<bool>,
    /// The runner's wall clock now.
    pub now: SystemTime,
}

impl ScheduleUpdate {
    /// Changes nothing (reads the record, creating it if missing) as of `now`.
    pub fn read(name: impl Into<String>, now: SystemTime) -> Self {
        ScheduleUpdate {
            name: name.into(),
            spec: None,
            next_tick: None,
            paused: None,
            now,
        }
    }

    /// A runner's registration: sets the spec and the next tick.
    pub fn register(
        name: impl Into<String>,
        spec: impl Into<String>,
        next_tick: Option<SystemTime>,
        now: SystemTime,
    ) -> Self {
        ScheduleUpdate {
            spec: Some(spec.into()),
            next_tick,
            ..Self::read(name, now)
        }
    }

    /// Pauses (`paused = true`) or resumes the schedule for every process.
    pub fn pause(name: impl Into<String>, paused: bool, now: SystemTime) -> Self {
        ScheduleUpdate {
            paused: Some(paused),
            ..Self::read(name, now)
        }
    }
}

/// One tick a runner asks to take ([`Queue::add_on_tick`](crate::Queue::add_on_tick)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickClaim {
    /// The schedule.
    pub schedule: String,
    /// Its spec (written into a record that is missing).
    pub spec: String,
    /// The tick: the time the schedule names, whole milliseconds.
    pub tick: SystemTime,
    /// The tick after it, written into the record with the claim.
    pub next_tick: Option<SystemTime>,
    /// The runner's wall clock now.
    pub now: SystemTime,
}

impl TickClaim {
    /// A claim of `tick` of schedule `schedule` (of spec `spec`), whose next tick is
    /// `next_tick`, at `now`.
    pub fn new(
        schedule: impl Into<String>,
        spec: impl Into<String>,
        tick: SystemTime,
        next_tick: Option<SystemTime>,
        now: SystemTime,
    ) -> Self {
        TickClaim {
            schedule: schedule.into(),
            spec: spec.into(),
            tick,
            next_tick,
            now,
        }
    }
}

/// What [`Queue::add_on_tick`](crate::Queue::add_on_tick) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum TickOutcome {
    /// This call took the tick: the item was added (the queue's rules applied to it, so an
    /// item still queued from an earlier tick stays queued once), and the schedule's last
    /// tick is this one.
    Added,
    /// The tick, or a later one, was taken already (by another runner, or by this one
    /// before): nothing changed.
    AlreadyTaken,
    /// The schedule is paused: the tick is taken without an item (it is skipped, and never
    /// caught up).
    Paused,
    /// The queue (or this handle) is shut down and refused the add: nothing changed, the
    /// tick is not taken.
    ShutDown,
}
