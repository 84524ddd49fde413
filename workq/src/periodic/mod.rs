//! Periodic work: a [`Schedule`] (a fixed interval, or a cron expression in a time zone)
//! that adds an item to a queue at each tick, once per tick across every process that runs
//! it. The runner ([`Periodic`]) and the schedules ([`Schedule`]) need the feature
//! `periodic`; the records are always there, since every [`Queue`](crate::Queue) backend
//! keeps them.
//!
//! See [`Periodic`] for an example (on a fake clock).
//!
//! # Once per fleet
//!
//! Every process of a program runs the same runners (same queue, same schedule name). A tick
//! is an instant every process computes alike from the schedule, and each runner asks its
//! queue to take the tick and add the item in one step
//! ([`Queue::add_on_tick`](crate::Queue::add_on_tick)): the queue keeps the schedule's last
//! tick taken beside its items (Redis: in the queue's hash tag, by one script run;
//! PostgreSQL: in one transaction), so exactly one runner adds each tick, whatever the
//! number of processes, and no leader election is needed. Put the tick in the item (the
//! closure receives it) to tell ticks apart; an item that carries no tick is deduplicated
//! as any other, so a tick whose item is still queued from the last one adds nothing new.
//!
//! # Catch-up: at most one missed tick
//!
//! A runner that starts (or a fleet that comes back after all its processes were down)
//! looks at the latest tick due at or before now. With [`CatchUp::LastMissed`] (the
//! default) it takes that tick at once if no runner took it (nor a later one) and it is later
//! than the schedule's [`since`](ScheduleInfo::since) (its first registration, or its last
//! resume); the ticks before it are not added: a fleet down for a day adds one item for the
//! day, not one per missed hour. With [`CatchUp::Skip`] a runner only takes the ticks that
//! come due while it runs. While it runs, a runner that wakes late (a host suspended, a
//! stalled executor) takes the latest due tick and skips those before it, by the same rule.
//!
//! # Jitter
//!
//! [`Periodic::jitter`] delays each runner's claim of a tick by a random span in
//! `[0, jitter)`, drawn anew for each tick in each process, so that a fleet does not hit its
//! server at the same millisecond: the first runner to claim adds the item, the others find
//! the tick taken. The tick itself (what the item is made from) is not moved. The wait never
//! runs into the tick after.
//!
//! # Pause and resume
//!
//! [`PeriodicHandle::pause`] pauses the schedule for every process: runners keep taking its
//! ticks, and add nothing for them. [`PeriodicHandle::resume`] resumes it; the ticks skipped
//! while it was paused are never caught up.
//!
//! # Time
//!
//! A runner reads the system's wall clock ([`SystemTime`](std::time::SystemTime)) and rereads it at least every 30
//! seconds while it waits, so a clock stepped by NTP is noticed. Cron schedules follow their
//! time zone's daylight saving time (see [`Schedule`]). In tests,
//! [`Periodic::clock`] runs a runner on a [`FakeClock`](crate::clock::FakeClock) laid over
//! a wall time, so that nothing sleeps.

mod record;
pub use record::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};

pub(crate) mod local;

#[cfg(feature = "periodic")]
mod runner;
#[cfg(feature = "periodic")]
mod schedule;
#[cfg(feature = "periodic")]
mod wall;

#[cfg(feature = "periodic")]
pub use runner::{CatchUp, Periodic, PeriodicHandle, RunnerStatus};
#[cfg(feature = "periodic")]
pub use schedule::{Schedule, ScheduleError};
