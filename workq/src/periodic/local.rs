//! The schedules of this process's queues: what the default
//! [`Queue::upsert_schedule`](crate::Queue::upsert_schedule) and
//! [`Queue::add_on_tick`](crate::Queue::add_on_tick) keep, in one table for the process,
//! keyed by the queue's name and the schedule's name (as a server keys them), and what
//! [`MemoryAdmin`](crate::admin::MemoryAdmin) lists.
//!
//! A table for the process rather than one per queue because the hooks are provided methods
//! of a trait: they have only `&self`, and a queue handle carries no room of its own for
//! them. A queue's name is its identity here, as it is for its metrics and its admin: two
//! queues of one process that share a name share their schedules' ticks.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::record::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};

/// Every schedule of the process, by queue name and schedule name.
static TABLE: LazyLock<Mutex<BTreeMap<(String, String), ScheduleInfo>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// Creates `update.name`'s record in `queue` if missing, applies `update`, and answers the
/// record.
pub(crate) fn upsert(queue: &str, update: &ScheduleUpdate) -> ScheduleInfo {
    let mut table = TABLE.lock();
    let info = table
        .entry((queue.to_owned(), update.name.clone()))
        .or_insert_with(|| ScheduleInfo::new(update.name.clone(), update.now));
    apply(info, update);
    info.clone()
}

/// Applies `update` to an existing record: the rules every backend keeps.
pub(crate) fn apply(info: &mut ScheduleInfo, update: &ScheduleUpdate) {
    if let Some(spec) = &update.spec {
        info.spec.clone_from(spec);
    }
    if let Some(next) = update.next_tick {
        info.next_tick = Some(next);
    }
    match update.paused {
        Some(true) => info.paused = true,
        Some(false) if info.paused => {
            info.paused = false;
            // The ticks skipped while paused are not caught up.
            info.since = info.since.max(update.now);
        }
        _ => {}
    }
}

/// What [`begin`] took: the last tick before the claim, to put back if the add is refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    before: Option<SystemTime>,
}

/// Takes `claim.tick` for `queue` if nobody did, before the add: marks it taken at once, so
/// that a second claim while the add is on its way finds it taken. `Err` with the outcome
/// when it is not this claim's to take (taken already, or paused: then the tick is marked
/// taken without an add).
pub(crate) fn begin(queue: &str, claim: &TickClaim) -> Result<Taken, TickOutcome> {
    let mut table = TABLE.lock();
    let info = table
        .entry((queue.to_owned(), claim.schedule.clone()))
        .or_insert_with(|| {
            let mut info = ScheduleInfo::new(claim.schedule.clone(), claim.now);
            info.spec.clone_from(&claim.spec);
            info
        });
    if info.last_tick.is_some_and(|last| last >= claim.tick) {
        return Err(TickOutcome::AlreadyTaken);
    }
    let before = info.last_tick.replace(claim.tick);
    if claim.next_tick.is_some() {
        info.next_tick = claim.next_tick;
    }
    if info.paused {
        return Err(TickOutcome::Paused);
    }
    Ok(Taken { before })
}

/// Ends a claim [`begin`] took: if the add was refused (or failed), the tick is given back,
/// unless a later tick was taken since.
pub(crate) fn end(queue: &str, claim: &TickClaim, taken: Taken, added: bool) {
    if added {
        return;
    }
    let mut table = TABLE.lock();
    if let Some(info) = table.get_mut(&(queue.to_owned(), claim.schedule.clone()))
        && info.last_tick == Some(claim.tick)
    {
        info.last_tick = taken.before;
    }
}

/// The schedules of `queue`, by name.
pub(crate) fn list(queue: &str) -> Vec<ScheduleInfo> {
    let table = TABLE.lock();
    table
        .range((queue.to_owned(), String::new())..)
        .take_while(|((q, _), _)| q == queue)
        .map(|(_, info)| info.clone())
        .collect()
}
