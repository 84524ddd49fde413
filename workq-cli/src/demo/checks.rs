//! The simulation's two checks, made as it ran and printed at the end: no object was
//! reconciled by two workers at once, and every object's last event was reconciled after it
//! arrived.

use std::sync::atomic::Ordering;

use super::format::{count, duration, list};
use super::phases::PhaseOutcome;
use super::setup::{SHUTDOWN_TIMEOUT, Sim};

/// Prints the checks; true if both hold (the second is skipped, not failed, when
/// interrupted).
pub(super) fn print(sim: &Sim, outcome: &PhaseOutcome) -> bool {
    let world = &sim.world;
    let overlaps = world.overlaps.load(Ordering::SeqCst);
    let exclusive = overlaps == 0;
    println!();
    println!("checks");
    println!(
        "  [{}] no object was reconciled by two workers at once ({} reconciles{})",
        if exclusive { "ok" } else { "FAILED" },
        count(world.reconciles.load(Ordering::Relaxed)),
        if exclusive {
            String::new()
        } else {
            format!(", {overlaps} overlapping")
        },
    );
    let last = world.last_events();
    let reconciled = last.missed.is_empty();
    if outcome.interrupted {
        println!(
            "  [skipped] every object's last event was reconciled after it arrived (interrupted)"
        );
    } else {
        println!(
            "  [{}] every object's last event was reconciled after it arrived ({} of {} changed objects{})",
            if reconciled { "ok" } else { "FAILED" },
            count((last.changed - last.missed.len()) as u64),
            count(last.changed as u64),
            if reconciled {
                String::new()
            } else {
                format!(", missed: {}", list(&last.missed))
            },
        );
    }
    if !outcome.summary.is_drained() {
        println!(
            "  note: {} reconciles were still running {} after the stop",
            outcome.summary.in_flight.len(),
            duration(SHUTDOWN_TIMEOUT)
        );
    }
    exclusive && reconciled
}
