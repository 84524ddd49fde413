//! The simulation's run, in three phases: the producers emit their events, the queue drains
//! (within a grace period), the workers stop.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use workq::{AsyncWorkers, Summary};

use super::report::count;
use super::setup::Sim;
use super::{DemoArgs, drain_grace, progress_bar, tick};

/// What the run ended with.
pub(super) struct Outcome {
    /// The workers' summary.
    pub(super) summary: Summary<usize>,
    /// From the start to the end of draining (the throughput's denominator).
    pub(super) active: Duration,
    /// Whether Ctrl-C stopped the run.
    pub(super) interrupted: bool,
}

/// Runs the three phases with a progress bar, the last of which stops `workers`.
pub(super) async fn run(sim: &Sim, workers: AsyncWorkers<usize>, args: &DemoArgs) -> Outcome {
    let Sim {
        interrupt,
        started,
        world,
        queue,
        producing,
        ..
    } = sim;
    let bar = progress_bar(args.duration, args.no_progress);
    let status = |phase: &str| {
        let stats = workers.stats();
        format!(
            "{phase} · given up {} · overlaps {}\n\
             events in {} · reconciles {} · retries {} · depth {} (+{} delayed)",
            count(stats.given_up),
            world.overlaps.load(Ordering::Relaxed),
            count(world.events.load(Ordering::Relaxed)),
            count(world.reconciles.load(Ordering::Relaxed)),
            count(stats.retried),
            count(queue.len() as u64),
            count(queue.delayed_len() as u64),
        )
    };

    // Phase 1: the producers emit their events.
    while producing.load(Ordering::SeqCst) > 0 && !interrupt.is_stopped() {
        bar.set_position(started.elapsed().as_millis() as u64);
        bar.set_message(status("producing"));
        tick(interrupt).await;
    }
    let produced_at = Instant::now();

    // Phase 2: the queue drains (ready items, reconciles in flight, and retries), within a
    // grace period.
    let grace = drain_grace(args.duration);
    while !interrupt.is_stopped() && produced_at.elapsed() < grace {
        if queue.is_empty() && queue.processing_len() == 0 && queue.delayed_len() == 0 {
            break;
        }
        bar.set_position(bar.length().unwrap_or(0));
        bar.set_message(status("draining"));
        tick(interrupt).await;
    }
    let active = started.elapsed();

    // Phase 3: stop the workers; reconciles in flight finish.
    bar.set_message(status("stopping"));
    let summary = workers.shut_down().await;
    bar.finish_and_clear();
    Outcome {
        summary,
        active,
        interrupted: interrupt.is_stopped(),
    }
}
